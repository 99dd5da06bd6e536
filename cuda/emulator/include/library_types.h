#pragma once
// Element types of cuBLAS(Lt) for the SIMT emulator (the values of the toolkit's header).
enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;

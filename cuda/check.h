#pragma once
// Every CUDA and cuBLAS return code is checked; the error names the call site.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define HAM_CUDA_CHECK(call)                                                           \
  do {                                                                                 \
    cudaError_t ham_status_ = (call);                                                  \
    if (ham_status_ != cudaSuccess) {                                                  \
      HAM_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ",                      \
               cudaGetErrorName(ham_status_), " (", cudaGetErrorString(ham_status_), ")"); \
    }                                                                                  \
  } while (0)

#define HAM_CUBLAS_CHECK(call)                                                         \
  do {                                                                                 \
    cublasStatus_t ham_status_ = (call);                                               \
    if (ham_status_ != CUBLAS_STATUS_SUCCESS) {                                        \
      HAM_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ",                      \
               cublasGetStatusName(ham_status_));                                      \
    }                                                                                  \
  } while (0)

namespace ham::cuda {

// Number of usable GPUs; 0 (not an error) when there is no driver or device.
int device_count();
// Why there is no usable GPU, for test skips ("no CUDA device: ..."); empty if there is one.
std::string unavailable_reason();

}  // namespace ham::cuda

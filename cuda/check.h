#pragma once
// Every CUDA, cuBLAS and cuBLASLt return code is checked; the error is one line naming the
// call site (file:line), the call and the status, plus any context given (op, shape).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

#define HAM_CUDA_CHECK(call)                                                           \
  do {                                                                                 \
    cudaError_t ham_status_ = (call);                                                  \
    if (ham_status_ != cudaSuccess) {                                                  \
      cudaGetLastError(); /* clear a non-sticky error so later launch checks are fresh */ \
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

// The same checks with context appended: HAM_CUDA_CHECK_CTX(cudaMemcpy(...), "copy of ", n,
// " bytes to ", device.str()).
#define HAM_CUDA_CHECK_CTX(call, ...)                                                  \
  do {                                                                                 \
    cudaError_t ham_status_ = (call);                                                  \
    if (ham_status_ != cudaSuccess) {                                                  \
      cudaGetLastError(); /* clear a non-sticky error so later launch checks are fresh */ \
      HAM_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ",                      \
               cudaGetErrorName(ham_status_), " (", cudaGetErrorString(ham_status_), "): ", \
               __VA_ARGS__);                                                           \
    }                                                                                  \
  } while (0)

// cuBLASLt returns cublasStatus_t too, so this also checks cublasLt* calls.
#define HAM_CUBLAS_CHECK_CTX(call, ...)                                                \
  do {                                                                                 \
    cublasStatus_t ham_status_ = (call);                                               \
    if (ham_status_ != CUBLAS_STATUS_SUCCESS) {                                        \
      HAM_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ",                      \
               cublasGetStatusName(ham_status_), ": ", __VA_ARGS__);                   \
    }                                                                                  \
  } while (0)

namespace ham::cuda {

// Number of usable GPUs; 0 (not an error) when there is no driver or device.
int device_count();
// Why there is no usable GPU, for test skips ("no CUDA device: ..."); empty if there is one.
std::string unavailable_reason();

}  // namespace ham::cuda

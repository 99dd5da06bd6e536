#pragma once
// A stream and an event created for one test of the emulator's runtime, destroyed with it.
#include <cuda_runtime.h>

#include "cuda/check.h"

namespace ham::cuda {

struct OwnedStream {
  cudaStream_t handle = nullptr;
  explicit OwnedStream(unsigned flags = cudaStreamNonBlocking) {
    HAM_CUDA_CHECK(cudaStreamCreateWithFlags(&handle, flags));
  }
  ~OwnedStream() { cudaStreamDestroy(handle); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
};

struct OwnedEvent {
  cudaEvent_t handle = nullptr;
  explicit OwnedEvent(unsigned flags = cudaEventDisableTiming) {
    HAM_CUDA_CHECK(cudaEventCreateWithFlags(&handle, flags));
  }
  ~OwnedEvent() { cudaEventDestroy(handle); }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
};

}  // namespace ham::cuda

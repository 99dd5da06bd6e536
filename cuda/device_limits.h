#pragma once
// What the current CUDA device holds, for host code that does not include the CUDA headers
// (tests among it). Defined in cuda/launch.cu.
#include <cstddef>

namespace ham::cuda {

// Streaming multiprocessors of the current device (cached per device).
int multiprocessor_count();

// Opt-in shared memory per block of the current device, in bytes (the H200's 227 KiB, an
// A100's 163).
size_t max_shared_per_block();

}  // namespace ham::cuda

#pragma once
// Tuning of the CUDA routed attention kernels (cuda/routed_attention.cu), for benchmarks
// that compare variants in one run (bench/bench_routed_attention_cuda.cpp).

namespace ham::cuda {

// Query rows per block of the bf16 tensor-core forward for head dims Dk, Dv in {64, 128}:
// 128 (the default: two 16-row tiles per warp) or 64 (one). Other head dims always take
// 64. Returns the previous setting; any other value is an error.
int set_attention_forward_rows(int rows);

// Keys per tile of the 128-row tensor-core forward with value heads of 128: 64 (the
// default) or 32. Returns the previous setting; any other value is an error.
int set_attention_forward_keys(int keys);

}  // namespace ham::cuda

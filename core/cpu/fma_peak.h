#pragma once
// The machine's fp32 fused-multiply-add peak, measured: the denominator of model FLOP
// utilisation (the trainer's MFU estimate) and of the GEMM benchmark's peak fraction.
#include <cstdint>

namespace ham::cpu {

// "avx512", "avx2" or "scalar": the widest FMA the build targets.
const char* fma_isa();
// Flops done by one step of fma_steps() on one thread.
double fma_flops_per_step();
// `steps` rounds of independent FMAs on `threads` OpenMP threads at once; returns a value
// derived from the results, so the work cannot be optimised away.
float fma_steps(int threads, int64_t steps);
// Best FLOP/s over `trials` short runs (best, not mean: on a shared machine every
// disturbance only slows the loop down).
double measure_fma_peak_flops(int threads, int trials = 15);

}  // namespace ham::cpu

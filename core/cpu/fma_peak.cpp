#include "core/cpu/fma_peak.h"

#include <omp.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace ham::cpu {

namespace {

// Independent chains, enough to hide the FMA latency (4-5 cycles on 2 pipes needs 8-10),
// few enough that they and the two constants stay in registers: 16 + 2 of AVX-512's 32,
// 12 + 2 of AVX2's 16. With 16 under AVX2 one chain spilled to the stack each step, and
// the loop measured 57% of the peak the GEMM then exceeded (GCC 12, an AMD EPYC).
#if defined(__AVX512F__)
constexpr int kAccumulators = 16;
constexpr int kLanes = 16;
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kAccumulators = 12;
constexpr int kLanes = 8;
constexpr const char* kIsa = "avx2";
#else
constexpr int kAccumulators = 12;
constexpr int kLanes = 1;
constexpr const char* kIsa = "scalar";
#endif

constexpr double kFlopsPerStep = 2.0 * kLanes * kAccumulators;

// `steps` rounds of kAccumulators independent FMAs (acc = acc * a + b; a is just below 1,
// so the values settle near b / (1 - a) and never overflow or go denormal). Returns a sum
// of the accumulators so the work is observable.
__attribute__((noinline)) float fma_loop(int64_t steps, float seed) {
  const float a_value = 0.9999f, b_value = 1e-5f;
#if defined(__AVX512F__)
  const __m512 a = _mm512_set1_ps(a_value), b = _mm512_set1_ps(b_value);
  __m512 acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_set1_ps(seed + 0.01f * float(j));
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  __m512 sum = acc[0];
  for (int j = 1; j < kAccumulators; ++j) sum = _mm512_add_ps(sum, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);  // (_mm512_reduce_add_ps trips a GCC 12 false warning)
  float total = 0;
  for (float x : lanes) total += x;
  return total;
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 a = _mm256_set1_ps(a_value), b = _mm256_set1_ps(b_value);
  __m256 acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm256_set1_ps(seed + 0.01f * float(j));
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  __m256 sum = acc[0];
  for (int j = 1; j < kAccumulators; ++j) sum = _mm256_add_ps(sum, acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float x : lanes) total += x;
  return total;
#else
  float acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = seed + 0.01f * float(j);
  for (int64_t s = 0; s < steps; ++s) {
    for (int j = 0; j < kAccumulators; ++j) acc[j] = __builtin_fmaf(acc[j], a_value, b_value);
  }
  float total = 0;
  for (float x : acc) total += x;
  return total;
#endif
}

// Runs fma_loop(steps) on `threads` OpenMP threads at once; returns the sum of results.
float fma_on_threads_impl(int threads, int64_t steps) {
  float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  total += fma_loop(steps, 1.0f + float(omp_get_thread_num()));
  return total;
}

}  // namespace

const char* fma_isa() { return kIsa; }
double fma_flops_per_step() { return kFlopsPerStep; }
float fma_steps(int threads, int64_t steps) { return fma_on_threads_impl(threads, steps); }

double measure_fma_peak_flops(int threads, int trials) {
  using clock = std::chrono::steady_clock;
  const int64_t steps = int64_t(1) << 20;  // ~10-30 ms per trial on a modern core
  volatile float sink = fma_steps(threads, steps);  // warm-up: wake threads, settle clocks
  double best = 0;
  for (int trial = 0; trial < trials; ++trial) {
    auto t0 = clock::now();
    sink = fma_steps(threads, steps);
    double seconds = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::max(best, kFlopsPerStep * double(steps) * threads / seconds);
  }
  (void)sink;
  return best;
}

}  // namespace ham::cpu

// GEMM throughput of ham's CPU backend, as a fraction of this machine's fp32 FMA peak.
//
// Run (from the repository root):
//   cmake -S . -B build-bench -G Ninja -DHAM_CUDA=OFF -DHAM_BUILD_TESTS=OFF
//   ninja -C build-bench bench_matmul
//   OMP_NUM_THREADS=1 ./build-bench/bench/bench_matmul --benchmark_repetitions=5
//   OMP_NUM_THREADS=2 ./build-bench/bench/bench_matmul --benchmark_repetitions=5
//   ... --benchmark_filter=gemm_f32/sq   (one group only; the peak is still measured)
//
// What it measures:
//   - BM_FmaPeak/threads:T: a loop of independent fused multiply-adds (16 vector
//     accumulators under AVX-512, else 12 under AVX2, else 12 scalar ones; as many as stay
//     in registers) on T OpenMP threads: the fp32 arithmetic peak, 2 flops per lane per FMA.
//   - gemm_f32/..., gemm_f64/..., gemm_f32_batched/...: ham::ops::gemm into a
//     preallocated output, C = op(A) op(B). The name gives the transpose flags (NN, NT,
//     TN: A or B transposed), M, K, N and, for batched products, the batch count.
//     GEMMs use as many threads as OMP_NUM_THREADS allows (core/cpu/matmul.cpp: blocks of
//     C for one product, one matrix per thread for a batch).
//
// How to read it:
//   - "GFLOP/s" counts 2*M*N*K per product per second of wall time. The console shows it
//     with a unit suffix ("95.1G/s" = 95.1 GFLOP/s); JSON output holds plain FLOP/s.
//   - "peak_fraction" = that GEMM's FLOP/s / the FMA peak measured for the same thread
//     count (OMP_NUM_THREADS) once at start-up, before any benchmark runs; the peaks are
//     printed to stderr and stored in the report's context. 1.0 would be every FMA unit
//     busy all the time; a well-tuned BLAS reaches ~0.7-0.9 on large square f32
//     products, f64 has half the lanes so its ceiling is ~0.5 of the f32 peak.
//   - On a shared machine the peak is itself noisy: it is the best of several short
//     trials, so a noisy start-up lowers the peak and inflates every ratio (a ratio above
//     1 means exactly that: rerun on a quieter machine). With OMP_NUM_THREADS=2 on a
//     2-core machine any other busy process stalls one thread and shows up at once.
//     Compare runs by the spread over --benchmark_repetitions, not by one number.
//   - "***WARNING*** Library was built as DEBUG" refers to Debian's libbenchmark itself,
//     not to ham (ham's code is built Release with -O3).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu/fma_peak.h"
#include "core/ops/matmul.h"
#include "core/tensor.h"

namespace {

// ---- FMA peak (core/cpu/fma_peak.h) --------------------------------------------------

using ham::cpu::fma_flops_per_step;
using ham::cpu::fma_steps;

double measure_peak_flops(int threads) { return ham::cpu::measure_fma_peak_flops(threads); }

int g_gemm_threads = 1;        // OpenMP threads a GEMM may use (OMP_NUM_THREADS)
double g_peak_gemm_flops = 0;  // FMA peak measured on g_gemm_threads threads

void BM_FmaPeak(benchmark::State& state) {
  const int threads = int(state.range(0));
  const int64_t steps = int64_t(1) << 18;
  for (auto _ : state) {
    float r = fma_steps(threads, steps);
    benchmark::DoNotOptimize(r);
  }
  double flops = fma_flops_per_step() * double(steps) * threads * double(state.iterations());
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["per_thread"] = benchmark::Counter(flops / threads, benchmark::Counter::kIsRate,
                                                    benchmark::Counter::kIs1000);
}

// ---- GEMM ----------------------------------------------------------------------------

template <class T>
ham::Tensor random_tensor(const ham::Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<T> uni(T(-1), T(1));
  std::vector<T> values(size_t(ham::shape_numel(shape)));
  for (T& v : values) v = uni(rng);
  return ham::Tensor::from_vector(values, shape);
}

struct GemmCase {
  int64_t batch, m, k, n;
  bool trans_a, trans_b;
};

template <class T>
void BM_Gemm(benchmark::State& state, GemmCase g) {
  // Stored shapes: A is [M, K] or [K, M] (trans_a), B is [K, N] or [N, K] (trans_b).
  ham::Shape a_shape = g.trans_a ? ham::Shape{g.k, g.m} : ham::Shape{g.m, g.k};
  ham::Shape b_shape = g.trans_b ? ham::Shape{g.n, g.k} : ham::Shape{g.k, g.n};
  ham::Shape c_shape{g.m, g.n};
  if (g.batch > 1) {
    for (ham::Shape* s : {&a_shape, &b_shape, &c_shape}) s->insert(s->begin(), g.batch);
  }
  ham::Tensor a = random_tensor<T>(a_shape, 1);
  ham::Tensor b = random_tensor<T>(b_shape, 2);
  ham::Tensor c = ham::Tensor::zeros(c_shape, ham::dtype_of<T>());
  ham::ops::gemm(a, b, c, g.trans_a, g.trans_b);  // warm-up (first touch, thread pool)
  // Wall time per call, timed here (manual time) so peak_fraction can be a plain number.
  double seconds = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    ham::ops::gemm(a, b, c, g.trans_a, g.trans_b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    seconds += dt;
  }
  double flops = 2.0 * double(g.batch * g.m * g.n * g.k) * double(state.iterations());
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["peak_fraction"] = flops / seconds / g_peak_gemm_flops;
}

std::string gemm_name(const char* prefix, const GemmCase& g) {
  std::string name = prefix;
  name += '/';
  name += g.trans_a ? 'T' : 'N';
  name += g.trans_b ? 'T' : 'N';
  if (g.batch > 1) name += "/batch=" + std::to_string(g.batch);
  name += "/M=" + std::to_string(g.m) + "/K=" + std::to_string(g.k) +
          "/N=" + std::to_string(g.n);
  return name;
}

template <class T>
void register_gemm(const char* prefix, const GemmCase& g) {
  benchmark::RegisterBenchmark(gemm_name(prefix, g).c_str(), BM_Gemm<T>, g)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();  // wall time: OpenMP threads do the work, so CPU time would lie
}

void register_all(int max_threads) {
  auto* peak = benchmark::RegisterBenchmark("BM_FmaPeak", BM_FmaPeak);
  peak->ArgName("threads")->Arg(1);
  if (max_threads > 1) peak->Arg(max_threads);
  peak->Unit(benchmark::kMillisecond)->UseRealTime();

  // Square f32.
  for (int64_t s : {128, 256, 512, 1024, 2048}) {
    register_gemm<float>("gemm_f32/sq", {1, s, s, s, false, false});
  }
  // Transformer-shaped f32, 4096 tokens, d_model 512, MLP width 2048:
  //   Linear forward  y = x W^T      NT  M=tokens K=in  N=out
  //   Linear dx       dx = dy W      NN  M=tokens K=out N=in
  //   Linear dW       dW = dy^T x    TN  M=out    K=tokens N=in
  register_gemm<float>("gemm_f32/mlp", {1, 4096, 512, 2048, false, false});
  register_gemm<float>("gemm_f32/mlp", {1, 4096, 512, 2048, false, true});
  register_gemm<float>("gemm_f32/mlp", {1, 4096, 2048, 512, false, true});
  register_gemm<float>("gemm_f32/mlp", {1, 4096, 2048, 512, false, false});
  register_gemm<float>("gemm_f32/mlp", {1, 2048, 4096, 512, true, false});
  // configs/tiny's linears, 1024 tokens (8 x 128), d_model 128, qkv 384, MLP width 384,
  // LM head 257 (each linear's forward NT, dx NN, dW TN as above).
  for (auto [in, out] : {std::pair<int64_t, int64_t>{128, 384}, {384, 128}, {128, 257}}) {
    register_gemm<float>("gemm_f32/tiny", {1, 1024, in, out, false, true});
    register_gemm<float>("gemm_f32/tiny", {1, 1024, out, in, false, false});
    register_gemm<float>("gemm_f32/tiny", {1, out, 1024, in, true, false});
  }
  // One chunk of the tiny HAM's gated delta rule (64 tokens, K 64, V 96), as its CPU kernel
  // multiplies them on one thread (core/cpu/matmul.h): K dS (NN), [Q; K] K^T (NT),
  // P^T dO (TN).
  register_gemm<float>("gemm_f32/chunk", {1, 64, 64, 96, false, false});
  register_gemm<float>("gemm_f32/chunk", {1, 128, 64, 64, false, true});
  register_gemm<float>("gemm_f32/chunk", {1, 64, 64, 96, true, false});
  // Attention-like batched f32: 64 (batch x heads) of T=128, head dim 64.
  //   scores = Q K^T  NT  M=T K=D N=T;   out = P V  NN  M=T K=T N=D
  register_gemm<float>("gemm_f32_batched/attn", {64, 128, 64, 128, false, true});
  register_gemm<float>("gemm_f32_batched/attn", {64, 128, 128, 64, false, false});
  // f64 (gradient checks run in f64; ratio is against the f32 peak).
  for (int64_t s : {512, 1024}) register_gemm<double>("gemm_f64/sq", {1, s, s, s, false, false});
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  g_gemm_threads = omp_get_max_threads();
  double peak_1 = measure_peak_flops(1);
  double peak_all = g_gemm_threads > 1 ? measure_peak_flops(g_gemm_threads) : peak_1;
  g_peak_gemm_flops = peak_all;
  std::fprintf(stderr,
               "bench_matmul: fp32 FMA peak (%s, best of 15 trials): %.1f GFLOP/s on 1 thread",
               ham::cpu::fma_isa(), peak_1 / 1e9);
  if (g_gemm_threads > 1) {
    std::fprintf(stderr, ", %.1f GFLOP/s on %d threads", peak_all / 1e9, g_gemm_threads);
  }
  std::fprintf(stderr, "; GEMMs run on %d thread(s) and peak_fraction uses that figure\n",
               g_gemm_threads);
  benchmark::AddCustomContext("fma_isa", ham::cpu::fma_isa());
  benchmark::AddCustomContext("fma_peak_1_thread_GFLOP/s", std::to_string(peak_1 / 1e9));
  benchmark::AddCustomContext("gemm_threads", std::to_string(g_gemm_threads));
  benchmark::AddCustomContext("fma_peak_gemm_threads_GFLOP/s", std::to_string(peak_all / 1e9));

  register_all(g_gemm_threads);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

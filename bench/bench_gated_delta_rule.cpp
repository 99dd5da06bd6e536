// CPU gated delta rule: the chunked forward, the chunked forward + backward, and the
// token-by-token recurrence, in tokens/s and GFLOP/s, in one binary so the ratios compare
// runs on the same machine at the same moment.
//
// Run (from the repository root):
//   cmake -S . -B build-bench -G Ninja -DHAM_CUDA=OFF -DHAM_BUILD_TESTS=OFF
//   ninja -C build-bench bench_gated_delta_rule
//   OMP_NUM_THREADS=1 ./build-bench/bench/bench_gated_delta_rule
//   OMP_NUM_THREADS=2 ./build-bench/bench/bench_gated_delta_rule --benchmark_filter=f32
//
// Names: gdn_<what>_<dtype>/B=../T=../H=../K=../V=..; what is
//   chunked_fwd      ops::gated_delta_rule_chunked (o, h_final, fit_error)
//   chunked_fwd_no_fit  the same without the fit error (want_fit_error false: a GDN layer)
//   chunked_fwd_bwd  the forward, then ops::gated_delta_rule_backward for all six inputs
//   naive_fwd        ops::gated_delta_rule_naive (the reference recurrence)
// Counters:
//   tokens/s   B*T per second of wall time (all heads of a token count once).
//   GFLOP/s    the FLOPs each algorithm executes (2 per multiply-add; c x c products
//              counted in full, as Eigen computes them), per second. With chunk c and
//              per head and token:
//                naive forward    7 K V          (decay, S^T k, write, S^T q)
//                chunked forward  4cK + 6KV + 5cV   (3cV without the fit error's M v_new)
//                chunked backward 10cK + 18KV + 8cV  (recomputed chunk terms included)
//              so GFLOP/s compares how well each keeps the core busy, while tokens/s
//              compares the algorithms.
//   peak_fraction  GFLOP/s over the fp32 FMA peak measured at start-up on
//              OMP_NUM_THREADS threads (core/cpu/fma_peak.h).
// The work is parallel over (b, h) pairs only: a single head runs on one thread.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/fma_peak.h"
#include "core/ops/gated_delta_rule.h"

namespace {

using ham::GatedDeltaRuleArgs;
using ham::Shape;
using ham::Tensor;

struct GdnShape {
  int64_t batch, seq_len, heads, key_dim, value_dim;
};

template <class T>
Tensor random_tensor(const Shape& shape, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(lo, hi);
  std::vector<T> values(size_t(ham::shape_numel(shape)));
  for (T& x : values) x = T(uni(rng));
  return Tensor::from_vector(values, shape);
}

// Inputs like the layer's: unit-norm keys, q scaled by K^-1/2, g in [-0.5, -0.01]
// (log decay), beta in (0, 1), no initial state, one document per row.
template <class T>
GatedDeltaRuleArgs make_args(const GdnShape& s) {
  const Shape qk{s.batch, s.seq_len, s.heads, s.key_dim};
  Tensor k = random_tensor<T>(qk, 2, -1, 1);
  T* pk = k.data<T>();
  for (int64_t row = 0; row < k.numel() / s.key_dim; ++row) {
    T norm2 = 0;
    for (int64_t j = 0; j < s.key_dim; ++j) norm2 += pk[row * s.key_dim + j] * pk[row * s.key_dim + j];
    for (int64_t j = 0; j < s.key_dim; ++j) pk[row * s.key_dim + j] /= std::sqrt(norm2);
  }
  const double q_scale = 1.0 / std::sqrt(double(s.key_dim));
  return {random_tensor<T>(qk, 1, -q_scale, q_scale),
          k,
          random_tensor<T>({s.batch, s.seq_len, s.heads, s.value_dim}, 3, -1, 1),
          random_tensor<T>({s.batch, s.seq_len, s.heads}, 4, -0.5, -0.01),
          random_tensor<T>({s.batch, s.seq_len, s.heads}, 5, 0.05, 0.95),
          Tensor(),
          Tensor()};
}

constexpr double kChunk = double(ham::kGatedDeltaRuleChunkSize);
double g_peak_flops = 0;  // fp32 FMA peak on the OpenMP threads the kernels use

double naive_forward_flops(const GdnShape& s) {
  return double(s.batch * s.seq_len * s.heads) * 7.0 * double(s.key_dim * s.value_dim);
}

double chunked_forward_flops(const GdnShape& s, bool fit_error) {
  const double K = double(s.key_dim), V = double(s.value_dim);
  return double(s.batch * s.seq_len * s.heads) *
         (4 * kChunk * K + 6 * K * V + (fit_error ? 5 : 3) * kChunk * V);
}

double chunked_backward_flops(const GdnShape& s) {
  const double K = double(s.key_dim), V = double(s.value_dim);
  return double(s.batch * s.seq_len * s.heads) * (10 * kChunk * K + 18 * K * V + 8 * kChunk * V);
}

enum class Work { ChunkedForward, ChunkedForwardNoFit, ChunkedForwardBackward, NaiveForward };

template <class T>
void BM_GatedDeltaRule(benchmark::State& state, GdnShape s, Work work) {
  GatedDeltaRuleArgs args = make_args<T>(s);
  args.want_fit_error = work != Work::ChunkedForwardNoFit;
  Tensor grad_o = random_tensor<T>({s.batch, s.seq_len, s.heads, s.value_dim}, 6, -1, 1);
  Tensor grad_h_final = random_tensor<T>({s.batch, s.heads, s.key_dim, s.value_dim}, 7, -1, 1);
  auto run = [&] {
    if (work == Work::NaiveForward) {
      ham::GatedDeltaRuleResult r = ham::ops::gated_delta_rule_naive(args);
      benchmark::DoNotOptimize(r.o.raw_data());
      return;
    }
    ham::GatedDeltaRuleResult r = ham::ops::gated_delta_rule_chunked(args);
    benchmark::DoNotOptimize(r.o.raw_data());
    if (work == Work::ChunkedForwardBackward) {
      ham::GatedDeltaRuleGrads g = ham::ops::gated_delta_rule_backward(args, grad_o, grad_h_final);
      benchmark::DoNotOptimize(g.dk.raw_data());
    }
  };
  run();  // warm-up
  double seconds = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    benchmark::ClobberMemory();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    seconds += dt;
  }
  double flops = work == Work::NaiveForward ? naive_forward_flops(s)
                                            : chunked_forward_flops(s, args.want_fit_error);
  if (work == Work::ChunkedForwardBackward) flops += chunked_backward_flops(s);
  const double iterations = double(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(double(s.batch * s.seq_len) * iterations,
                                                  benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * iterations, benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
  state.counters["peak_fraction"] = flops * iterations / seconds / g_peak_flops;
}

template <class T>
void register_shape(const char* dtype, const GdnShape& s) {
  const std::string dims = "/B=" + std::to_string(s.batch) + "/T=" + std::to_string(s.seq_len) +
                           "/H=" + std::to_string(s.heads) + "/K=" + std::to_string(s.key_dim) +
                           "/V=" + std::to_string(s.value_dim);
  const std::pair<const char*, Work> works[] = {{"chunked_fwd", Work::ChunkedForward},
                                                {"chunked_fwd_no_fit", Work::ChunkedForwardNoFit},
                                                {"chunked_fwd_bwd", Work::ChunkedForwardBackward},
                                                {"naive_fwd", Work::NaiveForward}};
  for (const auto& [what, work] : works) {
    std::string name = std::string("gdn_") + what + "_" + dtype + dims;
    benchmark::RegisterBenchmark(name.c_str(), BM_GatedDeltaRule<T>, s, work)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();  // wall time: OpenMP threads do the work
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  g_peak_flops = ham::cpu::measure_fma_peak_flops(omp_get_max_threads());
  std::fprintf(stderr, "bench_gated_delta_rule: fp32 FMA peak %.1f GFLOP/s on %d threads\n",
               g_peak_flops * 1e-9, omp_get_max_threads());
  register_shape<float>("f32", {1, 2048, 2, 64, 64});
  register_shape<float>("f32", {1, 2048, 1, 256, 384});  // the 800M config's GDN head
  register_shape<float>("f32", {8, 128, 2, 64, 96});    // configs/tiny's GDN layers
  register_shape<double>("f64", {1, 2048, 2, 64, 64});
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Cost of routed (sparse-KV) attention on the CPU against the fraction of tokens selected.
//
// Run (from the repository root):
//   cmake -S . -B build-bench -G Ninja -DHAM_CUDA=OFF -DHAM_BUILD_TESTS=OFF
//   ninja -C build-bench bench_routed_attention
//   OMP_NUM_THREADS=1 ./build-bench/bench/bench_routed_attention --benchmark_repetitions=3
//   ... --benchmark_filter=forward_backward   (one pass only; the dense references are still
//   timed)
//
// What it measures: ham::routed_attention in f32 with value_scale, Hq = Hkv, Dk = Dv, each
// token selected with probability rho in {1, 0.5, 0.25, 0.1} (fixed seed), at two shapes:
//   - long:  B=1, T=2048, H=4, D=64;
//   - tiny:  B=8, T=128, H=4, D=32, the shape of configs/tiny (8 x 128 tokens, 4 heads of 32).
// Names are routed_attention/SHAPE/PASS/rho=X, where PASS is
//   - forward: the forward alone (compaction included; no graph);
//   - forward_backward: forward, then the gradients of q, k, v and value_scale through
//     autograd.
//
// How to read it:
//   - "time_ratio_to_dense" = this case's wall time per call / the rho=1 time of the same
//     pass and shape, measured once at start-up in the same process (best of 5, printed to
//     stderr). Compaction makes the work proportional to the visible (query, selected key)
//     pairs, so the ratio should follow "visible_pair_fraction" (those pairs / the
//     T (T+1) / 2 pairs of dense causal attention, ~rho) plus the per-token work every rho
//     pays (gathering, the output rows).
//   - "selected_fraction" is the measured fraction of selected tokens.
//   - "GFLOP/s" counts the useful flops of the visible pairs only (masked scores excluded),
//     per pair and query head: forward 2 (Dk + Dv) (scores, P V'); forward+backward adds
//     6 Dk + 4 Dv (scores again, dP, dq, dk, dv'). "peak_fraction" divides it by the fp32
//     FMA peak measured at start-up on OMP_NUM_THREADS threads (core/cpu/fma_peak.h).
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/cpu/fma_peak.h"
#include "core/tensor.h"
#include "nn/routed_attention.h"

namespace {

struct Geometry {
  const char* name;
  int64_t batch, seq_len, heads, head_dim;
};
const Geometry kGeometries[] = {{"long", 1, 2048, 4, 64}, {"tiny", 8, 128, 4, 32}};
const double kRhos[] = {1.0, 0.5, 0.25, 0.1};

ham::Tensor random_f32(const ham::Shape& shape, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(lo, hi);
  std::vector<float> values(size_t(ham::shape_numel(shape)));
  for (float& x : values) x = uni(rng);
  return ham::Tensor::from_vector(values, shape);
}

struct Inputs {
  Geometry geometry;
  ham::Tensor q, k, v, value_scale, select, dout;
  std::vector<ham::Tensor> leaves;  // copies of q, k, v, value_scale that require grad
  double selected_fraction = 0, visible_pair_fraction = 0;
  int64_t visible_pairs = 0;  // (query, visible key) pairs of one head, all rows
};

Inputs make_inputs(const Geometry& g, double rho) {
  Inputs in;
  in.geometry = g;
  const ham::Shape qkv{g.batch, g.seq_len, g.heads, g.head_dim};
  in.q = random_f32(qkv, 1, -1, 1);
  in.k = random_f32(qkv, 2, -1, 1);
  in.v = random_f32(qkv, 3, -1, 1);
  in.value_scale = random_f32({g.batch, g.seq_len}, 4, 0.5f, 1.0f);
  in.dout = random_f32(qkv, 5, -1, 1);
  for (const ham::Tensor& t : {in.q, in.k, in.v, in.value_scale}) {
    in.leaves.push_back(t.clone());
    ham::set_requires_grad(in.leaves.back());
  }
  std::mt19937_64 rng(6);
  std::bernoulli_distribution pick(rho);
  std::vector<uint8_t> select(size_t(g.batch * g.seq_len));
  int64_t selected = 0;
  for (int64_t b = 0; b < g.batch; ++b) {
    int64_t selected_so_far = 0;
    for (int64_t t = 0; t < g.seq_len; ++t) {
      uint8_t s = pick(rng) ? 1 : 0;
      select[size_t(b * g.seq_len + t)] = s;
      selected += s;
      selected_so_far += s;
      in.visible_pairs += selected_so_far;  // query t sees every selected key <= t
    }
  }
  in.select = ham::Tensor::from_vector(select, {g.batch, g.seq_len});
  in.selected_fraction = double(selected) / double(g.batch * g.seq_len);
  in.visible_pair_fraction =
      double(in.visible_pairs) / (double(g.batch * g.seq_len) * double(g.seq_len + 1) / 2);
  return in;
}

void run_forward(const Inputs& in) {
  ham::Tensor out = ham::routed_attention(in.q, in.k, in.v, in.select, in.value_scale);
  benchmark::DoNotOptimize(out.raw_data());
}

void run_forward_backward(const Inputs& in) {
  const std::vector<ham::Tensor>& x = in.leaves;
  ham::Tensor out = ham::routed_attention(x[0], x[1], x[2], in.select, x[3]);
  std::vector<ham::Tensor> grads = ham::gradients({out}, x, {in.dout});
  benchmark::DoNotOptimize(grads[0].raw_data());
}

using PassFn = void (*)(const Inputs&);

struct Pass {
  const char* name;
  PassFn run;
  int dk_terms, dv_terms;  // useful flops per pair and head: 2 (dk_terms Dk + dv_terms Dv)
};
const Pass kPasses[] = {{"forward", run_forward, 1, 1},
                        {"forward_backward", run_forward_backward, 4, 3}};

double seconds_of(PassFn pass, const Inputs& in) {
  auto t0 = std::chrono::steady_clock::now();
  pass(in);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best of 5 (on a shared machine a disturbance only slows a run down).
double best_seconds(PassFn pass, const Inputs& in) {
  pass(in);  // warm-up
  double best = 1e30;
  for (int trial = 0; trial < 5; ++trial) best = std::min(best, seconds_of(pass, in));
  return best;
}

double g_peak_flops = 0;  // fp32 FMA peak on the OpenMP threads the passes use

void BM_RoutedAttention(benchmark::State& state, const Geometry& g, const Pass& pass,
                        double dense_seconds, double rho) {
  const Inputs in = make_inputs(g, rho);
  pass.run(in);  // warm-up
  double seconds = 0;
  for (auto _ : state) {
    double dt = seconds_of(pass.run, in);
    state.SetIterationTime(dt);
    seconds += dt;
  }
  state.counters["selected_fraction"] = in.selected_fraction;
  state.counters["visible_pair_fraction"] = in.visible_pair_fraction;
  const double seconds_per_call = seconds / double(state.iterations());
  state.counters["time_ratio_to_dense"] = seconds_per_call / dense_seconds;
  const double flops_per_pair = 2.0 * double(pass.dk_terms + pass.dv_terms) * double(g.head_dim);
  const double flops = flops_per_pair * double(in.visible_pairs * g.heads);
  state.counters["GFLOP/s"] = flops / seconds_per_call * 1e-9;
  state.counters["peak_fraction"] = flops / seconds_per_call / g_peak_flops;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  g_peak_flops = ham::cpu::measure_fma_peak_flops(omp_get_max_threads());
  std::fprintf(stderr, "bench_routed_attention: fp32 FMA peak %.1f GFLOP/s on %d threads\n",
               g_peak_flops * 1e-9, omp_get_max_threads());
  for (const Geometry& g : kGeometries) {
    const Inputs dense = make_inputs(g, 1.0);
    for (const Pass& pass : kPasses) {
      const double dense_seconds = best_seconds(pass.run, dense);
      std::fprintf(stderr,
                   "  %s (f32 B=%lld T=%lld H=%lld D=%lld) %s, dense (rho=1) reference, best of "
                   "5: %.3f ms\n",
                   g.name, (long long)g.batch, (long long)g.seq_len, (long long)g.heads,
                   (long long)g.head_dim, pass.name, dense_seconds * 1e3);
      const std::string prefix = std::string("routed_attention/") + g.name + "/" + pass.name;
      benchmark::AddCustomContext("dense_ms/" + std::string(g.name) + "/" + pass.name,
                                  std::to_string(dense_seconds * 1e3));
      for (double rho : kRhos) {
        const std::string name = prefix + "/rho=" + std::to_string(rho).substr(0, 4);
        benchmark::RegisterBenchmark(name.c_str(), BM_RoutedAttention, g, pass, dense_seconds,
                                     rho)
            ->Unit(benchmark::kMillisecond)
            ->UseManualTime();  // wall time: OpenMP threads do the work
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Cost of routed (sparse-KV) attention on the CPU against the fraction of tokens selected.
//
// Run (from the repository root):
//   cmake -S . -B build-bench -G Ninja -DHAM_CUDA=OFF -DHAM_BUILD_TESTS=OFF
//   ninja -C build-bench bench_routed_attention
//   OMP_NUM_THREADS=1 ./build-bench/bench/bench_routed_attention --benchmark_repetitions=3
//   ... --benchmark_filter=forward_backward   (one pass only; the dense reference is still timed)
//
// What it measures: ham::routed_attention in f32 at B=1, T=2048, Hq=Hkv=4, Dk=Dv=64 with
// value_scale, each token selected with probability rho in {1, 0.5, 0.25, 0.1} (fixed seed).
//   - routed_attention/forward/rho=X: the forward alone (compaction included; no graph).
//   - routed_attention/forward_backward/rho=X: forward, then the gradients of q, k, v and
//     value_scale through autograd.
//
// How to read it:
//   - "time_ratio_to_dense" = this case's wall time per call / the rho=1 time of the same
//     pass, where the rho=1 time is measured once at start-up in the same process (best
//     of 5, printed to stderr). Compaction makes the work proportional to the visible
//     (query, selected key) pairs, so the ratio should follow "visible_pair_fraction"
//     (those pairs / the T (T+1) / 2 pairs of dense causal attention, ~rho) plus the
//     per-token work every rho pays (gathering, the output rows).
//   - "selected_fraction" is the measured fraction of selected tokens.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/tensor.h"
#include "nn/routed_attention.h"

namespace {

constexpr int64_t kBatch = 1, kSeqLen = 2048, kHeads = 4, kHeadDim = 64;
const double kRhos[] = {1.0, 0.5, 0.25, 0.1};

ham::Tensor random_f32(const ham::Shape& shape, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(lo, hi);
  std::vector<float> values(size_t(ham::shape_numel(shape)));
  for (float& x : values) x = uni(rng);
  return ham::Tensor::from_vector(values, shape);
}

struct Inputs {
  ham::Tensor q, k, v, value_scale, select, dout;
  std::vector<ham::Tensor> leaves;  // copies of q, k, v, value_scale that require grad
  double selected_fraction = 0, visible_pair_fraction = 0;
};

Inputs make_inputs(double rho) {
  Inputs in;
  const ham::Shape qkv{kBatch, kSeqLen, kHeads, kHeadDim};
  in.q = random_f32(qkv, 1, -1, 1);
  in.k = random_f32(qkv, 2, -1, 1);
  in.v = random_f32(qkv, 3, -1, 1);
  in.value_scale = random_f32({kBatch, kSeqLen}, 4, 0.5f, 1.0f);
  in.dout = random_f32(qkv, 5, -1, 1);
  for (const ham::Tensor& t : {in.q, in.k, in.v, in.value_scale}) {
    in.leaves.push_back(t.clone());
    ham::set_requires_grad(in.leaves.back());
  }
  std::mt19937_64 rng(6);
  std::bernoulli_distribution pick(rho);
  std::vector<uint8_t> select(size_t(kBatch * kSeqLen));
  int64_t selected = 0, visible_pairs = 0;
  for (int64_t b = 0; b < kBatch; ++b) {
    int64_t selected_so_far = 0;
    for (int64_t t = 0; t < kSeqLen; ++t) {
      uint8_t s = pick(rng) ? 1 : 0;
      select[size_t(b * kSeqLen + t)] = s;
      selected += s;
      selected_so_far += s;
      visible_pairs += selected_so_far;  // query t sees every selected key <= t (one document)
    }
  }
  in.select = ham::Tensor::from_vector(select, {kBatch, kSeqLen});
  in.selected_fraction = double(selected) / double(kBatch * kSeqLen);
  in.visible_pair_fraction =
      double(visible_pairs) / (double(kBatch * kSeqLen) * double(kSeqLen + 1) / 2);
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

double g_dense_forward_seconds = 0, g_dense_forward_backward_seconds = 0;

void BM_RoutedAttention(benchmark::State& state, PassFn pass, double dense_seconds, double rho) {
  const Inputs in = make_inputs(rho);
  pass(in);  // warm-up
  double seconds = 0;
  for (auto _ : state) {
    double dt = seconds_of(pass, in);
    state.SetIterationTime(dt);
    seconds += dt;
  }
  state.counters["selected_fraction"] = in.selected_fraction;
  state.counters["visible_pair_fraction"] = in.visible_pair_fraction;
  state.counters["time_ratio_to_dense"] = seconds / double(state.iterations()) / dense_seconds;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const Inputs dense = make_inputs(1.0);
  g_dense_forward_seconds = best_seconds(run_forward, dense);
  g_dense_forward_backward_seconds = best_seconds(run_forward_backward, dense);
  std::fprintf(stderr,
               "bench_routed_attention: f32 B=%lld T=%lld H=%lld D=%lld; dense (rho=1) reference, "
               "best of 5: forward %.2f ms, forward+backward %.2f ms\n",
               (long long)kBatch, (long long)kSeqLen, (long long)kHeads, (long long)kHeadDim,
               g_dense_forward_seconds * 1e3, g_dense_forward_backward_seconds * 1e3);
  benchmark::AddCustomContext("dense_forward_ms", std::to_string(g_dense_forward_seconds * 1e3));
  benchmark::AddCustomContext("dense_forward_backward_ms",
                              std::to_string(g_dense_forward_backward_seconds * 1e3));

  for (double rho : kRhos) {
    std::string suffix = "/rho=" + std::to_string(rho).substr(0, 4);
    benchmark::RegisterBenchmark(("routed_attention/forward" + suffix).c_str(), BM_RoutedAttention,
                                 run_forward, g_dense_forward_seconds, rho)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();  // wall time: OpenMP threads do the work
  }
  for (double rho : kRhos) {
    std::string suffix = "/rho=" + std::to_string(rho).substr(0, 4);
    benchmark::RegisterBenchmark(("routed_attention/forward_backward" + suffix).c_str(),
                                 BM_RoutedAttention, run_forward_backward,
                                 g_dense_forward_backward_seconds, rho)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

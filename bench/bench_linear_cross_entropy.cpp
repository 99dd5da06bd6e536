// Fused linear cross-entropy (nn/linear_cross_entropy.h) against the unfused LM head
// (nn::matmul for the whole [N, V] logits, then nn::cross_entropy) on the CPU.
//
// Run (from the repository root):
//   cmake -S . -B build-bench -G Ninja -DHAM_CUDA=OFF -DHAM_BUILD_TESTS=OFF
//   ninja -C build-bench bench_linear_cross_entropy
//   OMP_NUM_THREADS=2 ./build-bench/bench/bench_linear_cross_entropy --benchmark_repetitions=3
//   ... --benchmark_filter=forward_backward   (one pass only)
//
// What it measures, in f32 with hidden [N, D], weight [V, D] (N = 512, D = 256,
// V = 32768; 2 of the 512 targets ignored):
//   - linear_cross_entropy/{fused,unfused}/forward: the mean loss alone under no-grad
//     (fused: 1 GEMM per chunk; unfused: the whole logits, then cross_entropy).
//   - linear_cross_entropy/{fused,unfused}/forward_backward: the loss with grad mode on,
//     then the gradients of hidden and weight through autograd (both: 3 GEMMs of
//     2 N V D flops each in total).
//   - fused runs with chunk_rows = 0 (the default: 2^23 / V = 256 rows, two chunks), 64
//     (eight chunks) and N (one chunk, the fused op's largest buffer).
//
// How to read it:
//   - "GFLOP/s" counts the GEMMs only (2 N V D per GEMM; 1 for forward, 3 for
//     forward_backward) per second of wall time: the cross-entropy passes and the
//     bookkeeping show up as a lower rate.
//   - "logits_MiB" is the logits memory the pass holds beyond the inputs and the
//     gradients: fused, one chunk of chunk_rows x V (the backward writes over it);
//     unfused, N x V logits, and as much again for dlogits in forward_backward.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/ops/linear_cross_entropy.h"
#include "core/tensor.h"
#include "nn/cross_entropy.h"
#include "nn/linear_cross_entropy.h"
#include "nn/matmul.h"

namespace {

constexpr int64_t kRows = 512, kDim = 256, kVocab = 32768;

ham::Tensor random_f32(const ham::Shape& shape, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(size_t(ham::shape_numel(shape)));
  for (float& x : values) x = normal(rng);
  return ham::Tensor::from_vector(values, shape);
}

struct Inputs {
  ham::Tensor hidden, weight, targets;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs r;
    r.hidden = random_f32({kRows, kDim}, 1, 1.0f);
    r.weight = random_f32({kVocab, kDim}, 2, 0.06f);  // ~1 / sqrt(D): logits of order 1
    ham::set_requires_grad(r.hidden);
    ham::set_requires_grad(r.weight);
    std::mt19937_64 rng(3);
    std::uniform_int_distribution<int64_t> pick(0, kVocab - 1);
    std::vector<int64_t> t(static_cast<size_t>(kRows));
    for (int64_t& v : t) v = pick(rng);
    t[5] = t[300] = -100;
    r.targets = ham::Tensor::from_vector(t, {kRows});
    return r;
  }();
  return in;
}

// chunk_rows < 0: the unfused path.
ham::Tensor loss_of(const Inputs& in, int64_t chunk_rows) {
  if (chunk_rows < 0) {
    return ham::cross_entropy(ham::matmul(in.hidden, in.weight, false, true), in.targets);
  }
  return ham::linear_cross_entropy(in.hidden, in.weight, in.targets, -100, chunk_rows);
}

void BM_LinearCrossEntropy(benchmark::State& state, int64_t chunk_rows, bool backward) {
  const Inputs& in = inputs();
  for (auto _ : state) {
    if (backward) {
      ham::Tensor loss = loss_of(in, chunk_rows);
      std::vector<ham::Tensor> grads = ham::gradients({loss}, {in.hidden, in.weight});
      benchmark::DoNotOptimize(grads[1].raw_data());
    } else {
      ham::NoGradGuard no_grad;
      ham::Tensor loss = loss_of(in, chunk_rows);
      benchmark::DoNotOptimize(loss.raw_data());
    }
  }
  const double gemm_flops = 2.0 * double(kRows) * double(kVocab) * double(kDim);
  state.counters["GFLOP/s"] =
      benchmark::Counter((backward ? 3 : 1) * gemm_flops * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  const int64_t logit_rows =
      chunk_rows < 0 ? (backward ? 2 : 1) * kRows
                     : ham::ops::linear_cross_entropy_chunk_rows(kRows, kVocab, kDim, chunk_rows);
  state.counters["logits_MiB"] = double(logit_rows * kVocab * 4) / double(1 << 20);
}

void register_pass(const std::string& name, int64_t chunk_rows, bool backward) {
  benchmark::RegisterBenchmark(name.c_str(), BM_LinearCrossEntropy, chunk_rows, backward)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();  // wall time: OpenMP threads do the work
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (bool backward : {false, true}) {
    const std::string pass = backward ? "forward_backward" : "forward";
    register_pass("linear_cross_entropy/unfused/" + pass, -1, backward);
    for (int64_t chunk : {int64_t(0), int64_t(64), kRows}) {
      register_pass("linear_cross_entropy/fused/" + pass + "/chunk_rows=" + std::to_string(chunk),
                    chunk, backward);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

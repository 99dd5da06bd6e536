// The CPU causal depthwise conv1d (core/cpu/conv1d.cpp), forward and backward, at the
// tiny GDN and HAM configs' shapes: batch 8, 128 tokens, width 4, the q/k and v
// projections' 128 and 192 channels, with document ids (the packed-document path).
//
// Run (from the repository root):
//   ninja -C build bench/bench_conv1d
//   ./build/bench/bench_conv1d --benchmark_repetitions=5
//
// backward/dx computes the input's gradient only, backward/dweight the weight's and the
// bias's, backward/all all three (what training asks for). "bytes_per_second" counts the
// bytes each case must move once: x and dy read, y or dx written.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "core/ops/conv1d.h"
#include "core/random.h"

namespace {

using ham::Tensor;

constexpr int64_t kBatch = 8, kTokens = 128, kWidth = 4;

struct Inputs {
  Tensor x, dy, weight, bias, doc_ids;
};

Inputs make_inputs(int64_t channels) {
  ham::Generator generator(7);
  Inputs in;
  in.x = ham::normal({kBatch, kTokens, channels}, generator, 0, 1);
  in.dy = ham::normal({kBatch, kTokens, channels}, generator, 0, 1);
  in.weight = ham::normal({channels, kWidth}, generator, 0, 0.5);
  in.bias = ham::normal({channels}, generator, 0, 0.5);
  std::vector<int64_t> ids(size_t(kBatch * kTokens));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i / 50);  // 50-token documents
  in.doc_ids = Tensor::from_vector(ids, {kBatch, kTokens});
  return in;
}

int64_t activation_bytes(int64_t channels) {
  return kBatch * kTokens * channels * int64_t(sizeof(float));
}

void BM_Forward(benchmark::State& state) {
  const int64_t channels = state.range(0);
  Inputs in = make_inputs(channels);
  for (auto _ : state) {
    Tensor y = ham::ops::causal_conv1d(in.x, in.weight, in.bias, in.doc_ids);
    benchmark::DoNotOptimize(y.data<float>());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * activation_bytes(channels));
}

// range(1): 0 = dx only, 1 = dweight and dbias only, 2 = all three.
void BM_Backward(benchmark::State& state) {
  const int64_t channels = state.range(0), which = state.range(1);
  Inputs in = make_inputs(channels);
  const bool want_dx = which != 1, want_weight = which != 0;
  for (auto _ : state) {
    auto grads = ham::ops::causal_conv1d_backward(in.dy, in.x, in.weight, want_dx, want_weight,
                                                  want_weight, in.doc_ids);
    benchmark::DoNotOptimize(grads.dx.defined() ? grads.dx.data<float>() : nullptr);
    benchmark::DoNotOptimize(grads.dweight.defined() ? grads.dweight.data<float>() : nullptr);
  }
  const int64_t bytes = (want_dx ? 3 : 2) * activation_bytes(channels);
  state.SetBytesProcessed(int64_t(state.iterations()) * bytes);
}

BENCHMARK(BM_Forward)->Name("forward")->ArgName("channels")->Arg(128)->Arg(192);
BENCHMARK(BM_Backward)
    ->Name("backward")
    ->ArgNames({"channels", "dx0_dweight1_all2"})
    ->ArgsProduct({{128, 192}, {0, 1, 2}});

}  // namespace

BENCHMARK_MAIN();

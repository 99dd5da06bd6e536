// The CPU rms_norm kernels, plain and gated, forward and backward, each against a plain
// loop that moves the same bytes on the same threads (the `_reference` rows): how far each
// kernel is from what streaming its operands costs at all.
//
// Run (from the repository root):
//   ninja -C build bench/bench_norm
//   ./build/bench/bench_norm --benchmark_repetitions=5
//
// Shapes are the tiny HAM config's (batch 8, 128 tokens), f32: the pre-norms' [1024, 128]
// with a weight, and the gated delta rule's output norm, [2048, 96] rows gated by silu(gate)
// with a weight. The backwards compute every gradient (dx, dgate where gated, dweight).
// "bytes_per_second" counts the bytes each kernel must move, once.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "core/ops/norm.h"
#include "core/random.h"

namespace {

using ham::Shape;
using ham::Tensor;

const Shape kPreNorm{1024, 128};
const Shape kGated{2048, 96};

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  ham::Generator generator(seed);
  return ham::normal(shape, generator, 0, 1.5);
}

void set_bytes(benchmark::State& state, int64_t bytes) {
  state.SetBytesProcessed(int64_t(state.iterations()) * bytes);
}

// A plain loop over n floats that reads `reads` arrays and writes `writes` (1 to 3, 1 or 2).
void BM_Stream(benchmark::State& state) {
  const int reads = int(state.range(0)), writes = int(state.range(1));
  const int64_t n = state.range(2);
  std::vector<Tensor> inputs, outputs;
  for (int k = 0; k < reads; ++k) inputs.push_back(random_tensor({n}, uint64_t(k + 1)));
  for (int k = 0; k < writes; ++k) outputs.push_back(Tensor::empty({n}));
  const float* a = inputs[0].data<float>();
  const float* b = reads > 1 ? inputs[1].data<float>() : a;
  const float* c = reads > 2 ? inputs[2].data<float>() : b;
  float* y = outputs[0].data<float>();
  float* z = writes > 1 ? outputs[1].data<float>() : y;
  for (auto _ : state) {
    if (reads > 2) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        y[i] = a[i] + b[i] + c[i];
        z[i] = a[i] * c[i];  // the second write (the same slot again when writes = 1)
      }
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    }
    benchmark::ClobberMemory();
  }
  set_bytes(state, int64_t(reads + writes) * n * 4);
}
// Forward: x (and gate) in, y out. Backward: dy, x (and gate) in, dx (and dgate) out.
BENCHMARK(BM_Stream)
    ->Name("stream_reference")
    ->ArgNames({"reads", "writes", "n"})
    ->Args({1, 1, 1024 * 128})   // rms_norm
    ->Args({2, 1, 2048 * 96})    // rms_norm gated
    ->Args({2, 1, 1024 * 128})   // rms_norm_backward
    ->Args({3, 2, 2048 * 96});   // rms_norm_backward gated

void BM_RmsNorm(benchmark::State& state) {
  const bool gated = state.range(0) != 0;
  const Shape shape = gated ? kGated : kPreNorm;
  Tensor x = random_tensor(shape, 1), w = random_tensor({shape[1]}, 2);
  Tensor gate = gated ? random_tensor(shape, 3) : Tensor();
  Tensor y = Tensor::empty(shape), rstd = Tensor::empty({shape[0]});
  for (auto _ : state) {
    ham::cpu::rms_norm(x, gate, w, 1e-6, y, rstd);
    benchmark::ClobberMemory();
  }
  set_bytes(state, (gated ? 3 : 2) * x.numel() * 4);
}
BENCHMARK(BM_RmsNorm)->Name("rms_norm")->ArgName("gated")->Arg(0)->Arg(1);

void BM_RmsNormBackward(benchmark::State& state) {
  const bool gated = state.range(0) != 0;
  const Shape shape = gated ? kGated : kPreNorm;
  Tensor x = random_tensor(shape, 1), w = random_tensor({shape[1]}, 2);
  Tensor gate = gated ? random_tensor(shape, 3) : Tensor();
  Tensor dy = random_tensor(shape, 4);
  Tensor y = Tensor::empty(shape), rstd = Tensor::empty({shape[0]});
  ham::cpu::rms_norm(x, gate, w, 1e-6, y, rstd);
  Tensor dx = Tensor::empty(shape), dw = Tensor::empty({shape[1]});
  Tensor dgate = gated ? Tensor::empty(shape) : Tensor();
  for (auto _ : state) {
    ham::cpu::rms_norm_backward(dy, x, gate, w, rstd, dx, dgate, dw);
    benchmark::ClobberMemory();
  }
  set_bytes(state, (gated ? 5 : 3) * x.numel() * 4);
}
BENCHMARK(BM_RmsNormBackward)->Name("rms_norm_backward")->ArgName("gated")->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();

// The CPU element-wise kernels a training step spends its time in (`ham train --profile`
// puts unary, unary_backward, binary and sum_to at about 40% of the tiny HAM step), and the
// fused SwiGLU gating against the kernels it replaces, each
// against a plain loop that moves the same bytes on the same threads: how far each kernel
// is from what streaming its operands costs at all.
//
// Run (from the repository root):
//   ninja -C build bench/bench_elementwise
//   ./build/bench/bench_elementwise --benchmark_repetitions=5
//
// Shapes are the tiny HAM config's (batch 8, 128 tokens): [8, 128, 384] for the feed-forward
// activations, [8, 128, 4, 48] for the attention values and their per-head scale, f32.
// References, one per traffic pattern:
//   - stream_1to1_reference: out[i] = x[i] (one read, one write: a unary map's traffic);
//   - stream_2to1_reference: out[i] = a[i] + b[i] (two reads, one write: a backward's or a
//     binary op's traffic);
//   - stream_1to0_reference: the sum of x in any order (one read: a reduction's traffic).
// "bytes_per_second" counts the bytes each kernel must move, once.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <iterator>

#include "core/ops/elementwise.h"
#include "core/ops/swiglu.h"
#include "core/ops/unary.h"
#include "core/random.h"

namespace {

using ham::BinaryOp;
using ham::Shape;
using ham::Tensor;
using ham::UnaryOp;

const Shape kActivations{8, 128, 384};
const Shape kHeadValues{8, 128, 4, 48};
const Shape kHeadScale{8, 128, 4, 1};

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  ham::Generator generator(seed);
  return ham::normal(shape, generator, 0, 2);  // spans the transcendentals' ranges
}

void set_bytes(benchmark::State& state, int64_t bytes) {
  state.SetBytesProcessed(int64_t(state.iterations()) * bytes);
}

void BM_Stream1to1(benchmark::State& state) {
  Tensor x = random_tensor(kActivations, 1), y = Tensor::empty(kActivations);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  int64_t n = x.numel();
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) py[i] = px[i];
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2 * n * 4);
}
BENCHMARK(BM_Stream1to1)->Name("stream_1to1_reference");

void BM_Stream2to1(benchmark::State& state) {
  Tensor a = random_tensor(kActivations, 1), b = random_tensor(kActivations, 2);
  Tensor y = Tensor::empty(kActivations);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  int64_t n = a.numel();
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3 * n * 4);
}
BENCHMARK(BM_Stream2to1)->Name("stream_2to1_reference");

void BM_Stream1to0(benchmark::State& state) {
  Tensor x = random_tensor(kHeadValues, 1);
  const float* px = x.data<float>();
  int64_t n = x.numel();
  for (auto _ : state) {
    float sum = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += px[i];
    benchmark::DoNotOptimize(sum);
  }
  set_bytes(state, n * 4);
}
BENCHMARK(BM_Stream1to0)->Name("stream_1to0_reference");

const UnaryOp kUnaryOps[] = {UnaryOp::Exp, UnaryOp::Sigmoid, UnaryOp::Silu, UnaryOp::Softplus,
                             UnaryOp::Gelu, UnaryOp::Tanh, UnaryOp::Log};

void BM_Unary(benchmark::State& state) {
  UnaryOp op = kUnaryOps[state.range(0)];
  Tensor x = random_tensor(kActivations, 1);
  if (op == UnaryOp::Log) x = ham::ops::unary(UnaryOp::Exp, x);  // positive inputs
  Tensor y = Tensor::empty(kActivations);
  for (auto _ : state) {
    ham::cpu::unary(op, x, y);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2 * x.numel() * 4);
  state.SetLabel(ham::unary_op_name(op));
}
BENCHMARK(BM_Unary)->DenseRange(0, std::size(kUnaryOps) - 1)->Name("unary");

void BM_UnaryBackward(benchmark::State& state) {
  UnaryOp op = kUnaryOps[state.range(0)];
  Tensor x = random_tensor(kActivations, 1);
  if (op == UnaryOp::Log) x = ham::ops::unary(UnaryOp::Exp, x);
  Tensor saved = ham::unary_saves(op) == ham::UnarySaved::Output ? ham::ops::unary(op, x) : x;
  Tensor dy = random_tensor(kActivations, 2), dx = Tensor::empty(kActivations);
  for (auto _ : state) {
    ham::cpu::unary_backward(op, dy, saved, dx);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3 * x.numel() * 4);
  state.SetLabel(ham::unary_op_name(op));
}
BENCHMARK(BM_UnaryBackward)->DenseRange(0, std::size(kUnaryOps) - 1)->Name("unary_backward");

// The feed-forward gating silu(gate) * up: the fused op against the kernels it replaces
// (silu, then mul; backward: silu's backward and mul's two products). Counted by the bytes
// the fused kernels move: gate and up read and out written (forward), dout, gate and up
// read and both gradients written (backward).
void BM_Swiglu(benchmark::State& state) {
  const bool fused = state.range(0) == 1;
  Tensor gate = random_tensor(kActivations, 1), up = random_tensor(kActivations, 2);
  Tensor out = Tensor::empty(kActivations), silu_gate = Tensor::empty(kActivations);
  for (auto _ : state) {
    if (fused) {
      ham::cpu::swiglu(gate, up, out);
    } else {
      ham::cpu::unary(UnaryOp::Silu, gate, silu_gate);
      ham::cpu::binary(BinaryOp::Mul, silu_gate, up, out);
    }
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3 * gate.numel() * 4);
  state.SetLabel(fused ? "fused" : "silu, mul");
}
BENCHMARK(BM_Swiglu)->Arg(1)->Arg(0)->Name("swiglu");

void BM_SwigluBackward(benchmark::State& state) {
  const bool fused = state.range(0) == 1;
  Tensor gate = random_tensor(kActivations, 1), up = random_tensor(kActivations, 2);
  Tensor dout = random_tensor(kActivations, 3), silu_gate = ham::ops::unary(UnaryOp::Silu, gate);
  Tensor dgate = Tensor::empty(kActivations), dup = Tensor::empty(kActivations);
  Tensor dsilu = Tensor::empty(kActivations);
  for (auto _ : state) {
    if (fused) {
      ham::cpu::swiglu_backward(dout, gate, up, dgate, dup);
    } else {
      ham::cpu::binary(BinaryOp::Mul, dout, silu_gate, dup);
      ham::cpu::binary(BinaryOp::Mul, dout, up, dsilu);
      ham::cpu::unary_backward(UnaryOp::Silu, dsilu, gate, dgate);
    }
    benchmark::ClobberMemory();
  }
  set_bytes(state, 5 * gate.numel() * 4);
  state.SetLabel(fused ? "fused" : "mul, mul, silu backward");
}
BENCHMARK(BM_SwigluBackward)->Arg(1)->Arg(0)->Name("swiglu_backward");

void BM_BinarySameShape(benchmark::State& state) {
  Tensor a = random_tensor(kActivations, 1), b = random_tensor(kActivations, 2);
  Tensor y = Tensor::empty(kActivations);
  for (auto _ : state) {
    ham::cpu::binary(BinaryOp::Mul, a, b, y);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3 * a.numel() * 4);
}
BENCHMARK(BM_BinarySameShape)->Name("binary_mul_same_shape");

// A per-row scale, [8, 128, 4, 48] * [8, 128, 4, 1]: the router's value scaling.
void BM_BinaryRowBroadcast(benchmark::State& state) {
  Tensor a = random_tensor(kHeadValues, 1), b = random_tensor(kHeadScale, 2);
  Tensor y = Tensor::empty(kHeadValues);
  for (auto _ : state) {
    ham::cpu::binary(BinaryOp::Mul, a, b, y);
    benchmark::ClobberMemory();
  }
  set_bytes(state, (2 * a.numel() + b.numel()) * 4);
}
BENCHMARK(BM_BinaryRowBroadcast)->Name("binary_mul_row_broadcast");

// A bias-like operand, [8, 128, 384] + [384].
void BM_BinaryTrailingBroadcast(benchmark::State& state) {
  Tensor a = random_tensor(kActivations, 1), b = random_tensor({384}, 2);
  Tensor y = Tensor::empty(kActivations);
  for (auto _ : state) {
    ham::cpu::binary(BinaryOp::Add, a, b, y);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2 * a.numel() * 4);
}
BENCHMARK(BM_BinaryTrailingBroadcast)->Name("binary_add_trailing_broadcast");

// The backward of the row scale: [8, 128, 4, 48] summed to [8, 128, 4, 1].
void BM_SumToRows(benchmark::State& state) {
  Tensor x = random_tensor(kHeadValues, 1), y = Tensor::empty(kHeadScale);
  for (auto _ : state) {
    ham::cpu::sum_to(x, y);
    benchmark::ClobberMemory();
  }
  set_bytes(state, x.numel() * 4);
}
BENCHMARK(BM_SumToRows)->Name("sum_to_rows");

// The backward of a bias: [8, 128, 384] summed to [384].
void BM_SumToColumns(benchmark::State& state) {
  Tensor x = random_tensor(kActivations, 1), y = Tensor::empty({384});
  for (auto _ : state) {
    ham::cpu::sum_to(x, y);
    benchmark::ClobberMemory();
  }
  set_bytes(state, x.numel() * 4);
}
BENCHMARK(BM_SumToColumns)->Name("sum_to_columns");

}  // namespace

BENCHMARK_MAIN();

#pragma once
// Helpers shared by CPU kernels: dtype dispatch, a parallel loop that only spawns
// threads when the work is big enough to pay for them, and a shape's row-major strides.
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ham::cpu {

// Calls fn.template operator()<T>() for T in {float, double}; other dtypes are an error
// naming the op (CPU math runs in f32 or f64; bf16 is converted at the boundary).
template <class Fn>
void dispatch_floating(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: fn.template operator()<float>(); return;
    case DType::F64: fn.template operator()<double>(); return;
    default:
      HAM_FAIL(op, ": CPU kernels take f32 or f64, got ", dtype_name(dtype),
               " (convert with .to(DType::F32))");
  }
}

// Index dtype dispatch (token ids, gather indices).
template <class Fn>
void dispatch_index(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::I32: fn.template operator()<int32_t>(); return;
    case DType::I64: fn.template operator()<int64_t>(); return;
    default: HAM_FAIL(op, ": indices must be i32 or i64, got ", dtype_name(dtype));
  }
}

// Elements per thread below which a loop stays serial.
constexpr int64_t kParallelGrain = 1 << 15;

template <class Body>
void parallel_for(int64_t n, int64_t cost_per_item, Body&& body) {
  bool parallel = n > 1 && n * cost_per_item >= kParallelGrain;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// Row-major strides (in elements) of a contiguous tensor of `shape`.
inline std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) strides[k - 1] = strides[k] * shape[k];
  return strides;
}

}  // namespace ham::cpu

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/reduce.h"

namespace ham::cpu {

namespace {

// A long single row is summed in chunks of this many elements, then the chunk sums in
// order: the split depends only on the length, never on the thread count.
constexpr int64_t kChunk = 1 << 14;
// Columns summed together when inner > 1, so each row read is contiguous.
constexpr int64_t kColumnBlock = 64;

}  // namespace

void reduce_sum(const Tensor& in, Tensor& out, const ReduceDims& dims, double scale) {
  dispatch_floating("sum", in.dtype(), [&]<class T>() {
    const T* x = in.data<T>();
    T* y = out.data<T>();
    const int64_t outer = dims.outer, len = dims.len, inner = dims.inner;
    if (inner == 1 && outer == 1 && len >= 2 * kChunk) {
      int64_t chunks = (len + kChunk - 1) / kChunk;
      std::vector<double> partial(static_cast<size_t>(chunks));
      parallel_for(chunks, kChunk, [&](int64_t c) {
        int64_t end = std::min(len, (c + 1) * kChunk);
        double acc = 0;
        for (int64_t l = c * kChunk; l < end; ++l) acc += double(x[l]);
        partial[size_t(c)] = acc;
      });
      double total = 0;
      for (double p : partial) total += p;
      y[0] = T(total * scale);
      return;
    }
    if (inner == 1) {  // rows of a [outer, len] matrix
      parallel_for(outer, len, [&](int64_t o) {
        const T* row = x + o * len;
        double acc = 0;
        for (int64_t l = 0; l < len; ++l) acc += double(row[l]);
        y[o] = T(acc * scale);
      });
      return;
    }
    // Column blocks of each [len, inner] slab: walk the len rows, adding kColumnBlock
    // contiguous values per row.
    int64_t blocks = (inner + kColumnBlock - 1) / kColumnBlock;
    parallel_for(outer * blocks, len * kColumnBlock, [&](int64_t task) {
      int64_t o = task / blocks, begin = (task % blocks) * kColumnBlock;
      int64_t width = std::min(kColumnBlock, inner - begin);
      double acc[kColumnBlock] = {};
      const T* slab = x + o * len * inner + begin;
      for (int64_t l = 0; l < len; ++l) {
        const T* row = slab + l * inner;
        for (int64_t i = 0; i < width; ++i) acc[i] += double(row[i]);
      }
      T* dst = y + o * inner + begin;
      for (int64_t i = 0; i < width; ++i) dst[i] = T(acc[i] * scale);
    });
  });
}

void reduce_sum_backward(const Tensor& dy, Tensor& dx, const ReduceDims& dims, double scale) {
  dispatch_floating("sum backward", dy.dtype(), [&]<class T>() {
    const T* g = dy.data<T>();
    T* d = dx.data<T>();
    const int64_t len = dims.len, inner = dims.inner;
    const T s = T(scale);
    // Row r = (o, l) of dx is scale * row o of dy.
    parallel_for(dims.outer * len, inner, [&](int64_t r) {
      const T* src = g + (r / len) * inner;
      T* dst = d + r * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = s * src[i];
    });
  });
}

}  // namespace ham::cpu

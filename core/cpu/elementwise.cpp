#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/elementwise.h"

namespace ham::cpu {

namespace {

// Strides (in elements) of `shape` seen through the broadcast `out` shape: 0 where the
// dim is stretched.
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    size_t d = shape.size() - 1 - i;
    size_t o = out.size() - 1 - i;
    strides[o] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

// The dims of `shape` with two operands' strides through them, size-1 dims dropped and
// neighbours merged wherever both operands step through them as through one dim (both
// contiguous across the pair, or both stretched): [8, 128, 4, 48] * [8, 128, 4, 1] becomes
// 4096 rows of 48 against one value each. Outermost first; at least one dim.
struct MergedDims {
  std::vector<int64_t> sizes, first_strides, second_strides;

  MergedDims(const Shape& shape, const std::vector<int64_t>& first,
             const std::vector<int64_t>& second) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      if (!sizes.empty() && first_strides.back() == first[d] * shape[d] &&
          second_strides.back() == second[d] * shape[d]) {
        sizes.back() *= shape[d];
        first_strides.back() = first[d];
        second_strides.back() = second[d];
        continue;
      }
      sizes.push_back(shape[d]);
      first_strides.push_back(first[d]);
      second_strides.push_back(second[d]);
    }
    if (sizes.empty()) sizes = {1}, first_strides = {0}, second_strides = {0};
  }

  int64_t inner() const { return sizes.back(); }
  // Offsets of the start of row `row` (a flat index over every dim but the last).
  void row_offsets(int64_t row, int64_t& first, int64_t& second) const {
    first = second = 0;
    for (int64_t d = int64_t(sizes.size()) - 2; d >= 0; --d) {
      int64_t index = row % sizes[size_t(d)];
      row /= sizes[size_t(d)];
      first += index * first_strides[size_t(d)];
      second += index * second_strides[size_t(d)];
    }
  }
};

template <BinaryOp op, class T>
T apply(T x, T y) {
  if constexpr (op == BinaryOp::Add) return x + y;
  if constexpr (op == BinaryOp::Sub) return x - y;
  if constexpr (op == BinaryOp::Mul) return x * y;
  if constexpr (op == BinaryOp::Div) return x / y;
}

// out[j] = a[j * a_step] (op) b[j * b_step] for j < n, steps 0 or 1; each case its own loop
// so that the compiler vectorizes it.
template <BinaryOp op, class T>
void binary_run(const T* a, int64_t a_step, const T* b, int64_t b_step, T* out, int64_t n) {
  if (a_step == 1 && b_step == 1) {
    for (int64_t j = 0; j < n; ++j) out[j] = apply<op>(a[j], b[j]);
  } else if (a_step == 1) {
    const T y = b[0];
    for (int64_t j = 0; j < n; ++j) out[j] = apply<op>(a[j], y);
  } else if (b_step == 1) {
    const T x = a[0];
    for (int64_t j = 0; j < n; ++j) out[j] = apply<op>(x, b[j]);
  } else {
    const T value = apply<op>(a[0], b[0]);
    for (int64_t j = 0; j < n; ++j) out[j] = value;
  }
}

// Row pieces at most this long, so that a few long rows still spread over the threads.
constexpr int64_t kPieceLength = 4096;

template <BinaryOp op, class T>
void binary_merged(const MergedDims& dims, const T* pa, const T* pb, T* po) {
  const int64_t inner = dims.inner();
  const int64_t pieces_per_row = (inner + kPieceLength - 1) / kPieceLength;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < dims.sizes.size(); ++d) rows *= dims.sizes[d];
  const int64_t a_step = dims.first_strides.back(), b_step = dims.second_strides.back();
  parallel_for(rows * pieces_per_row, std::min(inner, kPieceLength), [&](int64_t piece) {
    const int64_t row = piece / pieces_per_row;
    const int64_t begin = (piece % pieces_per_row) * kPieceLength;
    const int64_t length = std::min(kPieceLength, inner - begin);
    int64_t ia, ib;
    dims.row_offsets(row, ia, ib);
    binary_run<op>(pa + ia + begin * a_step, a_step, pb + ib + begin * b_step, b_step,
                   po + row * inner + begin, length);
  });
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_floating(binary_op_name(op), a.dtype(), [&]<class T>() {
    if (out.numel() == 0) return;
    const MergedDims dims(out.shape(), broadcast_strides(a.shape(), out.shape()),
                          broadcast_strides(b.shape(), out.shape()));
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    switch (op) {
      case BinaryOp::Add: return binary_merged<BinaryOp::Add>(dims, pa, pb, po);
      case BinaryOp::Sub: return binary_merged<BinaryOp::Sub>(dims, pa, pb, po);
      case BinaryOp::Mul: return binary_merged<BinaryOp::Mul>(dims, pa, pb, po);
      case BinaryOp::Div: return binary_merged<BinaryOp::Div>(dims, pa, pb, po);
    }
  });
}

void axpy(double alpha, const Tensor& src, Tensor& dst) {
  dispatch_floating("axpy_", dst.dtype(), [&]<class T>() {
    const T* s = src.data<T>();
    T* d = dst.data<T>();
    T a = T(alpha);
    parallel_for(dst.numel(), 1, [&](int64_t i) { d[i] += a * s[i]; });
  });
}

void scale(double alpha, Tensor& x) {
  dispatch_floating("scale_", x.dtype(), [&]<class T>() {
    T* p = x.data<T>();
    T a = T(alpha);
    parallel_for(x.numel(), 1, [&](int64_t i) { p[i] *= a; });
  });
}

namespace {

// The sum of x[0, n) in eight interleaved partial sums (which the compiler vectorizes),
// added in a fixed order at the end.
template <class T>
T sum_run(const T* x, int64_t n) {
  T lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += x[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) lanes[l] += x[i];
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
         ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// Input offsets of every index over the dims `dims` marks, in order (an odometer).
std::vector<int64_t> offsets_over(const MergedDims& merged, const std::vector<size_t>& dims) {
  std::vector<int64_t> offsets{0};
  for (size_t d : dims) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * size_t(merged.sizes[d]));
    for (int64_t base : offsets) {
      for (int64_t i = 0; i < merged.sizes[d]; ++i) {
        next.push_back(base + i * merged.first_strides[d]);
      }
    }
    offsets = std::move(next);
  }
  return offsets;
}

// Columns each task of a column sum takes.
constexpr int64_t kColumnBlock = 256;

}  // namespace

// With the dims merged, the summed and the kept dims alternate. Each output element is the
// sum of its inputs in input order, whatever the threads, so the result is deterministic:
//   - the last dim summed (per-row sums): each output adds contiguous runs;
//   - the last dim kept (bias gradients): a block of outputs adds input rows, one at a time.
void sum_to(const Tensor& in, Tensor& out) {
  dispatch_floating("sum_to", in.dtype(), [&]<class T>() {
    const T* pi = in.data<T>();
    T* po = out.data<T>();
    const int64_t n_out = out.numel();
    if (n_out == 0) return;
    if (in.numel() == 0) {
      std::fill(po, po + n_out, T(0));
      return;
    }
    const MergedDims merged(in.shape(), contiguous_strides(in.shape()),
                            broadcast_strides(out.shape(), in.shape()));
    const size_t last = merged.sizes.size() - 1;
    const bool last_summed = merged.second_strides[last] == 0 && merged.sizes[last] > 1;
    std::vector<size_t> kept, summed;  // every dim but the last
    for (size_t d = 0; d < last; ++d) {
      (merged.second_strides[d] == 0 ? summed : kept).push_back(d);
    }
    const std::vector<int64_t> summed_offsets = offsets_over(merged, summed);
    const std::vector<int64_t> kept_offsets = offsets_over(merged, kept);  // output order
    const int64_t inner = merged.sizes[last];
    const int64_t work = int64_t(summed_offsets.size()) * (last_summed ? inner : 1);
    if (last_summed) {
      parallel_for(n_out, work, [&](int64_t j) {
        const T* base = pi + kept_offsets[size_t(j)];
        T acc = T(0);
        for (int64_t offset : summed_offsets) acc += sum_run(base + offset, inner);
        po[j] = acc;
      });
      return;
    }
    const int64_t blocks_per_row = (inner + kColumnBlock - 1) / kColumnBlock;
    parallel_for(n_out / inner * blocks_per_row, work * kColumnBlock, [&](int64_t task) {
      const int64_t row = task / blocks_per_row;
      const int64_t begin = (task % blocks_per_row) * kColumnBlock;
      const int64_t width = std::min(kColumnBlock, inner - begin);
      T acc[kColumnBlock] = {};
      const T* base = pi + kept_offsets[size_t(row)] + begin;
      for (int64_t offset : summed_offsets) {
        for (int64_t c = 0; c < width; ++c) acc[c] += base[offset + c];
      }
      std::copy(acc, acc + width, po + row * inner + begin);
    });
  });
}

}  // namespace ham::cpu

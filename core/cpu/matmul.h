#pragma once
// The CPU GEMM of core/cpu/matmul.cpp on strided blocks, for kernels that multiply small
// per-head blocks on their own thread (the gated delta rule's chunks, attention's query
// segments). Each such kernel runs one head per thread, so these products never split
// across threads, and they get the same micro-kernel as ops::gemm.
#include <Eigen/Core>
#include <cstdint>
#include <type_traits>

#include "core/tensor.h"

namespace ham::cpu {

// A strided matrix: element (i, j) at data[i * row_stride + j * col_stride].
template <class T>
struct StridedMatrix {
  T* data;
  int64_t rows, cols, row_stride, col_stride;
};

// The strided view of an Eigen expression with direct access (a Map, a Block, a Transpose
// of either), so that a kernel keeps writing its products as Eigen blocks.
template <class Expr>
auto strided(Expr&& e) {
  using T = std::remove_pointer_t<decltype(e.data())>;
  return StridedMatrix<T>{e.data(), int64_t(e.rows()), int64_t(e.cols()),
                          int64_t(e.rowStride()), int64_t(e.colStride())};
}

// C = alpha * A B + beta * C on the calling thread (beta = 0 never reads C). C's rows must
// be contiguous (col_stride 1), and A's rows or columns (one stride 1). The packing buffer
// is a pool tensor kept between calls, grown to the largest product's need; so it counts
// in the run's peak memory.
template <class T>
class ProductOnThisThread {
 public:
  void operator()(const StridedMatrix<T>& c, const StridedMatrix<const T>& a,
                  const StridedMatrix<const T>& b, T alpha, T beta);

  // dst = alpha * lhs rhs, dst += alpha * lhs rhs, on Eigen expressions.
  template <class Dst, class Lhs, class Rhs>
  void assign(Dst&& dst, const Lhs& lhs, const Rhs& rhs, T alpha = T(1)) {
    (*this)(strided(dst), as_const(strided(lhs)), as_const(strided(rhs)), alpha, T(0));
  }
  template <class Dst, class Lhs, class Rhs>
  void add(Dst&& dst, const Lhs& lhs, const Rhs& rhs, T alpha = T(1)) {
    (*this)(strided(dst), as_const(strided(lhs)), as_const(strided(rhs)), alpha, T(1));
  }

 private:
  template <class U>
  static StridedMatrix<const T> as_const(const StridedMatrix<U>& m) {
    return {m.data, m.rows, m.cols, m.row_stride, m.col_stride};
  }

  Tensor buffer_;
};

extern template class ProductOnThisThread<float>;
extern template class ProductOnThisThread<double>;

}  // namespace ham::cpu

// CPU GEMM on Eigen. One large product uses Eigen's own OpenMP threads; many small ones
// (attention's per-head products) are spread over threads one matrix each.
#include <cstdint>

#include <Eigen/Core>

#include "core/cpu/parallel.h"
#include "core/ops/matmul.h"

namespace ham::cpu {

namespace {

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
void gemm_one(const T* a, const T* b, T* c, const GemmShape& s) {
  int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  Eigen::Map<const RowMajor<T>> A(a, a_rows, a_cols);
  Eigen::Map<const RowMajor<T>> B(b, b_rows, b_cols);
  Eigen::Map<RowMajor<T>> C(c, s.m, s.n);
  const T alpha = T(s.alpha);
  if (s.beta == 0.0) {
    C.setZero();  // beta = 0 must ignore whatever C held (even NaN)
  } else if (s.beta != 1.0) {
    C *= T(s.beta);
  }
  if (s.k == 0) return;
  if (!s.trans_a && !s.trans_b) C.noalias() += alpha * A * B;
  else if (s.trans_a && !s.trans_b) C.noalias() += alpha * A.transpose() * B;
  else if (!s.trans_a && s.trans_b) C.noalias() += alpha * A * B.transpose();
  else C.noalias() += alpha * A.transpose() * B.transpose();
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape& s) {
  dispatch_floating("matmul", a.dtype(), [&]<class T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = c.data<T>();
    auto one = [&](int64_t i) {
      gemm_one<T>(pa + i * s.a_batch_stride, pb + i * s.b_batch_stride, pc + i * s.m * s.n, s);
    };
    if (s.batch == 1) {
      one(0);
    } else {
      parallel_for(s.batch, s.m * s.n * std::max<int64_t>(s.k, 1), one);
    }
  });
}

}  // namespace ham::cpu

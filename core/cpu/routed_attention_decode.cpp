// CPU routed attention over a KV cache (decoding); the math is in
// core/ops/routed_attention_decode.h. Parallel over (b, i, query head); each task reads its
// visible cached keys and values in place (rows of stride Hkv * D in the cache, no copy)
// and runs the two-pass softmax with Eigen matrix-vector products, as the forward does.
#include "core/ops/routed_attention_decode.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/cpu/parallel.h"

namespace ham::cpu {

namespace {

template <class T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
// n rows of a [B, C, Hkv, D] cache for one (b, kv head): stride Hkv * D between rows.
template <class T>
using CacheRows = Eigen::Map<const RowMajorMatrix<T>, 0, Eigen::OuterStride<>>;

}  // namespace

void routed_attention_decode(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& value_scale, const Tensor& visible, double scale,
                             Tensor& out, Tensor& lse) {
  dispatch_floating("routed_attention_decode", q.dtype(), [&]<class T>() {
    const int64_t B = q.size(0), n = q.size(1), Hq = q.size(2), Dk = q.size(3);
    const int64_t C = k_cache.size(1), Hkv = k_cache.size(2), Dv = v_cache.size(3);
    const int64_t group = Hq / Hkv;
    const T* pq = q.data<T>();
    const T* pk = k_cache.data<T>();
    const T* pv = v_cache.data<T>();
    const T* pp = value_scale.defined() ? value_scale.data<T>() : nullptr;
    const int64_t* counts = visible.data<int64_t>();
    T* po = out.data<T>();
    T* plse = lse.data<T>();
    int64_t most = 0;
    for (int64_t r = 0; r < B * n; ++r) most = std::max(most, counts[r]);
    parallel_for(B * n * Hq, std::max<int64_t>(1, most * (Dk + Dv)), [&](int64_t task) {
      const int64_t row = task / Hq, h = task % Hq;  // row = b * n + i
      const int64_t b = row / n, g = h / group;
      const int64_t keys = counts[row];
      Eigen::Map<Vector<T>> o(po + task * Dv, Dv);
      if (keys == 0) {  // nothing visible: o = 0 by definition, lse = log(0)
        o.setZero();
        plse[task] = -std::numeric_limits<T>::infinity();
        return;
      }
      const Eigen::OuterStride<> k_stride(Hkv * Dk), v_stride(Hkv * Dv);
      CacheRows<T> k_rows(pk + (b * C * Hkv + g) * Dk, keys, Dk, k_stride);
      CacheRows<T> v_rows(pv + (b * C * Hkv + g) * Dv, keys, Dv, v_stride);
      Eigen::Map<const Vector<T>> q_row(pq + task * Dk, Dk);
      Vector<T> s = k_rows * q_row;  // s_j = <q, k_j>, then scaled
      s *= T(scale);
      const T s_max = s.maxCoeff();
      s = (s.array() - s_max).exp();  // e_j = exp(s_j - max s)
      const T sum = s.sum();
      if (pp) s.array() *= Eigen::Map<const Vector<T>>(pp + b * C, keys).array();  // v' = p v
      o.noalias() = v_rows.transpose() * s;
      o /= sum;
      plse[task] = s_max + std::log(sum);
    });
  });
}

}  // namespace ham::cpu

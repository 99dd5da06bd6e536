#include "core/ops/routed_attention_decode.h"

#include <cmath>
#include <cstdint>
#include <string>

namespace ham {

HAM_DEFINE_KERNEL_TABLE(routed_attention_decode, &cpu::routed_attention_decode,
                        void(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& value_scale, const Tensor& visible, double scale,
                             Tensor& out, Tensor& lse))

namespace ops {

namespace {

constexpr const char* kOp = "routed_attention_decode";

std::string shape_of(const Tensor& t) { return shape_str(t.shape()); }

void check_decode_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& visible,
                         const Tensor& value_scale, double scale) {
  HAM_CHECK(q.defined() && k.defined() && v.defined() && visible.defined(), kOp,
            ": q, k_cache, v_cache and visible must be defined tensors");
  HAM_CHECK(q.dim() == 4, kOp, ": q ", shape_of(q), " must be [B, n, Hq, Dk]");
  HAM_CHECK(k.dim() == 4, kOp, ": k_cache ", shape_of(k), " must be [B, C, Hkv, Dk]");
  HAM_CHECK(v.dim() == 4, kOp, ": v_cache ", shape_of(v), " must be [B, C, Hkv, Dv]");
  const int64_t B = q.size(0), n = q.size(1), C = k.size(1);
  HAM_CHECK(k.size(0) == B && k.size(3) == q.size(3), kOp, ": k_cache ", shape_of(k),
            " must have the B and Dk of q ", shape_of(q));
  HAM_CHECK(v.size(0) == B && v.size(1) == C && v.size(2) == k.size(2), kOp, ": v_cache ",
            shape_of(v), " must have the B, C and heads of k_cache ", shape_of(k));
  HAM_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, kOp, ": q heads (", q.size(2),
            ") must be a multiple of the cache's heads (", k.size(2), "), q ", shape_of(q),
            " k_cache ", shape_of(k));
  HAM_CHECK(q.size(3) > 0 && v.size(3) > 0, kOp, ": head dims must be positive, q ", shape_of(q),
            " v_cache ", shape_of(v));
  HAM_CHECK(is_floating(q.dtype()), kOp, ": q must be a floating-point tensor, got ", q.str());
  HAM_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp,
            ": q, k_cache and v_cache must share one dtype, got ", q.str(), ", ", k.str(), ", ",
            v.str());
  check_same_device(kOp, q, k);
  check_same_device(kOp, q, v);
  if (value_scale.defined()) {
    HAM_CHECK(value_scale.shape() == Shape({B, C}), kOp, ": value_scale ", shape_of(value_scale),
              " must be [B, C] = [", B, ", ", C, "] of k_cache ", shape_of(k));
    HAM_CHECK(value_scale.dtype() == q.dtype(), kOp, ": value_scale ", value_scale.str(),
              " must have q's dtype ", dtype_name(q.dtype()));
    check_same_device(kOp, value_scale, q);
  }
  HAM_CHECK(visible.shape() == Shape({B, n}), kOp, ": visible ", shape_of(visible),
            " must be [B, n] = [", B, ", ", n, "] of q ", shape_of(q));
  HAM_CHECK(visible.dtype() == DType::I64 && visible.device().is_cpu(), kOp, ": visible ",
            visible.str(), " must be an i64 tensor on the CPU (the cache's counts are host-side)");
  const int64_t* counts = visible.data<int64_t>();
  for (int64_t r = 0; r < B * n; ++r) {
    HAM_CHECK(counts[r] >= 0 && counts[r] <= C, kOp, ": visible[", r / n, ", ", r % n, "] = ",
              counts[r], " is outside [0, C = ", C, "] of k_cache ", shape_of(k));
  }
  HAM_CHECK(std::isfinite(scale), kOp, ": scale must be finite, got ", scale);
}

}  // namespace

RoutedAttentionOutput routed_attention_decode(const Tensor& q, const Tensor& k_cache,
                                              const Tensor& v_cache, const Tensor& visible,
                                              const Tensor& value_scale, double scale) {
  check_decode_inputs(q, k_cache, v_cache, visible, value_scale, scale);
  RoutedAttentionOutput r;
  r.out = Tensor::empty({q.size(0), q.size(1), q.size(2), v_cache.size(3)}, q.dtype(), q.device());
  r.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)},
                        q.dtype() == DType::F64 ? DType::F64 : DType::F32, q.device());
  routed_attention_decode_kernels()(q.device(), q, k_cache, v_cache, value_scale, visible,
                                    routed_attention_scale(scale, q.size(3)), r.out, r.lse);
  return r;
}

}  // namespace ops
}  // namespace ham

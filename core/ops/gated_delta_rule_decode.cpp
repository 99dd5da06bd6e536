#include "core/ops/gated_delta_rule_decode.h"

#include <cstdint>

#include "core/ops/gated_delta_rule.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(gated_delta_rule_decode, &cpu::gated_delta_rule_decode,
                        void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                             const Tensor& beta, Tensor& state, Tensor& o, Tensor& fit_error))

namespace ops {

DType gated_delta_rule_state_dtype(DType dtype) {
  return dtype == DType::F64 ? DType::F64 : DType::F32;
}

GatedDeltaRuleStep gated_delta_rule_decode(Tensor& state, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& g, const Tensor& beta) {
  const char* op = "gated_delta_rule_decode";
  check_gated_delta_rule_args(op, {q, k, v, g, beta, Tensor(), Tensor()});
  const int64_t B = q.size(0), n = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const Shape state_shape{B, H, K, V};
  HAM_CHECK(state.defined() && state.shape() == state_shape, op, ": state ",
            state.defined() ? shape_str(state.shape()) : "(undefined)", " must be [B, H, K, V] = ",
            shape_str(state_shape), " for q ", shape_str(q.shape()), " and v ", shape_str(v.shape()));
  const DType state_dtype = gated_delta_rule_state_dtype(q.dtype());
  HAM_CHECK(state.dtype() == state_dtype, op, ": state is ", state.str(), " but must be ",
            dtype_name(state_dtype), " for ", dtype_name(q.dtype()),
            " inputs (the decoding state stays in the compute dtype)");
  check_same_device(op, state, q);
  GatedDeltaRuleStep out;
  out.o = Tensor::empty({B, n, H, V}, q.dtype(), q.device());
  out.fit_error = Tensor::empty({B, n, H}, q.dtype(), q.device());
  gated_delta_rule_decode_kernels()(q.device(), q, k, v, g, beta, state, out.o, out.fit_error);
  return out;
}

}  // namespace ops
}  // namespace ham

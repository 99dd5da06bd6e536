#include "core/ops/conv1d.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(causal_conv1d, &cpu::causal_conv1d,
                        void(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& doc_ids, Conv1dActivation activation, Tensor& y))
HAM_DEFINE_KERNEL_TABLE(causal_conv1d_backward, &cpu::causal_conv1d_backward,
                        void(const Tensor& dy, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, const Tensor& doc_ids,
                             Conv1dActivation activation, Tensor& dx, Tensor& dweight,
                             Tensor& dbias))

namespace ops {

namespace {

void check_conv(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                const Tensor& doc_ids) {
  HAM_CHECK(x.dim() == 3 && weight.dim() == 2 && weight.size(0) == x.size(2) &&
                weight.size(1) >= 1,
            op, ": x ", shape_str(x.shape()), " and weight ", shape_str(weight.shape()),
            " must be [B, T, C] and [C, W] with W >= 1");
  HAM_CHECK(weight.dtype() == x.dtype(), op, ": dtypes differ (", x.str(), " and ",
            weight.str(), ")");
  check_same_device(op, x, weight);
  if (doc_ids.defined()) {
    HAM_CHECK(doc_ids.shape() == (Shape{x.size(0), x.size(1)}), op, ": doc_ids ",
              shape_str(doc_ids.shape()), " does not match x ", shape_str(x.shape()),
              " (expected [B, T])");
    HAM_CHECK(doc_ids.dtype() == DType::I32 || doc_ids.dtype() == DType::I64, op,
              ": doc_ids must be i32 or i64, got ", doc_ids.str());
    check_same_device(op, x, doc_ids);
  }
  if (!bias.defined()) return;
  HAM_CHECK(bias.dim() == 1 && bias.size(0) == x.size(2), op, ": bias ",
            shape_str(bias.shape()), " does not match x ", shape_str(x.shape()),
            " (expected [C])");
  HAM_CHECK(bias.dtype() == x.dtype(), op, ": dtypes differ (", x.str(), " and ", bias.str(),
            ")");
  check_same_device(op, x, bias);
}

}  // namespace

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Tensor& doc_ids, Conv1dActivation activation) {
  check_conv("causal_conv1d", x, weight, bias, doc_ids);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  causal_conv1d_kernels()(x.device(), x, weight, bias, doc_ids, activation, y);
  return y;
}

CausalConv1dGrads causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                         bool want_dx, bool want_dweight, bool want_dbias,
                                         const Tensor& doc_ids, const Tensor& bias,
                                         Conv1dActivation activation) {
  check_conv("causal_conv1d_backward", x, weight, bias, doc_ids);
  check_same_shape("causal_conv1d_backward", x, dy);
  HAM_CHECK(dy.dtype() == x.dtype(), "causal_conv1d_backward: dtypes differ (", x.str(),
            " and ", dy.str(), ")");
  CausalConv1dGrads g;
  if (want_dx) g.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (want_dweight) g.dweight = Tensor::empty(weight.shape(), x.dtype(), x.device());
  if (want_dbias) g.dbias = Tensor::empty({x.size(2)}, x.dtype(), x.device());
  causal_conv1d_backward_kernels()(x.device(), dy, x, weight, bias, doc_ids, activation, g.dx,
                                   g.dweight, g.dbias);
  return g;
}

}  // namespace ops
}  // namespace ham

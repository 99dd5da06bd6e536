#include "core/ops/cast.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE_BF16_NATIVE(cast, &cpu::cast, void(const Tensor& x, Tensor& out))

namespace ops {

Tensor cast(const Tensor& x, DType dtype) {
  HAM_CHECK(x.defined(), "cast: the input is an undefined tensor (to ", dtype_name(dtype), ")");
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  cast_kernels()(x.device(), x, out);
  return out;
}

void cast_into(const Tensor& x, Tensor& out) {
  HAM_CHECK(x.defined() && out.defined(), "cast_into: undefined tensor (x ",
            x.defined() ? x.str() : "undefined", ", out ", out.defined() ? out.str() : "undefined",
            ")");
  HAM_CHECK(x.shape() == out.shape(), "cast_into: x ", x.str(), " and out ", out.str(),
            " differ in shape");
  HAM_CHECK(x.device() == out.device(), "cast_into: x ", x.str(), " and out ", out.str(),
            " are on different devices");
  if (x.numel() == 0 || (x.dtype() == out.dtype() && x.raw_data() == out.raw_data())) return;
  cast_kernels()(x.device(), x, out);
}

}  // namespace ops

}  // namespace ham

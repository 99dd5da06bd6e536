#include "core/ops/cast.h"

namespace ham::cpu {

void cast(const Tensor& x, Tensor& out) {
  convert_elements(x.raw_data(), x.dtype(), out.raw_data(), out.dtype(), x.numel());
}

}  // namespace ham::cpu

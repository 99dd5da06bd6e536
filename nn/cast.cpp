#include "nn/cast.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/cast.h"

namespace ham {

namespace {

class CastBackward final : public Node {
 public:
  DType input_dtype = DType::F32;
  std::string name() const override {
    return std::string("CastBackward(to ") + dtype_name(input_dtype) + ")";
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::cast(grads[0], input_dtype)};
  }
};

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  Tensor y = ops::cast(x, dtype);
  if (y.impl() == x.impl()) return x;
  if (is_floating(x.dtype()) && is_floating(dtype) && any_requires_grad({x})) {
    auto node = std::make_shared<CastBackward>();
    node->input_dtype = x.dtype();
    connect(node, {x}, {&y});
  }
  return y;
}

}  // namespace ham

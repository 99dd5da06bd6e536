#include "nn/matmul.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "nn/elementwise.h"
#include "nn/view.h"

namespace ham {

namespace {

// For Y = op(A) op(B) (batched or with a shared 2-D B):
//   d op(A) = dY op(B)^T,  d op(B) = op(A)^T dY, then undo each op.
class MatmulBackward final : public Node {
 public:
  Tensor a, b;
  bool trans_a = false, trans_b = false;
  std::string name() const override { return "MatmulBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dy = grads[0];
    Tensor da, db;
    if (needs_input_grad(*this, 0)) {
      // trans_a: A^T = op(A) -> dA = op(B) dY^T; else dA = dY op(B)^T
      da = trans_a ? ops::matmul(b, dy, trans_b, true) : ops::matmul(dy, b, false, !trans_b);
      if (da.shape() != a.shape()) da = ops::sum_to(da, a.shape());
    }
    if (needs_input_grad(*this, 1)) {
      if (b.dim() == 2 && dy.dim() > 2) {
        // Shared weight: fold the batch into rows, one GEMM over all of them.
        Tensor a2 = a.reshape({-1, a.size(-1)});
        Tensor dy2 = dy.reshape({-1, dy.size(-1)});
        if (trans_a) {
          HAM_CHECK(a.dim() == 2, "matmul backward: trans_a with a batched A and 2-D B");
        }
        db = trans_b ? ops::matmul(dy2, a2, true, trans_a) : ops::matmul(a2, dy2, !trans_a, false);
      } else {
        db = trans_b ? ops::matmul(dy, a, true, trans_a) : ops::matmul(a, dy, !trans_a, false);
        if (db.shape() != b.shape()) db = ops::sum_to(db, b.shape());
      }
    }
    return {da, db};
  }

  void release_saved() override {
    a = Tensor();
    b = Tensor();
  }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  Tensor y = ops::matmul(a, b, trans_a, trans_b);
  if (any_requires_grad({a, b})) {
    auto node = std::make_shared<MatmulBackward>();
    node->a = a;
    node->b = b;
    node->trans_a = trans_a;
    node->trans_b = trans_b;
    connect(node, {a, b}, {&y});
  }
  return y;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  HAM_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got ", shape_str(weight.shape()));
  HAM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", shape_str(x.shape()),
            " does not match weight ", shape_str(weight.shape()), " (last dim must be ",
            weight.size(1), ")");
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  Tensor x2 = x.dim() == 2 ? x : reshape(x, {-1, x.size(-1)});
  Tensor y = matmul(x2, weight, false, true);
  if (bias.defined()) {
    HAM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias ",
              shape_str(bias.shape()), " does not match weight ", shape_str(weight.shape()));
    y = add(y, bias);
  }
  return y.dim() == int64_t(out_shape.size()) ? y : reshape(y, out_shape);
}

}  // namespace ham

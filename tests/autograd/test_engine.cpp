#include "autograd/checkpoint.h"

#include <string>
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "nn/elementwise.h"
#include "nn/matmul.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::max_abs_diff;
using testing::randn64;

TEST(Engine, DiamondAccumulatesBothPaths) {
  // y = x*x + x  ->  dy/dx = 2x + 1
  Tensor x = randn64({3}, 1);
  Tensor y = add(mul(x, x), x);
  backward(y, Tensor::full({3}, 1.0, DType::F64));
  auto g = grad(x).to_vector<double>();
  auto xv = x.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(g[i], 2 * xv[i] + 1, 1e-12);
}

TEST(Engine, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = randn64({2}, 2);
  Tensor ones = Tensor::full({2}, 1.0, DType::F64);
  backward(mul(x, Tensor::full({2}, 3.0, DType::F64)), ones);
  backward(mul(x, Tensor::full({2}, 4.0, DType::F64)), ones);
  for (double g : grad(x).to_vector<double>()) EXPECT_DOUBLE_EQ(g, 7.0);
  clear_grad(x);
  EXPECT_FALSE(grad(x).defined());
}

TEST(Engine, HookSeesAndReplacesIntermediateGradient) {
  Tensor x = randn64({2}, 3);
  Tensor h = mul(x, Tensor::full({2}, 2.0, DType::F64));
  std::vector<double> seen;
  register_hook(h, [&](const Tensor& g) {
    seen = g.to_vector<double>();
    return ops::scaled(g, 10.0);  // replace: every upstream gradient is 10x
  });
  backward(add(h, h), Tensor::full({2}, 1.0, DType::F64));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_DOUBLE_EQ(seen[0], 2.0);  // d(h+h)/dh
  for (double g : grad(x).to_vector<double>()) EXPECT_DOUBLE_EQ(g, 40.0);
}

TEST(Engine, LeafHookRunsBeforeAccumulation) {
  Tensor x = randn64({2}, 4);
  register_hook(x, [](const Tensor& g) { return ops::scaled(g, 0.5); });
  backward(scale(x, 4.0), Tensor::full({2}, 1.0, DType::F64));
  for (double g : grad(x).to_vector<double>()) EXPECT_DOUBLE_EQ(g, 2.0);
}

TEST(Engine, RetainGradKeepsIntermediateGradient) {
  Tensor x = randn64({3}, 5);
  Tensor h = scale(x, 3.0);
  retain_grad(h);
  backward(mul(h, h), Tensor::full({3}, 1.0, DType::F64));
  auto gh = grad(h).to_vector<double>();
  auto hv = h.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gh[i], 2 * hv[i], 1e-12);
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor x = randn64({2}, 6);
  NoGradGuard guard;
  Tensor y = mul(x, x);
  EXPECT_FALSE(requires_grad(y));
  EXPECT_FALSE(grad_fn(y));
}

TEST(Engine, DetachCutsTheGraphButSharesStorage) {
  Tensor x = randn64({2}, 7);
  Tensor y = scale(x, 2.0);
  Tensor d = detach(y);
  EXPECT_FALSE(requires_grad(d));
  EXPECT_TRUE(d.shares_storage_with(y));
  // z = d * x: only the direct path to x counts.
  backward(mul(d, x), Tensor::full({2}, 1.0, DType::F64));
  auto g = grad(x).to_vector<double>();
  auto yv = y.to_vector<double>();
  for (size_t i = 0; i < 2; ++i) EXPECT_DOUBLE_EQ(g[i], yv[i]);
}

TEST(Engine, SecondBackwardWithoutKeepGraphIsAClearError) {
  Tensor x = randn64({2}, 8);
  Tensor y = mul(x, x);
  Tensor ones = Tensor::full({2}, 1.0, DType::F64);
  backward(y, ones);
  try {
    backward(y, ones);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keep_graph"), std::string::npos) << e.what();
  }
}

TEST(Engine, KeepGraphAllowsASecondBackward) {
  Tensor x = randn64({2}, 9);
  Tensor y = mul(x, x);
  Tensor ones = Tensor::full({2}, 1.0, DType::F64);
  backward({y}, {ones}, /*keep_graph=*/true);
  backward(y, ones);
  auto g = grad(x).to_vector<double>();
  auto xv = x.to_vector<double>();
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(g[i], 4 * xv[i], 1e-12);
}

TEST(Engine, NonScalarRootNeedsAGradient) {
  Tensor x = randn64({2}, 10);
  EXPECT_THROW(backward(scale(x, 2.0)), Error);
}

TEST(Engine, RootWithoutGraphIsAClearError) {
  Tensor x = Tensor::full({}, 1.0, DType::F64);
  try {
    backward(x);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not require grad"), std::string::npos);
  }
}

TEST(Engine, IntegerTensorsCannotRequireGrad) {
  EXPECT_THROW(set_requires_grad(Tensor::zeros({2}, DType::I64)), Error);
}

TEST(Engine, GradientsApiLeavesGradUntouched) {
  Tensor a = randn64({2, 3}, 11), b = randn64({3, 2}, 12);
  Tensor y = matmul(a, b);
  Tensor w = Tensor::full({2, 2}, 1.0, DType::F64);
  auto g = gradients({y}, {a, b}, {w});
  EXPECT_FALSE(grad(a).defined());
  EXPECT_FALSE(grad(b).defined());
  // dA = W B^T
  Tensor expected = ops::matmul(w, b, false, true);
  EXPECT_LT(max_abs_diff(g[0], expected), 1e-12);
}

TEST(Engine, GradientsOfUnusedInputAreZero) {
  Tensor a = randn64({2}, 13), unused = randn64({2}, 14);
  auto g = gradients({scale(a, 2.0)}, {a, unused}, {Tensor::full({2}, 1.0, DType::F64)});
  for (double v : g[1].to_vector<double>()) EXPECT_EQ(v, 0.0);
}

TEST(Checkpoint, SameGradientsAsPlainForward) {
  Tensor x = randn64({3, 4}, 15);
  Tensor w1 = randn64({4, 4}, 16), w2 = randn64({4, 4}, 17);
  auto block = [&](const std::vector<Tensor>& in) {
    Tensor h = matmul(in[0], w1);
    return std::vector<Tensor>{matmul(mul(h, h), w2)};
  };
  Tensor seed = randn64({3, 4}, 18, 1.0, false);
  backward(block({x})[0], seed);
  Tensor gx = grad(x).clone(), g1 = grad(w1).clone(), g2 = grad(w2).clone();
  clear_grad(x);
  clear_grad(w1);
  clear_grad(w2);
  Tensor y = checkpoint(block, {x})[0];
  EXPECT_TRUE(requires_grad(y));
  backward(y, seed);
  EXPECT_LT(max_abs_diff(grad(x), gx), 1e-12);
  EXPECT_LT(max_abs_diff(grad(w1), g1), 1e-12);
  EXPECT_LT(max_abs_diff(grad(w2), g2), 1e-12);
}

TEST(Checkpoint, GradcheckThroughRecompute) {
  Tensor x = randn64({2, 3}, 19), w = randn64({3, 3}, 20);
  testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return checkpoint([](const std::vector<Tensor>& v) {
          return std::vector<Tensor>{matmul(mul(v[0], v[0]), v[1])};
        }, in);
      },
      {x, w});
}

TEST(Gradcheck, DetectsAWrongBackward) {
  // A node whose backward is deliberately wrong must fail the check.
  class WrongBackward final : public Node {
   public:
    std::string name() const override { return "WrongBackward"; }
    std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {ops::scaled(g[0], 1.5)}; }
  };
  auto wrong_identity = [](const std::vector<Tensor>& in) {
    Tensor y = in[0].clone();
    connect(std::make_shared<WrongBackward>(), {in[0]}, {&y});
    return std::vector<Tensor>{y};
  };
  GradcheckResult r = gradcheck(wrong_identity, {randn64({3}, 21)});
  EXPECT_FALSE(r.passed);
  EXPECT_NEAR(r.worst_relative_error, 0.5, 1e-6);
}

}  // namespace
}  // namespace ham

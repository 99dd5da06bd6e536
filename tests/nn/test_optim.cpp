#include "nn/optim.h"

#include <cmath>

#include "autograd/node.h"
#include "tests/testing.h"

namespace ham {
namespace {

TEST(AdamW, MatchesTheUpdateWrittenOut) {
  Tensor p = Tensor::from_vector<double>({1.0, -2.0, 0.5}, {3});
  set_requires_grad(p);
  std::vector<double> g1 = {0.1, -0.3, 2.0}, g2 = {-0.2, 0.4, 1.0};
  AdamW::Options o{0.01, 0.9, 0.95, 1e-8};
  AdamW opt({ParamGroup{"all", {{"p", p}}, 0.1, 1.0}}, o);
  std::vector<double> ref = {1.0, -2.0, 0.5}, m(3, 0), v(3, 0);
  double lr = 0.01;
  int t = 0;
  for (const auto& g : {g1, g2}) {
    ++t;
    set_grad(p, Tensor::from_vector(g, {3}));
    opt.step(lr);
    for (size_t i = 0; i < 3; ++i) {
      ref[i] *= 1 - lr * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
      double mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.95, t));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  auto got = p.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], ref[i], 1e-14);
  EXPECT_EQ(opt.steps_taken(), 2);
}

TEST(AdamW, GroupsSplitMatricesFromVectors) {
  Tensor w = Tensor::zeros({2, 2}), b = Tensor::zeros({2});
  auto groups = decay_groups({{"w", w}, {"b", b}}, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].params[0].first, "w");
  EXPECT_DOUBLE_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].params[0].first, "b");
  EXPECT_DOUBLE_EQ(groups[1].weight_decay, 0.0);
}

TEST(AdamW, StateRoundTripsAndMissingKeysAreNamed) {
  Tensor p = Tensor::from_vector<double>({1.0, 2.0}, {2});
  set_requires_grad(p);
  AdamW opt({ParamGroup{"all", {{"w", p}}, 0.0, 1.0}}, {});
  set_grad(p, Tensor::from_vector<double>({1.0, 1.0}, {2}));
  opt.step(1e-3);
  auto state = opt.state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "exp_avg.w");
  AdamW other({ParamGroup{"all", {{"w", p}}, 0.0, 1.0}}, {});
  other.load_state(state, 1);
  EXPECT_EQ(other.state()[0].second.to_vector<double>(), state[0].second.to_vector<double>());
  try {
    other.load_state({state[0]}, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg_sq.w"), std::string::npos);
  }
}

TEST(CosineSchedule, WarmupPeakAndFloor) {
  CosineSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_DOUBLE_EQ(s.lr(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(1000), 0.1);
}

TEST(ClipGradNorm, ScalesToMaxNormAndReportsTheOriginal) {
  Tensor a = Tensor::zeros({2}, DType::F64), b = Tensor::zeros({1}, DType::F64);
  set_requires_grad(a);
  set_requires_grad(b);
  set_grad(a, Tensor::from_vector<double>({3.0, 0.0}, {2}));
  set_grad(b, Tensor::from_vector<double>({4.0}, {1}));
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b}, 1.0), 5.0);
  EXPECT_NEAR(grad(a).to_vector<double>()[0], 0.6, 1e-15);
  EXPECT_NEAR(grad(b).to_vector<double>()[0], 0.8, 1e-15);
  // Under the limit: untouched.
  EXPECT_NEAR(clip_grad_norm({a, b}, 10.0), 1.0, 1e-15);
  EXPECT_NEAR(grad(a).to_vector<double>()[0], 0.6, 1e-15);
}

TEST(ClipGradNorm, NonFiniteNormLeavesGradientsAlone) {
  Tensor a = Tensor::zeros({2}, DType::F64);
  set_requires_grad(a);
  set_grad(a, Tensor::from_vector<double>({NAN, 1.0}, {2}));
  EXPECT_TRUE(std::isnan(clip_grad_norm({a}, 1.0)));
  EXPECT_EQ(grad(a).to_vector<double>()[1], 1.0);
}

}  // namespace
}  // namespace ham

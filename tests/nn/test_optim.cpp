#include "nn/optim.h"

#include <array>
#include <cmath>

#include "autograd/node.h"
#include "core/ops/optim.h"
#include "core/ops/unary.h"
#include "tests/testing.h"
#ifdef HAM_WITH_CUDA
#include "cuda/optim.h"
#endif

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

#ifdef HAM_WITH_CUDA
// AdamW and squared_norm on the GPU against the CPU kernel, with fresh random params,
// moments and gradients: fp32 master weights and moments with f32 or bf16 gradients
// (the CPU reference runs in f32 on the same, widened gradient, so both are held to
// the f32 tolerance), one tensor through the op and several through one fused launch.
TEST(AdamW, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const AdamWHyper hyper{1e-3, 0.9, 0.95, 1e-8, 0.1, 7};
  for (DType grad_dtype : testing::kGpuDtypes) {
    uint64_t seed = 90;
    std::vector<cuda::AdamWTensors> list;
    std::vector<std::array<Tensor, 4>> want;  // param, grad, m, v on the CPU
    for (int64_t n : {1000, 70000, 1}) {      // 70000 spans two chunks
      Tensor param = testing::random_tensor({n}, DType::F32, gpu, seed++);
      Tensor grad = testing::random_tensor({n}, grad_dtype, gpu, seed++);
      Tensor m = testing::random_tensor({n}, DType::F32, gpu, seed++, 0.1);
      Tensor v = ops::unary(UnaryOp::Square, testing::random_tensor({n}, DType::F32, Device::cpu(),
                                                                    seed++, 0.1)).to(gpu);
      want.push_back({testing::cpu_reference(param), testing::cpu_reference(grad),
                      testing::cpu_reference(m), testing::cpu_reference(v)});
      list.push_back({param, grad, m, v});
    }
    for (auto& [p, g, m, v] : want) ops::adamw_step(p, g, m, v, hyper);
    // The op on the first tensor, the fused multi-tensor launch on the others.
    ops::adamw_step(list[0].param, list[0].grad, list[0].exp_avg, list[0].exp_avg_sq, hyper);
    cuda::adamw_step_multi_tensor({list[1], list[2]}, hyper);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string what = "adamw tensor " + std::to_string(i) + " grad " + dtype_name(grad_dtype);
      testing::expect_matches_reference(list[i].param, want[i][0], DType::F32, what + " param");
      testing::expect_matches_reference(list[i].exp_avg, want[i][2], DType::F32, what + " exp_avg");
      testing::expect_matches_reference(list[i].exp_avg_sq, want[i][3], DType::F32,
                                        what + " exp_avg_sq");
    }
    Tensor x = testing::random_tensor({300001}, grad_dtype, gpu, seed++);
    const double want_norm = ops::squared_norm(testing::cpu_reference(x));
    EXPECT_NEAR(ops::squared_norm(x), want_norm, 1e-9 * want_norm);
  }
}
#else
TEST(AdamW, GpuMatchesCpu) { HAM_SKIP_UNLESS_CUDA(); }
#endif

}  // namespace
}  // namespace ham

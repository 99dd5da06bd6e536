#include "nn/optim.h"

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/ops/cast.h"
#include "core/ops/optim.h"
#include "core/ops/unary.h"
#include "tests/error_testing.h"
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

TEST(ClipFactor, BitesAboveTheBoundOnlyAndNeverOnANonFiniteNorm) {
  EXPECT_EQ(clip_factor(4.0, 1.0), 0.25);
  EXPECT_EQ(clip_factor(1.0, 1.0), 1.0);
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_factor(0.0, 0.0), 1.0);
  EXPECT_EQ(clip_factor(NAN, 1.0), 1.0);
  EXPECT_EQ(clip_factor(INFINITY, 1.0), 1.0);
  EXPECT_EQ(clip_factor(3.0, INFINITY), 1.0);  // the trainer's clip 0: no bound
}

// AdamW::step(lr, clip_factor(norm, max)) takes the same steps as clip_grad_norm then
// step(lr), bit for bit on the CPU in f32 and f64 (both multiply each gradient by the factor
// rounded to its dtype), and leaves the gradients as backward made them. Three steps, with
// the bound biting at each, two groups of different decay, and a parameter without a
// gradient.
TEST(AdamW, GradScaleStepsAsClippingTheGradientsFirst) {
  for (DType dtype : {DType::F32, DType::F64}) {
    uint64_t seed = 900;
    auto make = [&](const Shape& shape) {
      Tensor p = testing::random_tensor(shape, dtype, Device::cpu(), seed++);
      set_requires_grad(p);
      return p;
    };
    const std::vector<Tensor> clipped = {make({3, 4}), make({5}), make({2, 2})};
    std::vector<Tensor> fused;
    for (const Tensor& p : clipped) {
      fused.push_back(p.clone());
      set_requires_grad(fused.back());
    }
    auto optimizer = [&](const std::vector<Tensor>& ps) {
      return AdamW({ParamGroup{"decay", {{"w", ps[0]}, {"idle", ps[2]}}, 0.1, 1.0},
                    ParamGroup{"no_decay", {{"b", ps[1]}}, 0.0, 1.0}},
                   AdamW::Options{1e-2, 0.9, 0.95, 1e-8});
    };
    AdamW clip_first = optimizer(clipped), scale_in_step = optimizer(fused);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < 2; ++i) {  // ps[2] never gets a gradient
        Tensor g = testing::random_tensor(clipped[i].shape(), dtype, Device::cpu(), seed++, 3.0);
        set_grad(clipped[i], g.clone());
        set_grad(fused[i], g.clone());
      }
      const double norm = gradient_norm(fused);
      EXPECT_EQ(norm, clip_grad_norm(clipped, 0.5)) << dtype_name(dtype) << " step " << step;
      ASSERT_LT(clip_factor(norm, 0.5), 1.0) << "the bound must bite";
      const Tensor unscaled = grad(fused[0]).clone();
      clip_first.step(1e-2);
      scale_in_step.step(1e-2, clip_factor(norm, 0.5));
      EXPECT_EQ(grad(fused[0]).to_vector<double>(), unscaled.to_vector<double>());
      for (size_t i = 0; i < clipped.size(); ++i) {
        EXPECT_EQ(fused[i].to_vector<double>(), clipped[i].to_vector<double>())
            << dtype_name(dtype) << " step " << step << " parameter " << i;
      }
    }
  }
}

TEST(AdamW, GradScaleThatIsNotFiniteOrIsNegativeIsNamed) {
  Tensor p = Tensor::zeros({2}), g = Tensor::full({2}, 1.0), m = Tensor::zeros({2}),
         v = Tensor::zeros({2});
  for (double bad : {-1.0, double(NAN), double(INFINITY)}) {
    AdamWHyper hyper;
    hyper.grad_scale = bad;
    testing::expect_error([&] { ops::adamw_step(p, g, m, v, hyper); },
                          {"adamw_step", "grad_scale", "finite and >= 0"});
    std::vector<Tensor> ps{p}, ms{m}, vs{v};
    testing::expect_error([&] { ops::adamw_step_multi(ps, {g}, ms, vs, hyper); },
                          {"adamw_step_multi", "grad_scale"});
  }
}

// ---- adamw_step_multi: the per-tensor update over lists, in one call ----

// One AdamW entry (param, grad, exp_avg, exp_avg_sq) of n elements with random values,
// never zeros: the second moment is a square, so positive.
struct AdamWEntry {
  Tensor param, grad, exp_avg, exp_avg_sq;
};

AdamWEntry random_entry(int64_t n, DType param_dtype, DType grad_dtype, Device device,
                        uint64_t seed) {
  const DType moments = param_dtype == DType::F64 ? DType::F64 : DType::F32;
  return {testing::random_tensor({n}, param_dtype, device, seed),
          testing::random_tensor({n}, grad_dtype, device, seed + 1),
          testing::random_tensor({n}, moments, device, seed + 2, 0.1),
          ops::unary(UnaryOp::Square, testing::random_tensor({n}, DType::F64, Device::cpu(),
                                                             seed + 3, 0.1))
              .to(moments)
              .to(device)};
}

AdamWEntry clone_entry(const AdamWEntry& e) {
  return {e.param.clone(), e.grad.clone(), e.exp_avg.clone(), e.exp_avg_sq.clone()};
}

// ops::adamw_step_multi over the entries, writing each updated param rounded into
// rounded[i] where `rounded` is not empty.
void step_multi(std::vector<AdamWEntry>& entries, const AdamWHyper& hyper,
                const std::vector<Tensor>& rounded = {}) {
  std::vector<Tensor> params, grads, exp_avg, exp_avg_sq;
  for (const AdamWEntry& e : entries) {
    params.push_back(e.param);
    grads.push_back(e.grad);
    exp_avg.push_back(e.exp_avg);
    exp_avg_sq.push_back(e.exp_avg_sq);
  }
  ops::adamw_step_multi(params, grads, exp_avg, exp_avg_sq, hyper, rounded);
}

// bf16 copies of the entries' params, NaN-poisoned: an element never written fails.
std::vector<Tensor> poisoned_copies(const std::vector<AdamWEntry>& entries) {
  std::vector<Tensor> copies;
  for (const AdamWEntry& e : entries) {
    copies.push_back(testing::poisoned(e.param.shape(), DType::BF16, e.param.device()));
  }
  return copies;
}

// Sizes 1 and odd ones (no multiple of any vector width), and one past the CUDA chunk of
// 2^16 elements.
const std::vector<int64_t> kMultiSizes = {1, 3, 7, 1000, 4099, 65537};

TEST(AdamW, MultiTensorOpEqualsPerTensorOpBitForBit) {
  for (DType dtype : {DType::F32, DType::F64}) {
    std::vector<AdamWEntry> multi, single, before;
    uint64_t seed = 500;
    for (int64_t n : kMultiSizes) {
      multi.push_back(random_entry(n, dtype, dtype, Device::cpu(), seed));
      single.push_back(clone_entry(multi.back()));
      before.push_back(clone_entry(multi.back()));
      seed += 4;
    }
    for (int64_t step = 1; step <= 3; ++step) {
      const AdamWHyper hyper{1e-2 * double(step), 0.9, 0.95, 1e-8, 0.1, step};
      step_multi(multi, hyper);
      for (AdamWEntry& e : single) {
        ops::adamw_step(e.param, e.grad, e.exp_avg, e.exp_avg_sq, hyper);
      }
    }
    for (size_t i = 0; i < multi.size(); ++i) {
      const std::string what = std::string(dtype_name(dtype)) + " entry " + std::to_string(i);
      EXPECT_EQ(multi[i].param.to_vector<double>(), single[i].param.to_vector<double>()) << what;
      EXPECT_EQ(multi[i].exp_avg.to_vector<double>(), single[i].exp_avg.to_vector<double>())
          << what;
      EXPECT_EQ(multi[i].exp_avg_sq.to_vector<double>(),
                single[i].exp_avg_sq.to_vector<double>())
          << what;
      EXPECT_NE(multi[i].param.to_vector<double>(), before[i].param.to_vector<double>())
          << what << ": not updated";
    }
  }
}

// The rounded copies of f32 params are the cast of the updated params to bf16, bit for bit,
// and asking for them changes nothing else (CPU, f32 params with f32 gradients).
TEST(AdamW, MultiTensorRoundedCopiesAreTheCastOfTheUpdate) {
  std::vector<AdamWEntry> plain, with_copies;
  uint64_t seed = 1300;
  for (int64_t n : kMultiSizes) {
    plain.push_back(random_entry(n, DType::F32, DType::F32, Device::cpu(), seed));
    with_copies.push_back(clone_entry(plain.back()));
    seed += 4;
  }
  const AdamWHyper hyper{1e-2, 0.9, 0.95, 1e-8, 0.1, 3};
  const std::vector<Tensor> copies = poisoned_copies(with_copies);
  step_multi(plain, hyper);
  step_multi(with_copies, hyper, copies);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(with_copies[i].param.to_vector<float>(), plain[i].param.to_vector<float>()) << i;
    EXPECT_EQ(copies[i].to_vector<float>(),
              ops::cast(plain[i].param, DType::BF16).to_vector<float>())
        << "rounded copy " << i;
  }
}

TEST(AdamW, MultiTensorErrorsNameTheOpTheEntryAndTheMismatch) {
  auto lists = [](std::vector<AdamWEntry> entries) {
    std::array<std::vector<Tensor>, 4> l;
    for (const AdamWEntry& e : entries) {
      l[0].push_back(e.param);
      l[1].push_back(e.grad);
      l[2].push_back(e.exp_avg);
      l[3].push_back(e.exp_avg_sq);
    }
    return l;
  };
  const AdamWHyper hyper{};
  auto run = [&](std::array<std::vector<Tensor>, 4> l, const AdamWHyper& h) {
    return [l, h]() mutable { ops::adamw_step_multi(l[0], l[1], l[2], l[3], h); };
  };
  const Device cpu = Device::cpu();
  auto ok = [&](int64_t n, uint64_t seed) {
    return random_entry(n, DType::F32, DType::F32, cpu, seed);
  };

  auto l = lists({ok(3, 1), ok(4, 2)});
  l[1].pop_back();
  testing::expect_error(run(l, hyper), {"adamw_step_multi", "2 params", "1 grads"});

  l = lists({ok(3, 1), ok(4, 2)});
  l[1][1] = Tensor::zeros({5});
  testing::expect_error(run(l, hyper),
                        {"adamw_step_multi", "grads[1]", "[5]", "params[1]", "[4]"});

  l = lists({ok(3, 1), ok(4, 2)});
  l[3][1] = Tensor::zeros({2, 2});
  testing::expect_error(run(l, hyper), {"adamw_step_multi", "exp_avg_sq[1]", "[2, 2]", "[4]"});

  l = lists({ok(3, 1), ok(4, 2), random_entry(5, DType::F64, DType::F64, cpu, 3)});
  testing::expect_error(run(l, hyper), {"adamw_step_multi", "params[2]", "f64", "params[0]",
                                        "f32"});

  l = lists({ok(3, 1), ok(4, 2)});
  l[3][0] = l[3][0].to(DType::F64);
  testing::expect_error(run(l, hyper),
                        {"adamw_step_multi", "exp_avg_sq[0]", "f64", "exp_avg[0]", "f32"});

  l = lists({ok(3, 1), ok(4, 2)});
  l[1][1] = Tensor();
  testing::expect_error(run(l, hyper), {"adamw_step_multi", "grads[1]", "undefined"});

  AdamWHyper step0 = hyper;
  step0.step = 0;
  testing::expect_error(run(lists({ok(3, 1)}), step0), {"adamw_step_multi", "step", ">= 1"});

  // The rounded copies: one a param, bf16, of f32 params.
  auto with_copies = [&](std::array<std::vector<Tensor>, 4> l, std::vector<Tensor> copies) {
    return [l, copies, hyper]() mutable {
      ops::adamw_step_multi(l[0], l[1], l[2], l[3], hyper, copies);
    };
  };
  l = lists({ok(3, 1), ok(4, 2)});
  testing::expect_error(with_copies(l, {Tensor::zeros({3}, DType::BF16)}),
                        {"adamw_step_multi", "2 params", "1 rounded"});
  testing::expect_error(
      with_copies(l, {Tensor::zeros({3}, DType::BF16), Tensor::zeros({4}, DType::F32)}),
      {"adamw_step_multi", "rounded[1]", "f32", "rounded[0]", "bf16"});
  testing::expect_error(
      with_copies(l, {Tensor::zeros({3}, DType::BF16), Tensor::zeros({5}, DType::BF16)}),
      {"adamw_step_multi", "rounded[1]", "[5]", "params[1]", "[4]"});
  testing::expect_error(
      with_copies(lists({random_entry(3, DType::F64, DType::F64, cpu, 3)}),
                  {Tensor::zeros({3}, DType::BF16)}),
      {"adamw_step_multi", "bf16 copies of f32 params", "params[0] f64"});

  // Empty lists are no update at all.
  std::vector<Tensor> none;
  ops::adamw_step_multi(none, none, none, none, hyper);
}

// AdamW::step buckets parameters by (lr, weight decay, dtypes, device) into multi-tensor
// calls; the result is the per-tensor update of every parameter with a gradient.
TEST(AdamW, StepIsThePerTensorUpdateOfEveryParameter) {
  const Device cpu = Device::cpu();
  std::vector<AdamWEntry> init;
  uint64_t seed = 900;
  // decay: two f32 and one f64; no_decay: f32 (one without a gradient); scaled: f32;
  // more_decay: same hyper-parameters as decay, so the same bucket.
  const std::vector<std::pair<int64_t, DType>> specs = {
      {1000, DType::F32}, {3, DType::F32}, {7, DType::F64}, {1, DType::F32},
      {5, DType::F32},    {4099, DType::F32}, {17, DType::F32}};
  for (auto [n, dtype] : specs) {
    init.push_back(random_entry(n, dtype, dtype, cpu, seed));
    seed += 4;
  }
  std::vector<Tensor> params;
  for (const AdamWEntry& e : init) {
    params.push_back(e.param.clone());
    set_requires_grad(params.back());
  }
  std::vector<ParamGroup> groups = {
      {"decay", {{"a", params[0]}, {"b", params[1]}, {"c", params[2]}}, 0.1, 1.0},
      {"no_decay", {{"d", params[3]}, {"e", params[4]}}, 0.0, 1.0},
      {"scaled", {{"f", params[5]}}, 0.0, 0.5},
      {"more_decay", {{"g", params[6]}}, 0.1, 1.0}};
  const size_t no_grad = 4;  // "e" never gets a gradient
  AdamW opt(groups, {0.01, 0.9, 0.95, 1e-8});
  const std::vector<double> lr_scale = {1, 1, 1, 1, 1, 0.5, 1};
  const std::vector<double> decay = {0.1, 0.1, 0.1, 0, 0, 0, 0.1};

  // The reference: ops::adamw_step on each tensor with moments starting at zero.
  std::vector<AdamWEntry> ref;
  for (const AdamWEntry& e : init) {
    ref.push_back({e.param.clone(), e.grad, Tensor::zeros(e.param.shape(), e.param.dtype()),
                   Tensor::zeros(e.param.shape(), e.param.dtype())});
  }
  for (int64_t step = 1; step <= 3; ++step) {
    const double lr = 0.01 * double(step);
    for (size_t i = 0; i < params.size(); ++i) {
      if (i == no_grad) continue;
      Tensor g = ops::unary(UnaryOp::Neg, init[i].grad);  // varies from step to step
      if (step % 2) g = init[i].grad;
      set_grad(params[i], g.clone());
      ref[i].grad = g;
      ops::adamw_step(ref[i].param, ref[i].grad, ref[i].exp_avg, ref[i].exp_avg_sq,
                      AdamWHyper{lr * lr_scale[i], 0.9, 0.95, 1e-8, decay[i], step});
    }
    opt.step(lr);
  }
  auto state = opt.state();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].to_vector<double>(), ref[i].param.to_vector<double>()) << "param " << i;
    EXPECT_EQ(state[2 * i].second.to_vector<double>(), ref[i].exp_avg.to_vector<double>())
        << "exp_avg " << i;
    EXPECT_EQ(state[2 * i + 1].second.to_vector<double>(),
              ref[i].exp_avg_sq.to_vector<double>())
        << "exp_avg_sq " << i;
  }
  EXPECT_EQ(params[no_grad].to_vector<double>(), init[no_grad].param.to_vector<double>());
}

// The CUDA multi-tensor kernel of ops::adamw_step_multi against the CPU kernel on fresh
// random params, gradients and moments: f32 params and moments with f32 or bf16 gradients,
// and bf16 params (f32 moments), unscaled and (the views' pass) with the gradients read
// scaled by grad_scale 0.37; f32 params also write their bf16 copies (compared bit for bit
// with the cast of the updated params). The update is in place, so instead of NaN-poisoned outputs
// every element of an f32 result that still equals its input where the CPU
// reference changed it counts as never written and fails the test.
TEST(AdamW, MultiTensorGpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const AdamWHyper unscaled{1e-2, 0.9, 0.95, 1e-8, 0.1, 7};
  // Every param/grad pair the CUDA kernel takes (dispatch_adamw_dtypes).
  const std::vector<std::pair<DType, DType>> combos = {
      {DType::F32, DType::F32}, {DType::F32, DType::BF16}, {DType::BF16, DType::BF16},
      {DType::BF16, DType::F32}, {DType::F64, DType::F64}};
  uint64_t seed = 7000;
  // Fresh tensors take the 16-byte pack kernel; views one element in take the
  // element-by-element one.
  for (bool offset_views : {false, true}) {
  AdamWHyper hyper = unscaled;
  hyper.grad_scale = offset_views ? 0.37 : 1.0;  // the clipping's factor, in the kernel's read
  for (auto [param_dtype, grad_dtype] : combos) {
    std::vector<AdamWEntry> on_gpu, before, want;
    for (int64_t n : {int64_t(1), int64_t(3), int64_t(1000), int64_t(65537), int64_t(70001),
                      int64_t(4099)}) {
      if (offset_views) {
        const AdamWEntry whole = random_entry(n + 1, param_dtype, grad_dtype, gpu, seed);
        on_gpu.push_back({whole.param.slice(1, n + 1), whole.grad.slice(1, n + 1),
                          whole.exp_avg.slice(1, n + 1), whole.exp_avg_sq.slice(1, n + 1)});
      } else {
        on_gpu.push_back(random_entry(n, param_dtype, grad_dtype, gpu, seed));
      }
      seed += 4;
      const AdamWEntry& e = on_gpu.back();
      before.push_back({testing::cpu_reference(e.param), testing::cpu_reference(e.grad),
                        testing::cpu_reference(e.exp_avg), testing::cpu_reference(e.exp_avg_sq)});
      want.push_back(clone_entry(before.back()));
    }
    // f32 params: their bf16 copies written in the same launch (mixed precision's parameters).
    const bool copies_too = param_dtype == DType::F32;
    const std::vector<Tensor> copies = copies_too ? poisoned_copies(on_gpu) : std::vector<Tensor>{};
    step_multi(want, hyper);            // the CPU kernel, in f32 on the widened values
    step_multi(on_gpu, hyper, copies);  // one CUDA launch
    auto unwritten = [](const Tensor& got, const Tensor& input, const Tensor& expected) {
      std::vector<double> g = got.to_vector<double>(), in = input.to_vector<double>(),
                          e = expected.to_vector<double>();
      int64_t count = 0;
      // An update of an ulp or so may round away on one side and not the other: only
      // elements the reference moves by more than 8 f32 ulps count.
      for (size_t j = 0; j < g.size(); ++j) {
        count += g[j] == in[j] && std::abs(e[j] - in[j]) > 1e-6 * std::abs(in[j]);
      }
      return count;
    };
    for (size_t i = 0; i < on_gpu.size(); ++i) {
      const std::string what = "adamw_step_multi entry " + std::to_string(i) + " param " +
                               dtype_name(param_dtype) + " grad " + dtype_name(grad_dtype) +
                               (offset_views ? " (offset views)" : "");
      const AdamWEntry& got = on_gpu[i];
      testing::expect_matches_reference(got.param, want[i].param, param_dtype, what + " param");
      testing::expect_matches_reference(got.exp_avg, want[i].exp_avg, DType::F32,
                                        what + " exp_avg");
      testing::expect_matches_reference(got.exp_avg_sq, want[i].exp_avg_sq, DType::F32,
                                        what + " exp_avg_sq");
      if (param_dtype == DType::F32) {
        EXPECT_EQ(unwritten(got.param, before[i].param, want[i].param), 0) << what;
      }
      if (copies_too) {  // exactly the GPU's own params rounded (the cast kernel's rounding)
        EXPECT_EQ(copies[i].to(Device::cpu()).to_vector<float>(),
                  ops::cast(got.param, DType::BF16).to(Device::cpu()).to_vector<float>())
            << what << " rounded copy";
      }
      EXPECT_EQ(unwritten(got.exp_avg, before[i].exp_avg, want[i].exp_avg), 0) << what;
      EXPECT_EQ(unwritten(got.exp_avg_sq, before[i].exp_avg_sq, want[i].exp_avg_sq), 0) << what;
    }
  }
  }
}

// ops::squared_norms on the CPU is the loop over squared_norm, bit for bit: mixed dtypes,
// an empty tensor; its errors name the entry and what is wrong with it.
TEST(SquaredNorms, CpuEqualsSquaredNormOfEachBitForBit) {
  std::vector<Tensor> xs;
  uint64_t seed = 300;
  for (DType dtype : {DType::F32, DType::BF16, DType::F64}) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(5000), int64_t(70001)}) {
      xs.push_back(testing::random_tensor({n}, dtype, Device::cpu(), seed++));
    }
  }
  const std::vector<double> norms = ops::squared_norms(xs);
  ASSERT_EQ(norms.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(norms[i], ops::squared_norm(xs[i])) << "tensor " << i << " " << xs[i].str();
  }
  EXPECT_EQ(norms[0], 0.0);
  EXPECT_TRUE(ops::squared_norms({}).empty());
  testing::expect_error([&] { ops::squared_norms({xs[1], Tensor()}); },
                        {"squared_norms", "tensor 1 is undefined"});
  testing::expect_error(
      [&] { ops::squared_norms({xs[1], Tensor::zeros({3}, DType::I64)}); },
      {"squared_norms", "tensor 1", "i64", "not floating"});
}

#ifdef HAM_WITH_CUDA
// AdamW and squared_norm on the GPU against the CPU kernel, with fresh random params,
// moments and gradients: fp32 master weights and moments with f32 or bf16 gradients
// (the CPU reference runs in f32 on the same, widened gradient, so both are held to
// the f32 tolerance), one tensor through the op and several through one fused launch (one
// of whose params lies off a 16-byte boundary).
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
      // The last param off a 16-byte boundary: the fused launch goes element by element.
      if (n == 1) param = testing::one_element_in(param);
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
  }
  // squared_norm: a warp's row (up to 1,024), a block's, and a block's in splits.
  uint64_t seed = 95;
  for (DType dtype : testing::kGpuDtypesAndF64) {
    for (int64_t n : {1000, 5000, 300001}) {
      Tensor x = testing::random_tensor({n}, dtype, gpu, seed++);
      const double want_norm = ops::squared_norm(testing::cpu_reference(x));
      EXPECT_NEAR(ops::squared_norm(x), want_norm, 1e-9 * want_norm)
          << dtype_name(dtype) << " n " << n;
    }
  }
}

// ops::squared_norms on the GPU (one launch a dtype, one read back) against the CPU
// kernel: fresh random tensors of the three float dtypes in one call, in an order that
// mixes them, with sizes around the 65,536-element chunk and an empty one; a NaN in one and
// an Inf in another make those two non-finite and leave the rest alone.
TEST(SquaredNorms, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  std::vector<Tensor> xs;
  uint64_t seed = 400;
  for (int64_t n : {int64_t(65537), int64_t(1), int64_t(0), int64_t(65536), int64_t(3000)}) {
    for (DType dtype : {DType::BF16, DType::F64, DType::F32}) {
      xs.push_back(testing::random_tensor({n}, dtype, gpu, seed++));
    }
  }
  Tensor with_nan = testing::random_tensor({70000}, DType::F32, Device::cpu(), seed++);
  with_nan.data<float>()[65536] = NAN;  // in the second chunk
  Tensor with_inf = testing::random_tensor({100}, DType::F32, Device::cpu(), seed++);
  with_inf.data<float>()[7] = INFINITY;
  xs.insert(xs.begin() + 4, with_nan.to(DType::BF16).to(gpu));
  xs.push_back(with_inf.to(gpu));
  const std::vector<double> norms = ops::squared_norms(xs);
  ASSERT_EQ(norms.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = ops::squared_norm(testing::cpu_reference(xs[i]));
    if (i == 4 || i + 1 == xs.size()) {
      EXPECT_FALSE(std::isfinite(norms[i])) << "tensor " << i << ": " << norms[i];
      continue;
    }
    EXPECT_NEAR(norms[i], want, 1e-12 * want) << "tensor " << i << " " << xs[i].str();
  }
  EXPECT_EQ(norms[7], 0.0) << "the empty bf16 tensor";
}
#else
TEST(AdamW, GpuMatchesCpu) { HAM_SKIP_UNLESS_CUDA(); }
TEST(SquaredNorms, GpuMatchesCpu) { HAM_SKIP_UNLESS_CUDA(); }
#endif

}  // namespace
}  // namespace ham

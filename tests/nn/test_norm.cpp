#include "nn/norm.h"

#include <omp.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>

#include "autograd/engine.h"
#include "core/ops/norm.h"
#ifdef HAM_WITH_CUDA
#include "cuda/norm.h"
#endif
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::max_abs_diff;
using testing::randn64;

struct NormCase {
  Shape shape;
  bool weight;
};

std::string case_name(const NormCase& c) {
  std::ostringstream out;
  for (size_t i = 0; i < c.shape.size(); ++i) out << (i ? "x" : "") << c.shape[i];
  out << (c.weight ? "_weight" : "_noweight");
  return out.str();
}

void PrintTo(const NormCase& c, std::ostream* os) { *os << case_name(c); }

// Straight from the definitions, row by row (gate and weight optional).
std::vector<double> naive_rms_norm(const Tensor& x, const Tensor& gate, const Tensor& weight,
                                   double eps) {
  int64_t d = x.size(-1), rows = x.numel() / d;
  auto xs = x.to_vector<double>();
  auto gs = gate.defined() ? gate.to_vector<double>() : std::vector<double>();
  auto ws = weight.defined() ? weight.to_vector<double>() : std::vector<double>();
  std::vector<double> y(xs.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < d; ++j) ms += xs[size_t(r * d + j)] * xs[size_t(r * d + j)] / double(d);
    for (int64_t j = 0; j < d; ++j) {
      size_t i = size_t(r * d + j);
      y[i] = xs[i] / std::sqrt(ms + eps);
      if (!ws.empty()) y[i] *= ws[size_t(j)];
      if (!gs.empty()) y[i] *= gs[i] / (1 + std::exp(-gs[i]));
    }
  }
  return y;
}

std::vector<double> naive_l2_norm(const Tensor& x, double eps) {
  int64_t d = x.size(-1), rows = x.numel() / d;
  auto xs = x.to_vector<double>();
  std::vector<double> y(xs.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += xs[size_t(r * d + j)] * xs[size_t(r * d + j)];
    for (int64_t j = 0; j < d; ++j) y[size_t(r * d + j)] = xs[size_t(r * d + j)] / std::sqrt(ss + eps);
  }
  return y;
}

void expect_values_near(const Tensor& y, const std::vector<double>& expected, double tol) {
  auto got = y.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "at " << i;
}

class Norm : public ::testing::TestWithParam<NormCase> {};

TEST_P(Norm, RmsNormGradcheck) {
  const NormCase& c = GetParam();
  Tensor x = randn64(c.shape, 31);
  Tensor w = c.weight ? randn64({c.shape.back()}, 32) : Tensor();
  expect_gradcheck(
      [](const std::vector<Tensor>& v) { return std::vector{rms_norm(v[0], v[1])}; }, {x, w});
}

TEST_P(Norm, GatedRmsNormGradcheck) {
  const NormCase& c = GetParam();
  Tensor x = randn64(c.shape, 33), gate = randn64(c.shape, 34, 2.0);
  Tensor w = c.weight ? randn64({c.shape.back()}, 35) : Tensor();
  expect_gradcheck(
      [](const std::vector<Tensor>& v) { return std::vector{gated_rms_norm(v[0], v[1], v[2])}; },
      {x, gate, w});
}

TEST_P(Norm, L2NormGradcheck) {
  const NormCase& c = GetParam();
  Tensor x = randn64(c.shape, 36);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{l2_norm(v[0])}; }, {x});
}

TEST_P(Norm, ForwardMatchesNaiveFormulas) {
  const NormCase& c = GetParam();
  Tensor x = randn64(c.shape, 37, 1.0, false), gate = randn64(c.shape, 38, 2.0, false);
  Tensor w = c.weight ? randn64({c.shape.back()}, 39, 1.0, false) : Tensor();
  for (double eps : {1e-6, 0.5}) {
    SCOPED_TRACE(eps);
    expect_values_near(rms_norm(x, w, eps), naive_rms_norm(x, Tensor(), w, eps), 1e-12);
    expect_values_near(gated_rms_norm(x, gate, w, eps), naive_rms_norm(x, gate, w, eps), 1e-12);
    expect_values_near(l2_norm(x, eps), naive_l2_norm(x, eps), 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Norm,
    ::testing::Values(NormCase{{2, 3, 8}, true}, NormCase{{2, 3, 8}, false},
                      NormCase{{4, 5}, true}, NormCase{{7}, true},   // a single row
                      NormCase{{1, 6}, true}, NormCase{{1, 1}, true},  // T = 1, [1, 1]
                      NormCase{{5, 1}, false}, NormCase{{3, 1, 4}, true}),
    [](const ::testing::TestParamInfo<NormCase>& info) { return case_name(info.param); });

// Big enough for the parallel paths; gradcheck on a sample of elements.
TEST(Norm, LargeGradcheckSampled) {
  GradcheckOptions options;
  options.max_elements_per_input = 25;
  Shape shape{300, 130};  // four 64-row backward tasks and a partial one; rows end in a tail packet
  Tensor x = randn64(shape, 41), gate = randn64(shape, 42), w = randn64({130}, 43);
  expect_gradcheck(
      [](const std::vector<Tensor>& v) { return std::vector{gated_rms_norm(v[0], v[1], v[2])}; },
      {x, gate, w}, options);
  expect_gradcheck(
      [](const std::vector<Tensor>& v) { return std::vector{rms_norm(v[0], v[1])}; }, {x, w},
      options);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{l2_norm(v[0])}; }, {x},
                   options);
}

// Forward outputs and input gradients (backward with dy = cos(index)) for one op.
std::vector<Tensor> forward_and_grads(const std::function<Tensor(std::vector<Tensor>&)>& op,
                                      std::vector<Tensor> inputs) {
  for (Tensor& t : inputs) {
    t = t.clone();
    set_requires_grad(t);
  }
  Tensor y = op(inputs);
  std::vector<double> dy(size_t(y.numel()));
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::cos(double(i));
  backward(y, Tensor::from_vector(dy, y.shape()).to(y.dtype()));
  std::vector<Tensor> out{y};
  for (const Tensor& t : inputs) out.push_back(grad(t));
  return out;
}

const std::function<Tensor(std::vector<Tensor>&)> kOps[] = {
    [](std::vector<Tensor>& v) { return rms_norm(v[0], v[2]); },
    [](std::vector<Tensor>& v) { return gated_rms_norm(v[0], v[1], v[2]); },
    [](std::vector<Tensor>& v) { return l2_norm(v[0]); },
};

TEST(Norm, F32AgreesWithF64) {
  Tensor x = randn64({64, 512}, 44, 1.0, false), gate = randn64({64, 512}, 45, 1.0, false);
  Tensor w = randn64({512}, 46, 1.0, false);
  for (size_t k = 0; k < std::size(kOps); ++k) {
    SCOPED_TRACE(k);
    auto r64 = forward_and_grads(kOps[k], {x, gate, w});
    auto r32 = forward_and_grads(kOps[k], {x.to(DType::F32), gate.to(DType::F32), w.to(DType::F32)});
    for (size_t i = 0; i < r64.size(); ++i) {
      ASSERT_EQ(r64[i].defined(), r32[i].defined());
      if (!r64[i].defined()) continue;
      EXPECT_EQ(r32[i].dtype(), DType::F32);
      // dweight sums 64 rows, so allow for that.
      EXPECT_LT(max_abs_diff(r32[i], r64[i]), 2e-4) << "output " << i;
    }
  }
}

TEST(Norm, ResultDoesNotDependOnThreadCount) {
  Tensor x = randn64({512, 96}, 47, 1.0, false).to(DType::F32);
  Tensor gate = randn64({512, 96}, 48, 1.0, false).to(DType::F32);
  Tensor w = randn64({96}, 49, 1.0, false).to(DType::F32);
  int saved = omp_get_max_threads();
  for (size_t k = 0; k < std::size(kOps); ++k) {
    omp_set_num_threads(1);
    auto one = forward_and_grads(kOps[k], {x, gate, w});
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      auto many = forward_and_grads(kOps[k], {x, gate, w});
      for (size_t i = 0; i < one.size(); ++i) {
        if (one[i].defined()) {
          EXPECT_EQ(many[i].to_vector<float>(), one[i].to_vector<float>()) << k << " " << i;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(Norm, NoWeightGradientWhenWeightIsConstant) {
  Tensor x = randn64({3, 4}, 50), w = randn64({4}, 51, 1.0, false);
  backward(rms_norm(x, w), Tensor::full({3, 4}, 1.0, DType::F64));
  EXPECT_TRUE(grad(x).defined());
  EXPECT_FALSE(grad(w).defined());
}

using testing::expect_error;

TEST(Norm, BadInputErrorsNameOpAndShapes) {
  Tensor x = Tensor::zeros({2, 4}, DType::F64);
  Tensor w5 = Tensor::full({5}, 1.0, DType::F64);
  expect_error([&] { rms_norm(x, w5); }, {"rms_norm", "weight", "[5]", "[2, 4]"});
  expect_error([&] { rms_norm(x, Tensor::full({2, 4}, 1.0, DType::F64)); },
               {"rms_norm", "[2, 4]"});
  expect_error([&] { rms_norm(x, Tensor::full({4}, 1.0, DType::F32)); },
               {"rms_norm", "f32[4]", "f64[2, 4]"});
  expect_error([&] { gated_rms_norm(x, Tensor::zeros({2, 3}, DType::F64), Tensor()); },
               {"gated_rms_norm", "gate", "[2, 3]", "[2, 4]"});
  expect_error([&] { gated_rms_norm(x, x, w5); }, {"gated_rms_norm", "[5]", "[2, 4]"});
  expect_error([&] { rms_norm(Tensor::scalar(1.0, DType::F64), Tensor()); }, {"rms_norm", "[]"});
  expect_error([&] { l2_norm(Tensor::scalar(1.0, DType::F64)); }, {"l2_norm", "[]"});
  expect_error([&] { l2_norm(Tensor::arange(4)); }, {"l2_norm", "i64[4]"});
}

// The CUDA kernels against the CPU reference: fresh random inputs, NaN-poisoned outputs,
// f32, bf16 and f64, every gradient; rows short (a warp each) and long (a block each), of
// lengths that move as 16-byte packs (64, 2048) and that do not (61, and 1031: in f64 too).
// Random GPU inputs of rms_norm (gate and weight when asked for) and the CPU's forward
// and backward on copies of them, the reference the GPU kernels are checked against.
struct RmsNormCase {
  Tensor x, gate, weight, dy;
  ops::NormResult want;
  ops::RmsNormGrads want_grads;

  RmsNormCase(const Shape& shape, DType dtype, bool gated, bool weighted, uint64_t& seed) {
    const Device gpu = Device::cuda();
    x = testing::random_tensor(shape, dtype, gpu, seed++);
    gate = gated ? testing::random_tensor(shape, dtype, gpu, seed++) : Tensor();
    weight = weighted ? testing::random_tensor({shape.back()}, dtype, gpu, seed++, 0.5, 1.0)
                      : Tensor();
    dy = testing::random_tensor(shape, dtype, gpu, seed++);
    Tensor x_cpu = testing::cpu_reference(x), gate_cpu = testing::cpu_reference(gate);
    Tensor weight_cpu = testing::cpu_reference(weight);
    want = ops::rms_norm("rms_norm", x_cpu, gate_cpu, weight_cpu, 1e-6);
    want_grads = ops::rms_norm_backward(testing::cpu_reference(dy), x_cpu, gate_cpu, weight_cpu,
                                        want.rstd, true, true, true);
  }
};

TEST(Norm, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 30;
    for (int64_t d : {64, 2048, 61, 1031}) {
      for (bool gated : {false, true}) {
        for (bool weighted : {false, true}) {
          const std::string what = "rms_norm d=" + std::to_string(d) + (gated ? " gated" : "") +
                                   (weighted ? " weighted" : "");
          const Shape shape{3, 37, d};
          const RmsNormCase c(shape, dtype, gated, weighted, seed);
          const Tensor &x = c.x, &gate = c.gate, &weight = c.weight, &dy = c.dy;
          const ops::NormResult& want = c.want;
          const ops::RmsNormGrads& want_grads = c.want_grads;

          Tensor y = testing::poisoned(shape, dtype, gpu);
          Tensor rstd = testing::poisoned({3 * 37}, dtype, gpu);
          rms_norm_kernels()(gpu, x, gate, weight, 1e-6, y, rstd);
          testing::expect_matches_reference(y, want.y, dtype, what + " y");
          testing::expect_matches_reference(rstd, want.rstd, dtype, what + " rstd");

          Tensor dx = testing::poisoned(shape, dtype, gpu);
          Tensor dgate = gated ? testing::poisoned(shape, dtype, gpu) : Tensor();
          Tensor dweight = weighted ? testing::poisoned({d}, dtype, gpu) : Tensor();
          rms_norm_backward_kernels()(gpu, dy, x, gate, weight, rstd, dx, dgate, dweight);
          testing::expect_matches_reference(dx, want_grads.dx, dtype, what + " dx");
          if (gated) testing::expect_matches_reference(dgate, want_grads.dgate, dtype, what + " dgate");
          if (weighted) {
            testing::expect_matches_reference(dweight, want_grads.dweight, dtype, what + " dweight");
          }
        }
      }
      const std::string what = "l2_norm d=" + std::to_string(d);
      Tensor x = testing::random_tensor({5, 9, d}, dtype, gpu, seed++);
      Tensor dy = testing::random_tensor({5, 9, d}, dtype, gpu, seed++);
      auto want = ops::l2_norm(testing::cpu_reference(x), 1e-6);
      Tensor want_dx = ops::l2_norm_backward(testing::cpu_reference(dy), testing::cpu_reference(x),
                                             want.rstd);
      Tensor y = testing::poisoned(x.shape(), dtype, gpu);
      Tensor rstd = testing::poisoned({45}, dtype, gpu);
      l2_norm_kernels()(gpu, x, 1e-6, y, rstd);
      testing::expect_matches_reference(y, want.y, dtype, what + " y");
      testing::expect_matches_reference(rstd, want.rstd, dtype, what + " rstd");
      Tensor dx = testing::poisoned(x.shape(), dtype, gpu);
      l2_norm_backward_kernels()(gpu, dy, x, rstd, dx);
      testing::expect_matches_reference(dx, want_dx, dtype, what + " dx");
    }
    // Rows of one element: dweight sums a single column. (dx, dy * w * rstd * eps / (x^2 +
    // eps), is what is left after cancellation, too small to compare relatively.)
    const RmsNormCase c(Shape{3, 37, 1}, dtype, true, true, seed);
    Tensor y = testing::poisoned({3, 37, 1}, dtype, gpu);
    Tensor rstd = testing::poisoned({3 * 37}, dtype, gpu);
    rms_norm_kernels()(gpu, c.x, c.gate, c.weight, 1e-6, y, rstd);
    testing::expect_matches_reference(y, c.want.y, dtype, "rms_norm d=1 y");
    Tensor dx = testing::poisoned({3, 37, 1}, dtype, gpu);
    Tensor dgate = testing::poisoned({3, 37, 1}, dtype, gpu);
    Tensor dweight = testing::poisoned({1}, dtype, gpu);
    rms_norm_backward_kernels()(gpu, c.dy, c.x, c.gate, c.weight, rstd, dx, dgate, dweight);
    testing::expect_matches_reference(dgate, c.want_grads.dgate, dtype, "rms_norm d=1 dgate");
    testing::expect_matches_reference(dweight, c.want_grads.dweight, dtype, "rms_norm d=1 dweight");
  }
}

// The backward's row groups (at most 2048 warps or 512 blocks) take several rows each when
// there are more rows, keep dweight's sums in registers for rows 256 to 8192 long, and fall
// back to a second pass beyond; dweight alone (no dx) takes the same path. (Shorter rows
// take the second pass too: Norm.GpuMatchesCpu's d = 64 and 61.) The shapes give a thread
// 1 to 8 packs of a row (bf16 and f32; up to 2 the next row's are loaded ahead) in warp rows
// (up to 1024) and block rows, and groups of 1 to 3 rows; each with a gate and without one
// (the plain RMSNorm of every block). Rows of 256 with x off a 16-byte boundary move one
// element at a time, 8 a thread of a warp: the only rows that reach those warp kernels.
TEST(Norm, GpuBackwardRowGroupsMatchCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  uint64_t seed = 90;
  auto check = [&](const Shape& shape, DType dtype, bool gated, bool want_dx, bool unaligned) {
    const std::string what = "rms_norm backward " + shape_str(shape) + " " +
                             dtype_name(dtype) + (gated ? " gated" : "") +
                             (want_dx ? "" : " dweight only") + (unaligned ? " x unaligned" : "");
    const int64_t d = shape.back();
    const RmsNormCase c(shape, dtype, gated, true, seed);
    const auto& want_grads = c.want_grads;
    const Tensor x = unaligned ? testing::one_element_in(c.x) : c.x;
    Tensor y = testing::poisoned(shape, dtype, gpu);
    Tensor rstd = testing::poisoned({shape[0]}, dtype, gpu);
    rms_norm_kernels()(gpu, x, c.gate, c.weight, 1e-6, y, rstd);
    Tensor dx = want_dx ? testing::poisoned(shape, dtype, gpu) : Tensor();
    Tensor dgate = want_dx && gated ? testing::poisoned(shape, dtype, gpu) : Tensor();
    Tensor dweight = testing::poisoned({d}, dtype, gpu);
    rms_norm_backward_kernels()(gpu, c.dy, x, c.gate, c.weight, rstd, dx, dgate, dweight);
    testing::expect_matches_reference(dweight, want_grads.dweight, dtype, what + " dweight");
    if (want_dx) {
      testing::expect_matches_reference(dx, want_grads.dx, dtype, what + " dx");
      if (gated) {
        testing::expect_matches_reference(dgate, want_grads.dgate, dtype, what + " dgate");
      }
    }
  };
  for (DType dtype : testing::kGpuDtypes) {
    for (const Shape& shape : {Shape{2600, 256}, Shape{4500, 512}, Shape{700, 1024},
                               Shape{530, 2048}, Shape{1100, 4096}, Shape{5, 6144},
                               Shape{3, 9000}}) {
      for (auto [gated, want_dx] : {std::pair{true, true}, std::pair{true, false},
                                    std::pair{false, true}}) {
        check(shape, dtype, gated, want_dx, false);
      }
    }
    for (bool gated : {true, false}) check(Shape{70, 256}, dtype, gated, true, true);
  }
  // f64, packs of 2: 4 and 8 a thread in warp rows and in block rows.
  for (const Shape& shape : {Shape{40, 256}, Shape{30, 512}, Shape{9, 2048}, Shape{5, 4096}}) {
    for (bool gated : {true, false}) check(shape, DType::F64, gated, true, false);
  }
  for (bool gated : {true, false}) check(Shape{70, 256}, DType::F64, gated, true, true);
}

// The forward's row groups (packed rows of 256 to 8192 elements) keep a row in registers
// and, with one or two packs a thread, load the next row's ahead. Capped at 7 groups, each
// takes many rows, so the loads ahead are used; the shapes give a thread 1, 2, 4 and 8
// packs (bf16, f32 and f64), with and without gate and weight.
TEST(Norm, GpuForwardRowGroupsMatchCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting groups(&cuda::set_rms_norm_row_groups, int64_t{0});
  const Device gpu = Device::cuda();
  uint64_t seed = 120;
  for (DType dtype : testing::kGpuDtypesAndF64) {
    for (const Shape& shape : {Shape{300, 256}, Shape{45, 512}, Shape{53, 2048},
                               Shape{22, 4096}, Shape{9, 8192}}) {
      for (int64_t groups : {0, 7}) {
        for (bool gated : {false, true}) {
          const bool weighted = !gated || groups == 7;
          const std::string what = "rms_norm forward " + shape_str(shape) + " " +
                                   dtype_name(dtype) + " groups " + std::to_string(groups) +
                                   (gated ? " gated" : "") + (weighted ? " weighted" : "");
          cuda::set_rms_norm_row_groups(groups);
          const RmsNormCase c(shape, dtype, gated, weighted, seed);
          Tensor y = testing::poisoned(shape, dtype, gpu);
          Tensor rstd = testing::poisoned({shape[0]}, dtype, gpu);
          rms_norm_kernels()(gpu, c.x, c.gate, c.weight, 1e-6, y, rstd);
          testing::expect_matches_reference(y, c.want.y, dtype, what + " y");
          testing::expect_matches_reference(rstd, c.want.rstd, dtype, what + " rstd");
        }
      }
    }
  }
  testing::expect_error([] { cuda::set_rms_norm_row_groups(-1); },
                        {"set_rms_norm_row_groups", "-1"});
#endif
}

}  // namespace
}  // namespace ham

#include "nn/unary.h"

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/engine.h"
#include "core/ops/unary.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::max_abs_diff;
using testing::randn64;
using testing::uniform64;

using UnaryFn = Tensor (*)(const Tensor&);

struct UnaryCase {
  const char* name;
  UnaryFn fn;
  std::function<double(double)> reference;  // the textbook formula, straight from <cmath>
  bool positive_domain;                     // log and sqrt need x > 0
};

void PrintTo(const UnaryCase& c, std::ostream* os) { *os << c.name; }

const UnaryCase kCases[] = {
    {"exp", &exp, [](double v) { return std::exp(v); }, false},
    {"log", &log, [](double v) { return std::log(v); }, true},
    {"sigmoid", &sigmoid, [](double v) { return 1.0 / (1.0 + std::exp(-v)); }, false},
    {"silu", &silu, [](double v) { return v / (1.0 + std::exp(-v)); }, false},
    {"softplus", &softplus, [](double v) { return std::log(1.0 + std::exp(v)); }, false},
    {"gelu", &gelu, [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }, false},
    {"tanh", &tanh, [](double v) { return std::tanh(v); }, false},
    {"neg", &neg, [](double v) { return -v; }, false},
    {"square", &square, [](double v) { return v * v; }, false},
    {"sqrt", &sqrt, [](double v) { return std::sqrt(v); }, true},
    {"relu", &relu, [](double v) { return v > 0 ? v : 0.0; }, false},
};

Tensor input_for(const UnaryCase& c, const Shape& shape, uint64_t seed) {
  return c.positive_domain ? uniform64(shape, seed, 0.3, 3.0) : randn64(shape, seed, 1.5);
}

class UnaryOps : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(UnaryOps, GradcheckOverShapes) {
  const UnaryCase& c = GetParam();
  UnaryFn fn = c.fn;
  const Shape shapes[] = {{3, 4}, {2, 1, 5}, {1}, {1, 1}, {}};
  uint64_t seed = 100;
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape_str(shape));
    expect_gradcheck([fn](const std::vector<Tensor>& x) { return std::vector{fn(x[0])}; },
                     {input_for(c, shape, ++seed)});
  }
}

TEST_P(UnaryOps, ForwardMatchesNaiveFormula) {
  const UnaryCase& c = GetParam();
  Tensor x = input_for(c, {4, 6}, 7);
  std::vector<double> xs = x.to_vector<double>(), ys = c.fn(x).to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(ys[i], c.reference(xs[i]), 1e-12 * (1 + std::abs(ys[i]))) << "x = " << xs[i];
  }
}

TEST_P(UnaryOps, F32AgreesWithF64) {
  const UnaryCase& c = GetParam();
  // Big enough that the kernels take their parallel path.
  Tensor x64 = input_for(c, {64, 1024}, 9);
  Tensor y64 = c.fn(x64);
  Tensor y32 = c.fn(x64.to(DType::F32));
  EXPECT_EQ(y32.dtype(), DType::F32);
  auto a = y32.to_vector<double>(), b = y64.to_vector<double>();
  double worst = 0;  // relative to 1 + |y|
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
  EXPECT_LT(worst, 1e-5) << c.name;
}

TEST_P(UnaryOps, BackwardF32AgreesWithF64) {
  const UnaryCase& c = GetParam();
  Tensor x64 = input_for(c, {3, 50}, 10);
  Tensor x32 = x64.to(DType::F32);
  set_requires_grad(x32);
  Tensor y64 = c.fn(x64), y32 = c.fn(x32);
  backward(y64, Tensor::full(y64.shape(), 1.0, DType::F64));  // dx = f'(x)
  backward(y32, Tensor::full(y32.shape(), 1.0, DType::F32));
  EXPECT_LT(max_abs_diff(grad(x32), grad(x64)), 1e-4) << c.name;
}

INSTANTIATE_TEST_SUITE_P(All, UnaryOps, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<UnaryCase>& info) {
                           return std::string(info.param.name);
                         });

// Where e^x overflows, the stable forms must stay finite and exact.
TEST(Unary, StableAtLargeMagnitudes) {
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = Tensor::from_vector<double>({-1000, -100, 100, 1000}, {4}).to(dtype);
    set_requires_grad(x);
    auto sig = sigmoid(x).to_vector<double>();
    auto sp = softplus(x).to_vector<double>();
    auto si = silu(x).to_vector<double>();
    for (double v : sig) EXPECT_TRUE(std::isfinite(v));
    EXPECT_NEAR(sig[0], 0.0, 1e-40);
    EXPECT_NEAR(sig[1], std::exp(-100.0), 1e-45);
    EXPECT_EQ(sig[2], 1.0);
    EXPECT_EQ(sig[3], 1.0);
    EXPECT_NEAR(sp[0], 0.0, 1e-40);
    EXPECT_NEAR(sp[1], std::exp(-100.0), 1e-45);
    EXPECT_EQ(sp[2], 100.0);
    EXPECT_EQ(sp[3], 1000.0);
    EXPECT_NEAR(si[0], 0.0, 1e-30);
    EXPECT_EQ(si[3], 1000.0);
    for (UnaryFn fn : {&sigmoid, &softplus, &silu, &gelu, &tanh}) {
      Tensor y = fn(x);
      clear_grad(x);
      backward(y, Tensor::full(y.shape(), 1.0, dtype));
      for (double g : grad(x).to_vector<double>()) EXPECT_TRUE(std::isfinite(g));
    }
    // softplus' = sigmoid: 0 far left, 1 far right.
    clear_grad(x);
    backward(softplus(x), Tensor::full({4}, 1.0, dtype));
    auto g = grad(x).to_vector<double>();
    EXPECT_NEAR(g[0], 0.0, 1e-30);
    EXPECT_EQ(g[3], 1.0);
  }
}

// The ops whose CPU kernels run on Eigen packets (core/cpu/packets.h), with an input range
// where the output is a normal float, and the error allowed, in ulps of the result.
struct PacketCase {
  UnaryOp op;
  double lo, hi;
  double max_ulps_forward, max_ulps_backward;
  // The backward's error is in ulps of max(|dx|, floor |dy|): silu' crosses 0 at x = -1.28,
  // where its two terms cancel in any precision.
  double backward_floor;
};
const PacketCase kPacketCases[] = {
    {UnaryOp::Exp, -100, 80, 1.5, 1, 0},   {UnaryOp::Log, 1e-30, 1e30, 1, 1, 0},
    {UnaryOp::Sigmoid, -100, 40, 3, 2, 0}, {UnaryOp::Silu, -100, 80, 3, 3, 1},
    {UnaryOp::Softplus, -100, 80, 3, 3, 0}, {UnaryOp::Tanh, -20, 20, 4, 2, 0},
};

// Spacing of f32 numbers at |y|: the unit of the errors below.
double f32_ulp(double y) {
  float f = std::abs(float(y));
  return double(std::nextafter(f, INFINITY) - f);
}

// f32 results against the f64 kernel's: within a few ulps across each function's range,
// forward and backward, on a sweep of inputs (log-spaced for log). The bounds sit above
// what Eigen's packets measured (exp 1.16 ulps, sigmoid 2.23, silu 2.40, softplus 1.89,
// tanh 3.75; backwards up to 2.65); glibc's scalar functions, which these replaced,
// measured exp 0.50, sigmoid 1.74, silu 2.85, tanh 1.89 and silu's backward 15.3.
TEST(Unary, PacketKernelsAreWithinUlpsOfF64) {
  for (const PacketCase& c : kPacketCases) {
    SCOPED_TRACE(unary_op_name(c.op));
    std::vector<double> xs;
    const bool log_spaced = c.lo > 0;
    for (int i = 0; i <= 20000; ++i) {
      double t = i / 20000.0;
      xs.push_back(log_spaced ? c.lo * std::pow(c.hi / c.lo, t) : c.lo + (c.hi - c.lo) * t);
    }
    for (double& v : xs) v = double(float(v));  // the f32 inputs, exactly
    Tensor x64 = Tensor::from_vector(xs, {int64_t(xs.size())});
    Tensor x32 = x64.to(DType::F32);
    Tensor dy64 = randn64(x64.shape(), 3).to(DType::F32).to(DType::F64);
    Tensor dy32 = dy64.to(DType::F32);
    const bool reads_output = unary_saves(c.op) == UnarySaved::Output;
    Tensor y64 = ops::unary(c.op, x64), y32 = ops::unary(c.op, x32);
    // The backwards read the same f32 saved tensor: f32's y rounds 1 - y near y = 1.
    Tensor dx64 = ops::unary_backward(c.op, dy64, reads_output ? y32.to(DType::F64) : x64);
    Tensor dx32 = ops::unary_backward(c.op, dy32, reads_output ? y32 : x32);
    const auto dys = dy64.to_vector<double>();
    for (auto [got, want, bound, floor, what] :
         {std::tuple{y32, y64, c.max_ulps_forward, 0.0, "forward"},
          std::tuple{dx32, dx64, c.max_ulps_backward, c.backward_floor, "backward"}}) {
      auto a = got.to_vector<double>(), b = want.to_vector<double>();
      double worst = 0, worst_at = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        double scale = std::max(std::abs(b[i]), floor * std::abs(dys[i]));
        if (scale < 1e-30) continue;  // below f32's normal range
        double ulps = std::abs(a[i] - b[i]) / f32_ulp(scale);
        if (ulps > worst) worst = ulps, worst_at = xs[i];
      }
      EXPECT_LE(worst, bound) << what << ": worst at x = " << worst_at;
    }
  }
}

// An element's result is the same bits wherever it sits: at each offset within a packet,
// in the padded tail, and whether the loop ran on one thread or several.
TEST(Unary, PacketKernelsGiveTheSameBitsAtEveryPosition) {
  const Tensor values = randn64({40000}, 5, 6.0);
  for (DType dtype : {DType::F32, DType::F64}) {
    for (const PacketCase& c : kPacketCases) {
      SCOPED_TRACE(std::string(unary_op_name(c.op)) + " " + dtype_name(dtype));
      Tensor x = c.op == UnaryOp::Log ? ops::unary(UnaryOp::Exp, values) : values;
      x = x.to(dtype);
      Tensor whole = ops::unary(c.op, x);  // parallel: 40000 elements
      Tensor whole_dx = ops::unary_backward(c.op, x, x);
      auto at = [](const Tensor& t, int64_t start, int64_t length) {
        return t.slice(start, start + length).to_vector<double>();  // exact: f32 and f64 fit
      };
      for (int64_t start : {0, 1, 3, 5, 7, 9}) {
        for (int64_t length : {1, 2, 3, 7, 8, 9, 13}) {
          Tensor part = x.slice(start, start + length).clone();
          EXPECT_EQ(ops::unary(c.op, part).to_vector<double>(), at(whole, start, length))
              << "start " << start << " length " << length;
          EXPECT_EQ(ops::unary_backward(c.op, part, part).to_vector<double>(),
                    at(whole_dx, start, length))
              << "backward, start " << start << " length " << length;
        }
      }
    }
  }
}

// NaN stays NaN (the trainer's non-finite check relies on it), and the infinities give the
// functions' limits.
TEST(Unary, PacketKernelsAtNonFiniteInputs) {
  const double inf = INFINITY, nan = NAN;
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Ten values, so that one packet is whole and the rest is a padded tail.
    Tensor x = Tensor::from_vector<double>({nan, inf, -inf, 0, nan, 1, -inf, inf, nan, 2}, {10})
                   .to(dtype);
    auto run = [&](UnaryOp op) { return ops::unary(op, x).to_vector<double>(); };
    auto exp_y = run(UnaryOp::Exp), sig = run(UnaryOp::Sigmoid), sp = run(UnaryOp::Softplus);
    auto silu_y = run(UnaryOp::Silu), tanh_y = run(UnaryOp::Tanh);
    for (int i : {0, 4, 8}) {
      EXPECT_TRUE(std::isnan(exp_y[size_t(i)]) && std::isnan(sig[size_t(i)]) &&
                  std::isnan(sp[size_t(i)]) && std::isnan(silu_y[size_t(i)]) &&
                  std::isnan(tanh_y[size_t(i)]))
          << "NaN at " << i;
    }
    EXPECT_EQ(tanh_y[1], 1.0);
    EXPECT_EQ(tanh_y[2], -1.0);
    EXPECT_EQ(tanh_y[3], 0.0);
    EXPECT_EQ(exp_y[1], inf);
    EXPECT_EQ(exp_y[2], 0.0);
    EXPECT_EQ(exp_y[3], 1.0);
    EXPECT_EQ(sig[1], 1.0);
    EXPECT_EQ(sig[2], 0.0);
    EXPECT_EQ(sig[3], 0.5);
    EXPECT_EQ(sp[7], inf);
    EXPECT_EQ(sp[6], 0.0);
    EXPECT_EQ(silu_y[7], inf);
    Tensor logs = ops::unary(UnaryOp::Log,
                             Tensor::from_vector<double>({0, -1, inf, nan, 1}, {5}).to(dtype));
    auto l = logs.to_vector<double>();
    EXPECT_EQ(l[0], -inf);
    EXPECT_TRUE(std::isnan(l[1]));
    EXPECT_EQ(l[2], inf);
    EXPECT_TRUE(std::isnan(l[3]));
    EXPECT_EQ(l[4], 0.0);
  }
}

TEST(Unary, SavesOutputWithoutKeepingTheGraphAlive) {
  // exp saves y for its backward; it must hold a detached view, not y itself.
  Tensor x = randn64({3}, 1);
  std::weak_ptr<Node> node;
  {
    Tensor y = exp(x);
    node = grad_fn(y);
    ASSERT_FALSE(node.expired());
    EXPECT_EQ(node.lock()->name(), "expBackward");
  }
  EXPECT_TRUE(node.expired()) << "y -> expBackward -> y reference cycle";
}

TEST(Unary, IntegerInputErrorNamesOpAndTensor) {
  Tensor ids = Tensor::arange(3);
  try {
    gelu(ids);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("gelu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("i64[3]"), std::string::npos) << msg;
  }
}

// The CUDA kernels against the CPU reference: fresh random inputs, NaN-poisoned outputs,
// f32, bf16 and f64, forward and backward. Skips without a GPU.
TEST(Unary, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const UnaryOp all_ops[] = {UnaryOp::Exp,  UnaryOp::Log,  UnaryOp::Sigmoid, UnaryOp::Silu,
                             UnaryOp::Softplus, UnaryOp::Gelu, UnaryOp::Tanh, UnaryOp::Neg,
                             UnaryOp::Square, UnaryOp::Sqrt, UnaryOp::Relu};
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 10;
    // 16-byte vectors, then views off a 16-byte boundary: element by element
    for (bool offset_views : {false, true}) {
    for (UnaryOp op : all_ops) {
      const std::string name =
          std::string(unary_op_name(op)) + (offset_views ? " (offset views)" : "");
      const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt;
      Tensor x = positive ? testing::random_tensor({7, 301}, dtype, gpu, seed++, 0.4, 2.0)
                          : testing::random_tensor({7, 301}, dtype, gpu, seed++, 1.5);
      Tensor dy = testing::random_tensor({7, 301}, dtype, gpu, seed++);
      if (offset_views) {
        x = testing::one_element_in(x);
        dy = testing::one_element_in(dy);
      }
      Tensor x_cpu = testing::cpu_reference(x), dy_cpu = testing::cpu_reference(dy);
      Tensor want_y = ops::unary(op, x_cpu);
      Tensor y = testing::poisoned(x.shape(), dtype, gpu);
      if (offset_views) y = testing::one_element_in(y);
      unary_kernels()(gpu, op, x, y);
      testing::expect_matches_reference(y, want_y, dtype, name);

      const bool reads_output = unary_saves(op) == UnarySaved::Output;
      Tensor want_dx = ops::unary_backward(op, dy_cpu, reads_output ? want_y : x_cpu);
      Tensor dx = testing::poisoned(x.shape(), dtype, gpu);
      if (offset_views) dx = testing::one_element_in(dx);
      unary_backward_kernels()(gpu, op, dy, reads_output ? y : x, dx);
      testing::expect_matches_reference(dx, want_dx, dtype, name + " backward");
    }
    }
  }
}

}  // namespace
}  // namespace ham

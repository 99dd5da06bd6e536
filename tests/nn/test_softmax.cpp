#include "nn/softmax.h"

#include <cmath>
#include <limits>
#include <string>

#include "autograd/engine.h"
#include "core/ops/softmax.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Textbook softmax of one row, no max trick (inputs kept small where it is used).
std::vector<double> naive_softmax(const std::vector<double>& row) {
  double total = 0;
  for (double v : row) total += std::exp(v);
  std::vector<double> out;
  for (double v : row) out.push_back(std::exp(v) / total);
  return out;
}

struct SoftmaxCase {
  Shape shape;
};
void PrintTo(const SoftmaxCase& c, std::ostream* os) { *os << shape_str(c.shape); }

class SoftmaxTest : public ::testing::TestWithParam<SoftmaxCase> {};

TEST_P(SoftmaxTest, ForwardMatchesNaive) {
  Tensor x = randn64(GetParam().shape, 1, 1.0, false);
  int64_t cols = x.size(-1);
  std::vector<double> in = x.to_vector<double>();
  std::vector<double> y = softmax(x).to_vector<double>();
  std::vector<double> log_y = log_softmax(x).to_vector<double>();
  for (int64_t r = 0; r < x.numel() / cols; ++r) {
    std::vector<double> row(in.begin() + r * cols, in.begin() + (r + 1) * cols);
    std::vector<double> expected = naive_softmax(row);
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_NEAR(y[size_t(r * cols + j)], expected[size_t(j)], 1e-14);
      EXPECT_NEAR(log_y[size_t(r * cols + j)], std::log(expected[size_t(j)]), 1e-13);
      sum += y[size_t(r * cols + j)];
    }
    EXPECT_NEAR(sum, 1.0, 1e-14);
  }
}

TEST_P(SoftmaxTest, Gradcheck) {
  Tensor x = randn64(GetParam().shape, 2);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{softmax(v[0])}; }, {x});
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{log_softmax(v[0])}; },
                   {x});
}

INSTANTIATE_TEST_SUITE_P(Shapes, SoftmaxTest,
                         ::testing::Values(SoftmaxCase{{2, 5}}, SoftmaxCase{{3, 1}},
                                           SoftmaxCase{{1, 7}}, SoftmaxCase{{2, 3, 4}},
                                           SoftmaxCase{{6}}));

TEST(Softmax, LargeInputsDoNotOverflow) {
  // softmax is shift-invariant: x + 1000 must give softmax(x).
  std::vector<double> row = {0.5, -1.0, 2.0, 0.0};
  std::vector<double> shifted;
  for (double v : row) shifted.push_back(v + 1000.0);
  Tensor x = Tensor::from_vector(shifted, {1, 4});
  std::vector<double> expected = naive_softmax(row);
  std::vector<double> y = softmax(x).to_vector<double>();
  std::vector<double> log_y = log_softmax(x).to_vector<double>();
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(y[j], expected[j], 1e-14);
    EXPECT_NEAR(log_y[j], std::log(expected[j]), 1e-12);
  }
  std::vector<float> yf = softmax(x.to(DType::F32)).to_vector<float>();
  for (size_t j = 0; j < 4; ++j) EXPECT_NEAR(yf[j], expected[j], 1e-6);
}

TEST(Softmax, F32RowsSumToOneOverLongRows) {
  Tensor x = randn64({3, 5000}, 3, 4.0, false).to(DType::F32);
  std::vector<float> y = softmax(x).to_vector<float>();
  for (int r = 0; r < 3; ++r) {
    double sum = 0;
    for (int j = 0; j < 5000; ++j) sum += y[size_t(r * 5000 + j)];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST(Softmax, MaskedEntriesGetZeroProbability) {
  Tensor x = Tensor::from_vector<double>({-kInf, 0.0, -kInf, 1.0}, {1, 4});
  std::vector<double> y = softmax(x).to_vector<double>();
  std::vector<double> expected = naive_softmax({0.0, 1.0});
  EXPECT_EQ(y[0], 0.0);
  EXPECT_EQ(y[2], 0.0);
  EXPECT_NEAR(y[1], expected[0], 1e-15);
  EXPECT_NEAR(y[3], expected[1], 1e-15);
  std::vector<double> log_y = log_softmax(x).to_vector<double>();
  EXPECT_EQ(log_y[0], -kInf);
  EXPECT_NEAR(log_y[3], std::log(expected[1]), 1e-15);
}

TEST(Softmax, GradcheckWithMaskedEntries) {
  // A -inf input stays -inf under perturbation, so its numeric gradient is 0 too.
  Tensor x = randn64({3, 4}, 4);
  double* p = x.data<double>();
  p[1] = -kInf;
  p[4] = -kInf;
  p[6] = -kInf;
  p[7] = -kInf;
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{softmax(v[0])}; }, {x});
}

TEST(Softmax, FullyMaskedRowIsZeroWithoutNaNAndLeavesOtherRowsAlone) {
  Tensor x = Tensor::from_vector<double>({-kInf, -kInf, -kInf, 0.25, -0.5, 1.0}, {2, 3});
  set_requires_grad(x);
  Tensor y = softmax(x);
  std::vector<double> v = y.to_vector<double>();
  std::vector<double> expected = naive_softmax({0.25, -0.5, 1.0});
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(v[j], 0.0);
    EXPECT_NEAR(v[3 + j], expected[j], 1e-15);
  }
  Tensor dy = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  std::vector<double> dx = gradients({y}, {x}, {dy})[0].to_vector<double>();
  double dot = 4 * expected[0] + 5 * expected[1] + 6 * expected[2];
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(dx[j], 0.0);
    EXPECT_NEAR(dx[3 + j], expected[j] * ((4 + double(j)) - dot), 1e-14);
  }

  Tensor ly = log_softmax(x);
  std::vector<double> lv = ly.to_vector<double>();
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(lv[j], -kInf);
    EXPECT_NEAR(lv[3 + j], std::log(expected[j]), 1e-14);
  }
  std::vector<double> ldx = gradients({ly}, {x}, {dy})[0].to_vector<double>();
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(ldx[j], 0.0);
    EXPECT_NEAR(ldx[3 + j], (4 + double(j)) - expected[j] * 15.0, 1e-13);
  }
}

TEST(Softmax, NaNStaysInItsRow) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = Tensor::from_vector<double>({nan, 1.0, 0.0, 1.0}, {2, 2});
  std::vector<double> y = softmax(x).to_vector<double>();
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]));
  EXPECT_NEAR(y[2] + y[3], 1.0, 1e-15);
}

TEST(Softmax, ZeroDimTensorIsAnError) {
  try {
    softmax(Tensor::scalar(1.0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos);
  }
}

// The CUDA kernels against the CPU reference: fresh random inputs with masked (-inf)
// entries and a fully masked row, NaN-poisoned outputs, f32, bf16 and f64, forward and
// backward; rows short (a warp each) and long (a block each). Skips without a GPU.
TEST(Softmax, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 40;
    for (int64_t cols : {50, 3000}) {
      const int64_t rows = 11;
      std::vector<double> values = testing::random_tensor({rows, cols}, DType::F64, Device::cpu(),
                                                          seed++, 2.0).to_vector<double>();
      for (int64_t j = 0; j < cols; j += 7) values[size_t(j)] = neg_inf;      // row 0: some masked
      for (int64_t j = 0; j < cols; ++j) values[size_t(cols + j)] = neg_inf;  // row 1: all masked
      Tensor x = Tensor::from_vector(values, {rows, cols}).to(dtype).to(gpu);
      Tensor dy = testing::random_tensor({rows, cols}, dtype, gpu, seed++);
      Tensor x_cpu = testing::cpu_reference(x), dy_cpu = testing::cpu_reference(dy);
      for (bool log : {false, true}) {
        const std::string what = std::string(log ? "log_softmax" : "softmax") + " cols=" +
                                 std::to_string(cols);
        Tensor want_y = log ? ops::log_softmax(x_cpu) : ops::softmax(x_cpu);
        Tensor want_dx = log ? ops::log_softmax_backward(want_y, dy_cpu)
                             : ops::softmax_backward(want_y, dy_cpu);
        Tensor y = testing::poisoned(x.shape(), dtype, gpu);
        (log ? log_softmax_kernels() : softmax_kernels())(gpu, x, y);
        testing::expect_matches_reference(y, want_y, dtype, what);
        Tensor dx = testing::poisoned(x.shape(), dtype, gpu);
        (log ? log_softmax_backward_kernels() : softmax_backward_kernels())(gpu, y, dy, dx);
        testing::expect_matches_reference(dx, want_dx, dtype, what + " backward");
      }
    }
  }
}

}  // namespace
}  // namespace ham

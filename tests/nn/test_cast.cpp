#include "nn/cast.h"

#include <cmath>
#include <limits>

#include "autograd/engine.h"
#include "core/ops/cast.h"
#include "nn/elementwise.h"
#include "nn/reduce.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_error;

// bf16 keeps 8 significant bits: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and rounds
// to the even neighbour (1); 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
TEST(Cast, Bf16RoundsToNearestEven) {
  const double u = std::ldexp(1.0, -8);
  Tensor x = Tensor::from_vector<double>({1 + u, 1 + 3 * u, -(1 + 3 * u), 1 + 0.9 * u, 3.4e38,
                                          std::numeric_limits<double>::quiet_NaN()},
                                         {6});
  std::vector<double> y = ops::cast(ops::cast(x, DType::BF16), DType::F64).to_vector<double>();
  EXPECT_EQ(y[0], 1.0);
  EXPECT_EQ(y[1], 1 + 4 * u);
  EXPECT_EQ(y[2], -(1 + 4 * u));
  EXPECT_EQ(y[3], 1.0);
  EXPECT_TRUE(std::isinf(y[4]));  // past halfway from bf16 largest finite value (3.39e38) to inf
  EXPECT_TRUE(std::isnan(y[5]));
}

TEST(Cast, EveryPairOfDtypesRoundTripsSmallIntegers) {
  const std::vector<DType> dtypes = {DType::F32, DType::F64, DType::BF16,
                                     DType::I32, DType::I64, DType::U8};
  Tensor x = Tensor::from_vector<double>({0, 1, 2, 7, 100, 255}, {2, 3});
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      Tensor y = ops::cast(ops::cast(x, from), to);
      EXPECT_EQ(y.dtype(), to);
      EXPECT_EQ(y.shape(), x.shape());
      EXPECT_EQ(y.to_vector<double>(), x.to_vector<double>())
          << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

TEST(Cast, FloatingToIntegerTruncatesTowardZero) {
  Tensor x = Tensor::from_vector<float>({2.75f, -2.75f, 0.5f, -0.5f}, {4});
  EXPECT_EQ(ops::cast(x, DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{2, -2, 0, 0}));
  EXPECT_EQ(ops::cast(x.to(DType::BF16), DType::I32).to_vector<int32_t>(),
            (std::vector<int32_t>{2, -2, 0, 0}));
}

TEST(Cast, SameDtypeIsTheTensorItself) {
  Tensor x = testing::randn64({3}, 1, 1.0, true);
  EXPECT_EQ(ops::cast(x, DType::F64).impl(), x.impl());
  EXPECT_EQ(cast(x, DType::F64).impl(), x.impl());
}

TEST(Cast, CastIntoWritesTheGivenTensor) {
  Tensor x = testing::random_tensor({4, 5}, DType::F32, Device::cpu(), 3);
  Tensor out = Tensor::zeros({4, 5}, DType::BF16);
  const void* storage = out.raw_data();
  ops::cast_into(x, out);
  EXPECT_EQ(out.raw_data(), storage);
  EXPECT_EQ(out.to_vector<float>(), x.to(DType::BF16).to_vector<float>());
  Tensor wrong = Tensor::zeros({5, 4}, DType::BF16);
  expect_error([&] { ops::cast_into(x, wrong); }, {"cast_into", "[4, 5]", "[5, 4]", "shape"});
}

// Through f32 and back: the finite differences see f32 rounding (~6e-8 relative), so the
// step is 1e-3 and the bound 1e-3.
TEST(Cast, GradcheckThroughF32AndBf16) {
  Tensor x = testing::randn64({3, 4}, 5);
  GradcheckOptions options;
  options.eps = 1e-3;
  options.tolerance = 1e-3;
  testing::expect_gradcheck(
      [](const std::vector<Tensor>& v) {
        return std::vector{cast(cast(v[0], DType::F32), DType::F64)};
      },
      {x}, options);
  options.eps = 0.25;  // bf16 steps are 2^-8 relative: perturb by far more than that
  options.tolerance = 2e-2;
  testing::expect_gradcheck(
      [](const std::vector<Tensor>& v) {
        return std::vector{cast(scale(cast(v[0], DType::BF16), 2.0), DType::F64)};
      },
      {x}, options);
}

// The gradient returns in the input's dtype: an f32 leaf read as bf16 gets an f32 gradient
// equal to the bf16 weights of the sum.
TEST(Cast, GradientArrivesInTheInputsDtype) {
  Tensor x = testing::random_tensor({2, 8}, DType::F32, Device::cpu(), 7);
  set_requires_grad(x);
  Tensor w = testing::random_tensor({2, 8}, DType::BF16, Device::cpu(), 8);
  Tensor y = cast(x, DType::BF16);
  EXPECT_EQ(y.dtype(), DType::BF16);
  Tensor loss = sum(mul(y, w));
  backward(loss);
  ASSERT_TRUE(grad(x).defined());
  EXPECT_EQ(grad(x).dtype(), DType::F32);
  EXPECT_EQ(grad(x).to_vector<float>(), w.to_vector<float>());
}

TEST(Cast, UndefinedInputIsNamed) {
  expect_error([] { ops::cast(Tensor(), DType::F32); }, {"cast", "undefined", "f32"});
}

TEST(Cast, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const std::vector<DType> dtypes = {DType::F32, DType::F64, DType::BF16,
                                     DType::I32, DType::I64, DType::U8};
  // Values with fractions, signs and magnitudes that round differently in bf16; integer
  // targets see only values in [0, 200) so every dtype can hold them.
  Tensor wide = testing::random_tensor({7, 129}, DType::F64, Device::cpu(), 11, 40.0);
  Tensor small = testing::uniform64({7, 129}, 12, 0.0, 200.0, false);
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      const bool integral = !is_floating(from) || !is_floating(to);
      Tensor x_cpu = ops::cast(integral ? small : wide, from);
      Tensor y_gpu = is_floating(to) ? testing::poisoned({7, 129}, to, Device::cuda())
                                     : Tensor::full({7, 129}, 77, to, Device::cuda());
      Tensor x_gpu = x_cpu.to(Device::cuda());
      ops::cast_into(x_gpu, y_gpu);
      EXPECT_EQ(y_gpu.to(Device::cpu()).to_vector<double>(), ops::cast(x_cpu, to).to_vector<double>())
          << dtype_name(from) << " -> " << dtype_name(to);
      EXPECT_EQ(x_gpu.to(to).device(), Device::cuda());
    }
  }
}

}  // namespace
}  // namespace ham

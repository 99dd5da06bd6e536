#include "core/tensor.h"
#include "tests/error_testing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

namespace ham {
namespace {

constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::BF16,
                                DType::I32, DType::I64, DType::U8};

// Asserts fn throws a one-line ham::Error containing every keyword.
using testing::expect_error;

uint16_t bf16_bits_of(float f) { return float_to_bf16(f).bits; }
float bf16_round_trip(float f) { return bf16_to_float(float_to_bf16(f)); }

TEST(TensorFactories, EmptyHasShapeDtypeAndDevice) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::F64);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dtype(), DType::F64);
  EXPECT_EQ(t.nbytes(), 24u * 8u);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.str(), "f64[2, 3, 4] on cpu");
  expect_error([&] { t.size(3); }, {"size(3) out of range", "[2, 3, 4]"});
  expect_error([&] { t.size(-4); }, {"size(-4)"});
}

TEST(TensorFactories, ZerosFullScalar) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    EXPECT_EQ(Tensor::zeros({3, 2}, dtype).to_vector<double>(), std::vector<double>(6, 0.0));
    EXPECT_EQ(Tensor::full({4}, 7, dtype).to_vector<double>(), std::vector<double>(4, 7.0));
    Tensor s = Tensor::scalar(5, dtype);
    EXPECT_EQ(s.dim(), 0);
    EXPECT_EQ(s.numel(), 1);
    EXPECT_EQ(s.item(), 5.0);
  }
  EXPECT_EQ(Tensor::full({2}, 0.1).to_vector<float>(), (std::vector<float>{0.1f, 0.1f}));
  EXPECT_EQ(Tensor::zeros({0, 3}).numel(), 0);
  EXPECT_TRUE(Tensor::zeros({0, 3}).to_vector<float>().empty());
}

TEST(TensorFactories, FromVectorAndArange) {
  Tensor t = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::I32);
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t.data<int32_t>()[4], 5);
  expect_error([] { Tensor::from_vector<float>({1, 2, 3}, {2, 2}); },
               {"from_vector", "3 values", "[2, 2]"});
  Tensor r = Tensor::arange(5);
  EXPECT_EQ(r.dtype(), DType::I64);
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(3, DType::BF16).to_vector<float>(), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(Tensor::arange(0).numel(), 0);
}

TEST(TensorFactories, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.str(), "undefined tensor");
  expect_error([&] { t.shape(); }, {"undefined tensor"});
  expect_error([&] { t.dtype(); }, {"undefined tensor"});
}

TEST(TensorShapes, NegativeDimsAndOverflowAreErrors) {
  expect_error([] { Tensor::empty({2, -1}); }, {"invalid shape [2, -1]", "negative dimension"});
  expect_error([] { Tensor::zeros({-3}); }, {"[-3]", "negative"});
  int64_t big = int64_t(1) << 40;
  expect_error([&] { shape_numel({big, big}); }, {"overflows"});
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({3, 0, 5}), 0);
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_str({1, 22}), "[1, 22]");
}

TEST(TensorViews, ReshapeInfersMinusOneAndSharesStorage) {
  Tensor t = Tensor::arange(12, DType::F32).reshape({3, 4});
  Tensor r = t.reshape({2, -1, 3});
  EXPECT_EQ(r.shape(), (Shape{2, 2, 3}));
  EXPECT_TRUE(r.shares_storage_with(t));
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{12}));
  EXPECT_EQ(Tensor::scalar(3).reshape({1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(Tensor::zeros({0, 4}).reshape({-1, 2}).shape(), (Shape{0, 2}));
  r.data<float>()[11] = -1;
  EXPECT_EQ(t.to_vector<float>()[11], -1.0f);
}

TEST(TensorViews, ReshapeErrorsNameBothShapes) {
  Tensor t = Tensor::zeros({2, 3});
  expect_error([&] { t.reshape({4, 2}); }, {"reshape [2, 3] -> [4, 2]", "element counts differ"});
  expect_error([&] { t.reshape({-1, -1}); }, {"[2, 3] -> [-1, -1]", "more than one -1"});
  expect_error([&] { t.reshape({-1, 4}); }, {"[2, 3] -> [-1, 4]", "cannot infer -1"});
  expect_error([&] { t.reshape({-2, 3}); }, {"[2, 3] -> [-2, 3]", "negative"});
}

TEST(TensorViews, SliceAndSelectWriteThroughToBase) {
  Tensor base = Tensor::arange(12, DType::F64).reshape({3, 4});
  Tensor rows = base.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 4}));
  EXPECT_TRUE(rows.shares_storage_with(base));
  EXPECT_EQ(rows.to_vector<double>()[0], 4.0);
  rows.fill_(-1);
  Tensor row = base.select(0);
  EXPECT_EQ(row.shape(), (Shape{4}));
  row.data<double>()[2] = 100;
  EXPECT_EQ(base.to_vector<double>(),
            (std::vector<double>{0, 1, 100, 3, -1, -1, -1, -1, -1, -1, -1, -1}));
  base.select(2).zero_();
  EXPECT_EQ(base.to_vector<double>()[7], -1.0);
  EXPECT_EQ(base.to_vector<double>()[8], 0.0);
  // A view of a view keeps the right offset.
  Tensor nested = base.slice(1, 3).select(1);
  EXPECT_EQ(nested.to_vector<double>(), (std::vector<double>{0, 0, 0, 0}));
  nested.fill_(9);
  EXPECT_EQ(base.select(2).to_vector<double>(), (std::vector<double>{9, 9, 9, 9}));
  EXPECT_EQ(base.slice(3, 3).numel(), 0);
  Tensor scalar_row = Tensor::arange(3).select(1);
  EXPECT_EQ(scalar_row.dim(), 0);
  EXPECT_EQ(scalar_row.item(), 1.0);
}

TEST(TensorViews, SliceAndSelectOutOfRange) {
  Tensor t = Tensor::zeros({3, 4});
  expect_error([&] { t.slice(2, 5); }, {"slice [2, 5) out of range", "[3, 4]"});
  expect_error([&] { t.slice(2, 1); }, {"slice [2, 1)", "[3, 4]"});
  expect_error([&] { t.slice(-1, 2); }, {"slice [-1, 2)"});
  expect_error([&] { t.select(3); }, {"select(3) out of range", "[3, 4]"});
  expect_error([&] { t.select(-1); }, {"select(-1)"});
  expect_error([] { Tensor::scalar(1).slice(0, 1); }, {"slice on a 0-d tensor"});
}

TEST(TensorViews, FlattenTo2d) {
  Tensor t = Tensor::arange(24, DType::F32).reshape({2, 3, 4});
  Tensor flat = t.flatten_to_2d();
  EXPECT_EQ(flat.shape(), (Shape{6, 4}));
  EXPECT_TRUE(flat.shares_storage_with(t));
  EXPECT_EQ(Tensor::zeros({5}).flatten_to_2d().shape(), (Shape{1, 5}));
  EXPECT_EQ(Tensor::zeros({2, 0, 3}).flatten_to_2d().shape(), (Shape{0, 3}));
  EXPECT_EQ(Tensor::zeros({2, 3, 0}).flatten_to_2d().shape(), (Shape{0, 0}));
  expect_error([] { Tensor::scalar(1).flatten_to_2d(); }, {"flatten_to_2d", "0-d"});
}

TEST(TensorCopies, CloneIsDeep) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage_with(t));
  c.data<float>()[0] = 50;
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  // Cloning a view copies only the view.
  Tensor base = Tensor::arange(6, DType::F32).reshape({3, 2});
  Tensor row = base.select(1).clone();
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{2, 3}));
  row.fill_(0);
  EXPECT_EQ(base.to_vector<float>()[2], 2.0f);
}

TEST(TensorCopies, CopyChecksShapeAndDtype) {
  Tensor dst = Tensor::zeros({2, 3});
  dst.copy_(Tensor::full({2, 3}, 4));
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(6, 4.0f));
  expect_error([&] { dst.copy_(Tensor::zeros({3, 2})); },
               {"copy_", "shape mismatch", "[2, 3]", "[3, 2]"});
  expect_error([&] { dst.copy_(Tensor::zeros({2, 3}, DType::F64)); },
               {"copy_", "dtype f64 into f32"});
  Tensor view = Tensor::zeros({4, 3}).slice(1, 3);
  view.copy_(dst);
  EXPECT_EQ(view.to_vector<float>(), std::vector<float>(6, 4.0f));
}

TEST(TensorDtypes, ConversionsBetweenAllPairsKeepExactValues) {
  // Values every dtype (u8 and bf16 included) holds exactly.
  std::vector<double> values{0, 1, 2, 7, 100, 128, 255};
  for (DType from : kAllDTypes) {
    Tensor source = Tensor::from_vector(values, {7}).to(from);
    EXPECT_EQ(source.dtype(), from);
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      Tensor converted = source.to(to);
      EXPECT_EQ(converted.dtype(), to);
      EXPECT_EQ(converted.shape(), (Shape{7}));
      EXPECT_EQ(converted.to_vector<double>(), values);
      EXPECT_EQ(converted.shares_storage_with(source), from == to);
    }
  }
}

TEST(TensorDtypes, FloatToIntegerTruncatesTowardZero) {
  Tensor t = Tensor::from_vector<double>({2.7, -2.7, 0.5, -0.5}, {4});
  EXPECT_EQ(t.to(DType::I32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 0}));
  EXPECT_EQ(t.to(DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{2, -2, 0, 0}));
  EXPECT_EQ(Tensor::from_vector<int64_t>({int64_t(1) << 40}, {1}).to(DType::F64).item(),
            std::ldexp(1.0, 40));
}

TEST(TensorDtypes, Bf16RoundsToNearestEven) {
  const float one = 1.0f;
  // Halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_bits_of(one + std::ldexp(1.0f, -8)), 0x3f80);
  // Halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(bf16_round_trip(one + 3 * std::ldexp(1.0f, -8)), one + std::ldexp(1.0f, -6));
  // Just above the first tie: rounds up.
  EXPECT_EQ(bf16_round_trip(one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)),
            one + std::ldexp(1.0f, -7));
  // Just below 1 + 2^-7's upper tie: rounds down.
  EXPECT_EQ(bf16_round_trip(one + std::ldexp(1.0f, -7) + std::ldexp(1.0f, -9)),
            one + std::ldexp(1.0f, -7));
  EXPECT_EQ(bf16_round_trip(-1.0f - 3 * std::ldexp(1.0f, -8)), -1.0f - std::ldexp(1.0f, -6));
  // NaN stays NaN, even a signalling NaN whose payload lives only in the low 16 bits.
  uint32_t signalling = 0x7f800001u;
  float snan;
  std::memcpy(&snan, &signalling, 4);
  EXPECT_TRUE(std::isnan(bf16_round_trip(snan)));
  EXPECT_TRUE(std::isnan(bf16_round_trip(std::numeric_limits<float>::quiet_NaN())));
  // Large values: the bf16 maximum stays, anything past its upper tie becomes inf.
  float bf16_max;
  uint32_t bf16_max_bits = 0x7f7f0000u;
  std::memcpy(&bf16_max, &bf16_max_bits, 4);
  EXPECT_EQ(bf16_round_trip(bf16_max), bf16_max);
  EXPECT_EQ(bf16_round_trip(std::numeric_limits<float>::max()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_round_trip(-std::numeric_limits<float>::max()),
            -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_round_trip(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  // The same rounding through tensors, from f32 and from f64.
  std::vector<float> inputs{one + std::ldexp(1.0f, -8), one + 3 * std::ldexp(1.0f, -8),
                            std::numeric_limits<float>::max()};
  auto via_f32 = Tensor::from_vector(inputs, {3}).to(DType::BF16).to_vector<float>();
  EXPECT_EQ(via_f32[0], 1.0f);
  EXPECT_EQ(via_f32[1], one + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isinf(via_f32[2]));
  auto via_f64 = Tensor::from_vector<double>({1 + std::ldexp(1.0, -8), 1e39, std::nan("")}, {3})
                     .to(DType::BF16)
                     .to_vector<float>();
  EXPECT_EQ(via_f64[0], 1.0f);
  EXPECT_TRUE(std::isinf(via_f64[1]));
  EXPECT_TRUE(std::isnan(via_f64[2]));
  EXPECT_EQ(Tensor::full({1}, 1 + 3 * std::ldexp(1.0, -8), DType::BF16).item(),
            1 + std::ldexp(1.0, -6));
}

TEST(TensorReadback, ToVectorAndItem) {
  Tensor t = Tensor::from_vector<float>({1.5f, -2.5f}, {2});
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1.5, -2.5}));
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(t.select(1).item(), -2.5);
  EXPECT_EQ(Tensor::full({1, 1, 1}, 3).item(), 3.0);
  expect_error([&] { t.item(); }, {"item()", "[2]", "exactly one element"});
  expect_error([&] { t.data<double>(); }, {"data<f64>()", "f32 tensor"});
}

TEST(TensorDevices, CudaRequestWithoutBackendIsAOneLineError) {
  if (has_device_backend(DeviceKind::CUDA)) {
    GTEST_SKIP() << "this build has a CUDA backend; see TensorDevices.CudaRoundTrip";
  }
  expect_error([] { Tensor::zeros({4}, DType::F32, Device::cuda()); },
               {"cuda:0", "not available"});
  expect_error([] { Tensor::arange(4).to(Device::cuda(1)); }, {"cuda", "not available"});
}

TEST(TensorDevices, CudaRoundTrip) {
  if (!has_device_backend(DeviceKind::CUDA)) GTEST_SKIP() << "this build has no CUDA backend";
  Tensor on_gpu;
  try {
    on_gpu = Tensor::arange(12, DType::F32).reshape({3, 4}).to(Device::cuda());
  } catch (const Error& e) {
    GTEST_SKIP() << "CUDA backend present but no usable GPU: " << e.what();
  }
  EXPECT_TRUE(on_gpu.device().is_cuda());
  EXPECT_EQ(on_gpu.str(), "f32[3, 4] on cuda:0");
  Tensor copy = on_gpu.clone();
  EXPECT_FALSE(copy.shares_storage_with(on_gpu));
  on_gpu.select(1).fill_(-1);
  on_gpu.select(2).zero_();
  EXPECT_EQ(on_gpu.to_vector<float>(),
            (std::vector<float>{0, 1, 2, 3, -1, -1, -1, -1, 0, 0, 0, 0}));
  EXPECT_EQ(copy.to(Device::cpu()).to_vector<float>()[5], 5.0f);
  Tensor host = Tensor::zeros({3, 4});
  host.copy_(on_gpu);
  EXPECT_EQ(host.to_vector<float>()[4], -1.0f);
  EXPECT_EQ(Tensor::full({2}, 2.5, DType::F64, Device::cuda()).to_vector<double>(),
            (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(on_gpu.select(0).select(3).item(), 3.0);
}

}  // namespace
}  // namespace ham

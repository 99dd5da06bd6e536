#include "nn/elementwise.h"

#include <string>

#include "core/ops/elementwise.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;
using testing::uniform64;

struct BroadcastCase {
  Shape a, b;
};

void PrintTo(const BroadcastCase& c, std::ostream* os) { *os << shape_str(c.a) << "_" << shape_str(c.b); }


class BinaryGradcheck : public ::testing::TestWithParam<BroadcastCase> {};

TEST_P(BinaryGradcheck, AddSubMulDiv) {
  const auto& c = GetParam();
  Tensor a = randn64(c.a, 1);
  Tensor b = uniform64(c.b, 2, 0.5, 2.0);  // away from 0 for div
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{add(x[0], x[1])}; }, {a, b});
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{sub(x[0], x[1])}; }, {a, b});
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{mul(x[0], x[1])}; }, {a, b});
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{div(x[0], x[1])}; }, {a, b});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BinaryGradcheck,
    ::testing::Values(BroadcastCase{{3, 4}, {3, 4}},        // same shape
                      BroadcastCase{{2, 3, 4}, {4}},        // bias over the last dim
                      BroadcastCase{{2, 3, 4}, {3, 1}},     // middle stretch
                      BroadcastCase{{1, 4}, {3, 1}},        // both stretch
                      BroadcastCase{{2, 1, 4}, {1, 3, 1}},  // 3-D both ways
                      BroadcastCase{{}, {2, 3}},            // 0-d scalar
                      BroadcastCase{{1}, {1}}));            // size-1

TEST(Elementwise, ScaleAndAddScalarGradcheck) {
  Tensor x = randn64({2, 5}, 3);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{scale(v[0], -2.5)}; }, {x});
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{add_scalar(v[0], 4.0)}; }, {x});
}

TEST(Elementwise, ForwardValuesBroadcast) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<double>({10, 20}, {2, 1});
  auto y = (a * b).to_vector<double>();
  EXPECT_EQ(y, (std::vector<double>{10, 20, 30, 80, 100, 120}));
}

TEST(Elementwise, ShapeMismatchNamesOpAndShapes) {
  Tensor a = Tensor::zeros({2, 3});
  Tensor b = Tensor::zeros({4});
  try {
    add(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  }
}

// The CUDA kernels against the CPU reference: fresh random inputs, NaN-poisoned outputs,
// f32 and bf16 (relative RMS error <= 1e-5 / 1e-2). Skips without a GPU.
TEST(Elementwise, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4, 33, 20}, {4, 33, 20}},  // same shape
      {{4, 33, 20}, {20}},         // a bias
      {{4, 1, 20}, {33, 1}},       // both stretched
      {{3}, {2, 5, 3}}};
  for (DType dtype : testing::kGpuDtypes) {
    uint64_t seed = 1;
    for (const auto& [sa, sb] : cases) {
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
        Tensor a = testing::random_tensor(sa, dtype, gpu, seed++);
        Tensor b = op == BinaryOp::Div ? testing::random_tensor(sb, dtype, gpu, seed++, 0.4, 2.0)
                                       : testing::random_tensor(sb, dtype, gpu, seed++);
        Tensor want = ops::binary(op, testing::cpu_reference(a), testing::cpu_reference(b));
        Tensor out = testing::poisoned(want.shape(), dtype, gpu);
        binary_kernels()(gpu, op, a, b, out);
        testing::expect_matches_reference(
            out, want, dtype, std::string(binary_op_name(op)) + shape_str(sa) + shape_str(sb));
      }
    }
    // Same shapes in 16-byte vectors, then in views off a 16-byte boundary (element by
    // element): binary ops, axpy_ and scale_.
    for (bool offset_views : {false, true}) {
      auto place = [&](const Tensor& t) { return offset_views ? testing::one_element_in(t) : t; };
      const std::string where = offset_views ? " (offset views)" : "";
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul}) {
        Tensor a = place(testing::random_tensor({3, 1001}, dtype, gpu, seed++));
        Tensor b = place(testing::random_tensor({3, 1001}, dtype, gpu, seed++));
        Tensor want = ops::binary(op, testing::cpu_reference(a), testing::cpu_reference(b));
        Tensor out = place(testing::poisoned(want.shape(), dtype, gpu));
        binary_kernels()(gpu, op, a, b, out);
        testing::expect_matches_reference(out, want, dtype, binary_op_name(op) + where);
      }
      Tensor src = place(testing::random_tensor({5000}, dtype, gpu, seed++));
      Tensor dst = place(testing::random_tensor({5000}, dtype, gpu, seed++));
      Tensor want = testing::cpu_reference(dst).clone();
      ops::axpy_(0.75, testing::cpu_reference(src), want);
      ops::axpy_(0.75, src, dst);
      testing::expect_matches_reference(dst, want, dtype, "axpy_" + where);
      ops::scale_(want, -1.5);
      ops::scale_(dst, -1.5);
      testing::expect_matches_reference(dst, want, dtype, "scale_" + where);
    }

    Tensor x = testing::random_tensor({4, 333, 20}, dtype, gpu, seed++, 1.0, 0.5);
    for (const Shape& target : std::vector<Shape>{{20}, {4, 1, 20}, {333, 1}, {4, 333, 1}, {1}, {}}) {
      Tensor want_sum = ops::sum_to(testing::cpu_reference(x), target);
      Tensor out = testing::poisoned(target, dtype, gpu);
      sum_to_kernels()(gpu, x, out);
      testing::expect_matches_reference(out, want_sum, dtype, "sum_to " + shape_str(target));
    }
  }
}

}  // namespace
}  // namespace ham

#include "nn/elementwise.h"

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

}  // namespace
}  // namespace ham

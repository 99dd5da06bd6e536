#include "nn/matmul.h"

#include <string>

#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

struct MatmulCase {
  Shape a, b;
  bool ta, tb;
};

void PrintTo(const MatmulCase& c, std::ostream* os) { *os << shape_str(c.a) << (c.ta ? "T" : "") << "_" << shape_str(c.b) << (c.tb ? "T" : ""); }


class MatmulGradcheck : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulGradcheck, AllTransposeFlags) {
  const auto& c = GetParam();
  Tensor a = randn64(c.a, 11), b = randn64(c.b, 12);
  bool ta = c.ta, tb = c.tb;
  expect_gradcheck(
      [ta, tb](const std::vector<Tensor>& x) { return std::vector{matmul(x[0], x[1], ta, tb)}; },
      {a, b});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulGradcheck,
    ::testing::Values(MatmulCase{{3, 4}, {4, 5}, false, false},
                      MatmulCase{{4, 3}, {4, 5}, true, false},
                      MatmulCase{{3, 4}, {5, 4}, false, true},
                      MatmulCase{{4, 3}, {5, 4}, true, true},
                      MatmulCase{{2, 3, 4}, {2, 4, 5}, false, false},  // batched
                      MatmulCase{{2, 3, 4}, {2, 5, 4}, false, true},
                      MatmulCase{{2, 4, 3}, {2, 4, 5}, true, false},
                      MatmulCase{{2, 3, 4}, {4, 5}, false, false},     // shared B
                      MatmulCase{{2, 3, 4}, {5, 4}, false, true},
                      MatmulCase{{1, 1}, {1, 1}, false, false}));      // size-1

TEST(Linear, GradcheckWithBiasAnd3dInput) {
  Tensor x = randn64({2, 3, 4}, 1), w = randn64({5, 4}, 2), b = randn64({5}, 3);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{linear(v[0], v[1], v[2])}; },
                   {x, w, b});
}

TEST(Linear, GradcheckSingleToken) {
  Tensor x = randn64({1, 1, 4}, 4), w = randn64({3, 4}, 5);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{linear(v[0], v[1])}; },
                   {x, w});
}

TEST(Matmul, ForwardMatchesHandComputed) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), (std::vector<float>{58, 64, 139, 154}));
}

TEST(Matmul, MismatchNamesBothShapes) {
  try {
    matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}));
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos);
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos);
    EXPECT_NE(msg.find("[4, 5]"), std::string::npos);
  }
}

}  // namespace
}  // namespace ham

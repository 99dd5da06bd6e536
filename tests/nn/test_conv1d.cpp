#include "nn/conv1d.h"

#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

// y[b, t, c] = bias[c] + sum_j w[c, j] x[b, t - (W-1) + j, c], zero before t = 0.
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, const Tensor& bias) {
  int64_t B = x.size(0), T = x.size(1), C = x.size(2), W = w.size(1);
  std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> bv =
      bias.defined() ? bias.to_vector<double>() : std::vector<double>(size_t(C), 0.0);
  std::vector<double> y(xv.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double acc = bv[size_t(c)];
        for (int64_t j = 0; j < W; ++j) {
          int64_t s = t - (W - 1) + j;
          if (s >= 0) acc += wv[size_t(c * W + j)] * xv[size_t((b * T + s) * C + c)];
        }
        y[size_t((b * T + t) * C + c)] = acc;
      }
  return y;
}

struct ConvCase {
  int64_t batch, seq, channels, width;
  bool bias;
};
void PrintTo(const ConvCase& c, std::ostream* os) {
  *os << "B" << c.batch << "_T" << c.seq << "_C" << c.channels << "_W" << c.width
      << (c.bias ? "_bias" : "_nobias");
}

class CausalConv1dTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CausalConv1dTest, ForwardMatchesNaive) {
  const auto& c = GetParam();
  Tensor x = randn64({c.batch, c.seq, c.channels}, 1, 1.0, false);
  Tensor w = randn64({c.channels, c.width}, 2, 1.0, false);
  Tensor b = c.bias ? randn64({c.channels}, 3, 1.0, false) : Tensor();
  std::vector<double> expected = naive_conv(x, w, b);
  std::vector<double> y = causal_conv1d(x, w, b).to_vector<double>();
  ASSERT_EQ(y.size(), expected.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-14);
  std::vector<float> yf =
      causal_conv1d(x.to(DType::F32), w.to(DType::F32), c.bias ? b.to(DType::F32) : Tensor())
          .to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(yf[i], expected[i], 1e-5);
}

TEST_P(CausalConv1dTest, Gradcheck) {
  const auto& c = GetParam();
  Tensor x = randn64({c.batch, c.seq, c.channels}, 4);
  Tensor w = randn64({c.channels, c.width}, 5);
  if (c.bias) {
    Tensor b = randn64({c.channels}, 6);
    expect_gradcheck(
        [](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(v[0], v[1], v[2])}; },
        {x, w, b});
  } else {
    expect_gradcheck(
        [](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(v[0], v[1])}; },
        {x, w});
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CausalConv1dTest,
                         ::testing::Values(ConvCase{2, 5, 3, 3, true},
                                           ConvCase{1, 1, 2, 1, true},   // W = 1, T = 1, B = 1
                                           ConvCase{2, 4, 3, 1, false},  // W = 1
                                           ConvCase{2, 3, 2, 5, true},   // W > T
                                           ConvCase{1, 6, 1, 4, false}));

TEST(CausalConv1d, GradientToWeightOnlyWhenInputIsConstant) {
  Tensor x = randn64({2, 4, 3}, 7, 1.0, false);
  Tensor w = randn64({3, 2}, 8);
  expect_gradcheck(
      [x](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(x, v[0])}; }, {w});
}

TEST(CausalConv1d, F32ChannelBlocksMatchNaive) {
  // More channels than one backward block, so several blocks run.
  Tensor x = randn64({2, 6, 150}, 9, 1.0, false);
  Tensor w = randn64({150, 4}, 10, 1.0, false);
  std::vector<double> expected = naive_conv(x, w, Tensor());
  std::vector<float> y = causal_conv1d(x.to(DType::F32), w.to(DType::F32)).to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-5);
  Tensor xg = randn64({2, 6, 150}, 11), wg = randn64({150, 4}, 12), bg = randn64({150}, 13);
  GradcheckOptions sampled;
  sampled.max_elements_per_input = 60;
  expect_gradcheck(
      [](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(v[0], v[1], v[2])}; },
      {xg, wg, bg}, sampled);
}

TEST(CausalConv1d, BadShapesNameOpAndShapes) {
  auto expect_error = [](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      FAIL() << "expected an error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("causal_conv1d"), std::string::npos) << msg;
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  };
  expect_error([] { causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({2, 3})); },
               {"[1, 4, 3]", "[2, 3]"});
  expect_error([] { causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({3, 0})); },
               {"[3, 0]"});
  expect_error([] {
    causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({3, 2}), Tensor::zeros({2}));
  }, {"[2]", "[1, 4, 3]"});
}

}  // namespace
}  // namespace ham

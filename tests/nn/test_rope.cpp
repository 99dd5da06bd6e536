#include "nn/rope.h"

#include <cmath>
#include <string>

#include "core/ops/rope.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::max_abs_diff;
using testing::randn64;

// Straight from the definition: pair (i, i + D/2) turned by pos * base^(-2i/D).
std::vector<double> naive_rope(const Tensor& x, double base, const std::vector<int64_t>& pos) {
  int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  std::vector<double> in = x.to_vector<double>(), out(in.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          double angle = double(pos[size_t(b * T + t)]) / std::pow(base, double(2 * i) / double(D));
          size_t lo = size_t(((b * T + t) * H + h) * D + i), hi = lo + size_t(D / 2);
          out[lo] = in[lo] * std::cos(angle) - in[hi] * std::sin(angle);
          out[hi] = in[hi] * std::cos(angle) + in[lo] * std::sin(angle);
        }
  return out;
}

std::vector<int64_t> default_positions(int64_t B, int64_t T) {
  std::vector<int64_t> pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos.push_back(t);
  return pos;
}

struct RopeCase {
  Shape shape;
  bool explicit_positions;
};
void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << shape_str(c.shape) << (c.explicit_positions ? "_positions" : "_default");
}

// Positions that restart mid-sequence and jump, like packed documents.
Tensor make_positions(int64_t B, int64_t T) {
  std::vector<int64_t> pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos.push_back(t < 2 ? t + 3 * b : t - 2);
  return Tensor::from_vector(pos, {B, T});
}

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, ForwardMatchesNaive) {
  const auto& c = GetParam();
  Tensor x = randn64(c.shape, 1, 1.0, false);
  int64_t B = c.shape[0], T = c.shape[1];
  Tensor positions = c.explicit_positions ? make_positions(B, T) : Tensor();
  std::vector<int64_t> pos =
      c.explicit_positions ? positions.to_vector<int64_t>() : default_positions(B, T);
  std::vector<double> expected = naive_rope(x, 100.0, pos);
  std::vector<double> y = rope(x, 100.0, positions).to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-14);
  if (c.explicit_positions) {  // i32 positions give the same result
    std::vector<double> y32 = rope(x, 100.0, positions.to(DType::I32)).to_vector<double>();
    EXPECT_EQ(y32, y);
  }
}

TEST_P(RopeTest, Gradcheck) {
  const auto& c = GetParam();
  Tensor x = randn64(c.shape, 2);
  Tensor positions = c.explicit_positions ? make_positions(c.shape[0], c.shape[1]) : Tensor();
  expect_gradcheck(
      [positions](const std::vector<Tensor>& v) {
        return std::vector{rope(v[0], 10.0, positions)};
      },
      {x});
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(RopeCase{{2, 5, 2, 4}, false},
                                           RopeCase{{2, 5, 2, 4}, true},
                                           RopeCase{{1, 1, 1, 2}, false},  // B = T = 1, D = 2
                                           RopeCase{{1, 3, 1, 2}, true},
                                           RopeCase{{2, 3, 3, 6}, true}));

TEST(Rope, PositionZeroIsIdentity) {
  Tensor x = randn64({2, 3, 2, 8}, 3, 1.0, false);
  Tensor zeros = Tensor::zeros({2, 3}, DType::I64);
  EXPECT_EQ(rope(x, 10000.0, zeros).to_vector<double>(), x.to_vector<double>());
  // Default positions: t = 0 is untouched.
  std::vector<double> in = x.to_vector<double>(), y = rope(x, 10000.0).to_vector<double>();
  for (int64_t b = 0; b < 2; ++b)
    for (size_t k = 0; k < 16; ++k) EXPECT_EQ(y[size_t(b) * 48 + k], in[size_t(b) * 48 + k]);
}

TEST(Rope, PreservesTheNormOfEveryPair) {
  Tensor x = randn64({2, 4, 3, 6}, 4, 1.0, false);
  std::vector<double> in = x.to_vector<double>(), y = rope(x, 500.0).to_vector<double>();
  for (size_t row = 0; row < in.size() / 6; ++row)
    for (size_t i = 0; i < 3; ++i) {
      size_t lo = row * 6 + i, hi = lo + 3;
      EXPECT_NEAR(y[lo] * y[lo] + y[hi] * y[hi], in[lo] * in[lo] + in[hi] * in[hi], 1e-13);
    }
}

TEST(Rope, RestartingPositionsEqualRunningEachDocumentAlone) {
  // One packed row [doc A (3 tokens) | doc B (2 tokens)] with positions 0 1 2 0 1.
  Tensor x = randn64({1, 5, 2, 4}, 5, 1.0, false);
  Tensor positions = Tensor::from_vector<int64_t>({0, 1, 2, 0, 1}, {1, 5});
  Tensor packed = rope(x, 10000.0, positions);
  Tensor doc_a = x.select(0).slice(0, 3).reshape({1, 3, 2, 4});
  Tensor doc_b = x.select(0).slice(3, 5).reshape({1, 2, 2, 4});
  EXPECT_LT(max_abs_diff(packed.select(0).slice(0, 3).reshape({1, 3, 2, 4}), rope(doc_a, 10000.0)),
            1e-15);
  EXPECT_LT(max_abs_diff(packed.select(0).slice(3, 5).reshape({1, 2, 2, 4}), rope(doc_b, 10000.0)),
            1e-15);
}

TEST(Rope, F32MatchesNaiveAtLargePositions) {
  Tensor x = randn64({1, 2, 1, 8}, 6, 1.0, false);
  std::vector<int64_t> pos = {70000, 123457};
  Tensor positions = Tensor::from_vector(pos, {1, 2});
  std::vector<double> expected = naive_rope(x, 10000.0, pos);
  std::vector<float> y = rope(x.to(DType::F32), 10000.0, positions).to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-5);
}

TEST(Rope, BadShapesAreErrors) {
  auto expect_error = [](const std::function<void()>& fn, const std::string& part) {
    try {
      fn();
      FAIL() << "expected an error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("rope"), std::string::npos) << msg;
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  };
  expect_error([] { rope(Tensor::zeros({1, 2, 1, 3}), 10.0); }, "[1, 2, 1, 3]");
  expect_error([] { rope(Tensor::zeros({2, 4}), 10.0); }, "[2, 4]");
  expect_error([] { rope(Tensor::zeros({1, 2, 1, 4}), 10.0, Tensor::zeros({1, 3}, DType::I64)); },
               "[1, 3]");
  expect_error([] { rope(Tensor::zeros({1, 2, 1, 4}), 10.0, Tensor::zeros({1, 2})); },
               "i32 or i64");
}

// The CUDA kernels against the CPU reference: fresh random inputs, default and long
// explicit positions (i32, i64), NaN-poisoned outputs, f32, bf16 and f64. Skips without a GPU.
TEST(Rope, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 70;
    for (int mode = 0; mode < 3; ++mode) {  // no positions, i32, i64
      const Shape shape{2, 19, 3, 16};
      Tensor positions = mode == 0 ? Tensor()
                                   : testing::random_indices({2, 19}, mode == 1 ? DType::I32 : DType::I64,
                                                             gpu, seed++, 0, 8192);
      Tensor positions_cpu = mode == 0 ? Tensor() : positions.to(Device::cpu());
      const std::string what = "rope positions mode " + std::to_string(mode);
      Tensor x = testing::random_tensor(shape, dtype, gpu, seed++);
      Tensor dy = testing::random_tensor(shape, dtype, gpu, seed++);
      Tensor want = ops::rope(testing::cpu_reference(x), 10000.0, positions_cpu);
      Tensor want_dx = ops::rope_backward(testing::cpu_reference(dy), 10000.0, positions_cpu);
      Tensor y = testing::poisoned(shape, dtype, gpu);
      rope_kernels()(gpu, x, 10000.0, positions, y);
      testing::expect_matches_reference(y, want, dtype, what);
      Tensor dx = testing::poisoned(shape, dtype, gpu);
      rope_backward_kernels()(gpu, dy, 10000.0, positions, dx);
      testing::expect_matches_reference(dx, want_dx, dtype, what + " backward");
    }
  }
}

}  // namespace
}  // namespace ham

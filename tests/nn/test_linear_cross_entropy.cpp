#include "nn/linear_cross_entropy.h"

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear_cross_entropy.h"
#include "nn/cross_entropy.h"
#include "nn/matmul.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;
using testing::relative_rms_error;

struct LceCase {
  int64_t rows, dim, vocab, chunk_rows;
  std::vector<int64_t> ignored_rows;
  DType target_dtype = DType::I64;
};

std::string case_name(const LceCase& c) {
  std::ostringstream out;
  out << "N" << c.rows << "_D" << c.dim << "_V" << c.vocab << "_chunk" << c.chunk_rows;
  if (!c.ignored_rows.empty()) out << "_ignore" << c.ignored_rows.size();
  out << "_" << dtype_name(c.target_dtype);
  return out.str();
}

void PrintTo(const LceCase& c, std::ostream* os) { *os << case_name(c); }

// Random targets in [0, V), ignore_index on the ignored rows.
std::vector<int64_t> make_targets(int64_t rows, int64_t vocab,
                                  const std::vector<int64_t>& ignored_rows, uint64_t seed,
                                  int64_t ignore_index = -100) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t& v : t) v = pick(rng);
  for (int64_t r : ignored_rows) t[size_t(r)] = ignore_index;
  return t;
}

Tensor targets_tensor(const std::vector<int64_t>& t, DType dtype, const Shape& shape = {}) {
  Shape s = shape.empty() ? Shape{int64_t(t.size())} : shape;
  if (dtype == DType::I64) return Tensor::from_vector(t, s);
  std::vector<int32_t> t32(t.begin(), t.end());
  return Tensor::from_vector(t32, s);
}

// The unfused reference: the whole logits from nn::matmul, then nn::cross_entropy.
Tensor unfused_loss(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                    int64_t ignore_index = -100) {
  return cross_entropy(matmul(hidden, weight, false, true), targets, ignore_index);
}

class LinearCrossEntropy : public ::testing::TestWithParam<LceCase> {};

TEST_P(LinearCrossEntropy, MeanAndSumGradcheck) {
  const LceCase& c = GetParam();
  Tensor hidden = randn64({c.rows, c.dim}, 81, 1.0);
  Tensor weight = randn64({c.vocab, c.dim}, 82, 0.7);
  Tensor targets = targets_tensor(make_targets(c.rows, c.vocab, c.ignored_rows, 83), c.target_dtype);
  const int64_t chunk = c.chunk_rows;
  expect_gradcheck(
      [&](const std::vector<Tensor>& v) {
        return std::vector{linear_cross_entropy(v[0], v[1], targets, -100, chunk)};
      },
      {hidden, weight});
  expect_gradcheck(
      [&](const std::vector<Tensor>& v) {
        return std::vector{linear_cross_entropy_sum(v[0], v[1], targets, -100, chunk).loss};
      },
      {hidden, weight});
}

// Only one input requiring grad: the forward computes that gradient alone.
TEST_P(LinearCrossEntropy, GradcheckOneInputAtATime) {
  const LceCase& c = GetParam();
  Tensor hidden = randn64({c.rows, c.dim}, 84, 1.0);
  Tensor weight = randn64({c.vocab, c.dim}, 85, 0.7);
  Tensor targets = targets_tensor(make_targets(c.rows, c.vocab, c.ignored_rows, 86), c.target_dtype);
  Tensor fixed_hidden = detach(hidden), fixed_weight = detach(weight);
  const int64_t chunk = c.chunk_rows;
  expect_gradcheck(
      [&](const std::vector<Tensor>& v) {
        return std::vector{linear_cross_entropy(v[0], fixed_weight, targets, -100, chunk)};
      },
      {hidden});
  expect_gradcheck(
      [&](const std::vector<Tensor>& v) {
        return std::vector{linear_cross_entropy(fixed_hidden, v[0], targets, -100, chunk)};
      },
      {weight});
}

TEST_P(LinearCrossEntropy, ForwardAndGradientsMatchUnfusedF64) {
  const LceCase& c = GetParam();
  Tensor hidden = randn64({c.rows, c.dim}, 87, 1.0);
  Tensor weight = randn64({c.vocab, c.dim}, 88, 0.7);
  Tensor targets = targets_tensor(make_targets(c.rows, c.vocab, c.ignored_rows, 89), c.target_dtype);
  Tensor fused = linear_cross_entropy(hidden, weight, targets, -100, c.chunk_rows);
  Tensor unfused = unfused_loss(hidden, weight, targets);
  EXPECT_EQ(fused.shape(), Shape{});
  EXPECT_NEAR(fused.item(), unfused.item(), 1e-12);
  auto g_fused = gradients({fused}, {hidden, weight});
  auto g_unfused = gradients({unfused}, {hidden, weight});
  EXPECT_LT(testing::max_abs_diff(g_fused[0], g_unfused[0]), 1e-13);
  EXPECT_LT(testing::max_abs_diff(g_fused[1], g_unfused[1]), 1e-13);

  CrossEntropyStats stats = linear_cross_entropy_sum(hidden, weight, targets, -100, c.chunk_rows);
  EXPECT_EQ(stats.count, c.rows - int64_t(c.ignored_rows.size()));
  EXPECT_NEAR(stats.loss.item(), fused.item() * double(stats.count), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearCrossEntropy,
    ::testing::Values(LceCase{6, 4, 7, 0, {}},              // default: one chunk
                      LceCase{7, 3, 5, 3, {1, 5}},          // 3 does not divide 7
                      LceCase{8, 3, 5, 4, {0, 6}},          // 4 divides 8
                      LceCase{5, 2, 6, 1, {2}, DType::I32},  // one row per chunk
                      LceCase{6, 3, 4, 2, {2, 3}},          // a whole chunk ignored
                      LceCase{5, 3, 4, 9, {4}},             // chunk larger than N
                      LceCase{3, 2, 1, 2, {}},              // V = 1
                      LceCase{4, 3, 5, 3, {0, 1, 2, 3}}),   // every row ignored
    [](const ::testing::TestParamInfo<LceCase>& info) { return case_name(info.param); });

TEST(LinearCrossEntropy, DefaultChunkRows) {
  using ops::linear_cross_entropy_chunk_rows;
  constexpr int64_t kCpu = int64_t(1) << 23;
  EXPECT_EQ(linear_cross_entropy_chunk_rows(3, 5, 4), 3);             // small: one chunk
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100000, 1 << 20, 4), 8);  // 2^23 / 2^20
  // 100000 rows of at most 166 (2^23 / 50304): 603 chunks of 166, none rounded past 166.
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100000, 50304, 4), kCpu / 50304);
  // 1000 rows of at most 166: 7 chunks of 143 (not 6 of 166 and one of 4).
  EXPECT_EQ(linear_cross_entropy_chunk_rows(1000, 50304, 4), 143);
  // At most 1024 rows (2^23 / 8192): 1000 rows in one chunk, 5000 in 5 of 1000 rounded up
  // to 1024 (the last chunk then has 904).
  EXPECT_EQ(linear_cross_entropy_chunk_rows(1000, 8192, 4), 1000);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(5000, 8192, 4), 1024);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100000, int64_t(1) << 24, 4), 1);  // at least one row
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100, 1000, 4, 7), 7);    // caller's choice
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100, 1000, 4, 500), 100);  // clamped to N
  // On CUDA chunks are up to 2^28 logits (or V D), for GEMMs long enough to run at full
  // rate: the bench shapes of the H200 (16384 x 32768: 2 of 8192; x 50304: 4 of 4096,
  // not 3 of 5336 and one of 376; 8192 x 128256 at D 4096: 2 of 4096).
  EXPECT_EQ(linear_cross_entropy_chunk_rows(16384, 32768, 2048, 0, Device::cuda()), 8192);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(16384, 50304, 2048, 0, Device::cuda()), 4096);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(8192, 128256, 4096, 0, Device::cuda()), 4096);
  // 100000 rows of at most 2092 (2^28 / 128256, above V D at D 1024): 48 chunks of 2084.
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100000, 128256, 1024, 0, Device::cuda()), 2084);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100000, 1 << 20, 8, 0, Device::cuda()), 256);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(1000, 50304, 8, 0, Device::cuda()), 1000);
}

// The same f64 loss and gradients whatever the chunk size.
TEST(LinearCrossEntropy, ChunkSizeDoesNotChangeTheResult) {
  const int64_t rows = 23, dim = 5, vocab = 11;
  Tensor hidden = randn64({rows, dim}, 90, 1.0);
  Tensor weight = randn64({vocab, dim}, 91, 0.7);
  Tensor targets = Tensor::from_vector(make_targets(rows, vocab, {0, 7, 8, 22}, 92), {rows});
  Tensor reference = linear_cross_entropy(hidden, weight, targets, -100, rows);
  auto reference_grads = gradients({reference}, {hidden, weight});
  for (int64_t chunk : {1, 2, 5, 7, 22, 0, 100}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    Tensor loss = linear_cross_entropy(hidden, weight, targets, -100, chunk);
    EXPECT_NEAR(loss.item(), reference.item(), 1e-13);
    auto grads = gradients({loss}, {hidden, weight});
    EXPECT_LT(testing::max_abs_diff(grads[0], reference_grads[0]), 1e-14);
    EXPECT_LT(testing::max_abs_diff(grads[1], reference_grads[1]), 1e-13);
  }
}

// f32: the fused op against matmul + cross_entropy (forward and both gradients), with
// chunks that do and do not divide N and with ignored rows.
TEST(LinearCrossEntropy, F32MatchesUnfusedPath) {
  const int64_t rows = 70, dim = 24, vocab = 300;
  std::vector<int64_t> t = make_targets(rows, vocab, {3, 4, 31, 69}, 93);
  for (DType target_dtype : {DType::I32, DType::I64}) {
    Tensor targets = targets_tensor(t, target_dtype);
    for (int64_t chunk : {0, 7, 10, 64}) {
      SCOPED_TRACE("chunk_rows " + std::to_string(chunk) + ", " + dtype_name(target_dtype));
      Tensor hidden = set_requires_grad(randn64({rows, dim}, 94, 1.0, false).to(DType::F32));
      Tensor weight = set_requires_grad(randn64({vocab, dim}, 95, 0.5, false).to(DType::F32));
      Tensor fused = linear_cross_entropy(hidden, weight, targets, -100, chunk);
      Tensor unfused = unfused_loss(hidden, weight, targets);
      EXPECT_EQ(fused.dtype(), DType::F32);
      EXPECT_NEAR(fused.item(), unfused.item(), 1e-6 * std::abs(unfused.item()));
      auto g_fused = gradients({fused}, {hidden, weight});
      auto g_unfused = gradients({unfused}, {hidden, weight});
      EXPECT_LE(relative_rms_error(g_fused[0], g_unfused[0]), 1e-6);
      EXPECT_LE(relative_rms_error(g_fused[1], g_unfused[1]), 1e-6);
    }
  }
}

// bf16 inputs on the CPU: the loss is f32, and the result is the f32 path's on the same
// bf16-rounded inputs within bf16 rounding of the per-chunk logits (dW accumulates in f32).
TEST(LinearCrossEntropy, Bf16KeepsTheLossInF32AndTracksTheF32Path) {
  const int64_t rows = 90, dim = 32, vocab = 500;
  Tensor targets = targets_tensor(make_targets(rows, vocab, {5, 60}, 120), DType::I64);
  Tensor hidden = set_requires_grad(randn64({rows, dim}, 121, 1.0, false).to(DType::BF16));
  Tensor weight = set_requires_grad(randn64({vocab, dim}, 122, 0.5, false).to(DType::BF16));
  Tensor hidden32 = set_requires_grad(detach(hidden).to(DType::F32));
  Tensor weight32 = set_requires_grad(detach(weight).to(DType::F32));
  for (int64_t chunk : {0, 16}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    Tensor loss = linear_cross_entropy(hidden, weight, targets, -100, chunk);
    Tensor loss32 = linear_cross_entropy(hidden32, weight32, targets, -100, chunk);
    EXPECT_EQ(loss.dtype(), DType::F32);
    EXPECT_NEAR(loss.item(), loss32.item(), 5e-3 * loss32.item());
    auto g = gradients({loss}, {hidden, weight});
    auto g32 = gradients({loss32}, {hidden32, weight32});
    EXPECT_EQ(g[0].dtype(), DType::BF16);
    EXPECT_EQ(g[1].dtype(), DType::BF16);
    EXPECT_LE(relative_rms_error(g[0], g32[0]), 1e-2);
    EXPECT_LE(relative_rms_error(g[1], g32[1]), 1e-2);
  }
}

TEST(LinearCrossEntropy, LeadingDimsFlattenIntoRows) {
  Tensor hidden = randn64({2, 3, 4}, 96, 1.0);
  Tensor weight = randn64({6, 4}, 97, 0.7);
  Tensor targets = Tensor::from_vector<int64_t>({0, 5, -100, 2, 1, 3}, {2, 3});
  Tensor loss = linear_cross_entropy(hidden, weight, targets, -100, 4);
  Tensor flat = linear_cross_entropy(hidden.reshape({6, 4}), weight, targets.reshape({6}));
  EXPECT_NEAR(loss.item(), flat.item(), 1e-15);
  auto g = gradients({loss}, {hidden});
  EXPECT_EQ(g[0].shape(), (Shape{2, 3, 4}));
  expect_gradcheck(
      [&](const std::vector<Tensor>& v) {
        return std::vector{linear_cross_entropy(v[0], v[1], targets, -100, 4)};
      },
      {hidden, weight});
}

TEST(LinearCrossEntropy, OtherIgnoreIndex) {
  Tensor hidden = randn64({5, 3}, 98, 1.0);
  Tensor weight = randn64({4, 3}, 99, 0.7);
  Tensor targets = Tensor::from_vector<int64_t>({1, 0, 3, 0, 2}, {5});  // ignore_index 0
  Tensor fused = linear_cross_entropy(hidden, weight, targets, 0, 2);
  EXPECT_NEAR(fused.item(), unfused_loss(hidden, weight, targets, 0).item(), 1e-13);
  EXPECT_EQ(linear_cross_entropy_sum(hidden, weight, targets, 0, 2).count, 3);
}

TEST(LinearCrossEntropy, EveryRowIgnoredGivesZeroLossAndGradients) {
  Tensor hidden = randn64({5, 3}, 100, 1.0);
  Tensor weight = randn64({4, 3}, 101, 0.7);
  Tensor targets = Tensor::from_vector<int64_t>({-100, -100, -100, -100, -100}, {5});
  for (int64_t chunk : {0, 2}) {
    Tensor loss = linear_cross_entropy(hidden, weight, targets, -100, chunk);
    EXPECT_EQ(loss.item(), 0.0);
    CrossEntropyStats stats = linear_cross_entropy_sum(hidden, weight, targets, -100, chunk);
    EXPECT_EQ(stats.count, 0);
    EXPECT_EQ(stats.loss.item(), 0.0);
    auto g = gradients({loss}, {hidden, weight});
    for (double v : g[0].to_vector<double>()) EXPECT_EQ(v, 0.0);
    for (double v : g[1].to_vector<double>()) EXPECT_EQ(v, 0.0);
  }
}

// The forward's gradients are scaled by the incoming gradient, not consumed by it: two
// backwards through a kept graph add up, and an upstream factor multiplies them.
TEST(LinearCrossEntropy, BackwardScalesByIncomingGradient) {
  Tensor hidden = randn64({6, 3}, 102, 1.0);
  Tensor weight = randn64({5, 3}, 103, 0.7);
  Tensor targets = Tensor::from_vector(make_targets(6, 5, {1}, 104), {6});
  Tensor loss = linear_cross_entropy(hidden, weight, targets, -100, 4);
  auto once = gradients({loss}, {hidden, weight}, {}, true);
  auto scaled = gradients({loss}, {hidden, weight}, {Tensor::scalar(-2.5, DType::F64)}, true);
  EXPECT_LT(testing::max_abs_diff(scaled[0], ops::scaled(once[0], -2.5)), 1e-15);
  backward(loss, Tensor(), true);
  backward(loss);
  auto twice_h = grad(hidden).to_vector<double>(), once_h = once[0].to_vector<double>();
  for (size_t i = 0; i < once_h.size(); ++i) EXPECT_NEAR(twice_h[i], 2 * once_h[i], 1e-15);
}

TEST(LinearCrossEntropy, NoGradComputesOnlyTheLoss) {
  Tensor hidden = randn64({6, 3}, 105, 1.0);
  Tensor weight = randn64({5, 3}, 106, 0.7);
  Tensor targets = Tensor::from_vector(make_targets(6, 5, {}, 107), {6});
  double with_grad = linear_cross_entropy(hidden, weight, targets).item();
  NoGradGuard no_grad;
  Tensor loss = linear_cross_entropy(hidden, weight, targets);
  EXPECT_EQ(grad_fn(loss), nullptr);
  EXPECT_FALSE(requires_grad(loss));
  EXPECT_EQ(loss.item(), with_grad);
  ops::LinearCrossEntropyResult r = ops::linear_cross_entropy(detach(hidden), detach(weight),
                                                              targets, -100, 4);
  EXPECT_FALSE(r.grad_hidden.defined());
  EXPECT_FALSE(r.grad_weight.defined());
  EXPECT_EQ(r.count, 6);
}

using testing::expect_error;

TEST(LinearCrossEntropy, BadInputErrorsNameOpAndShapes) {
  Tensor hidden = Tensor::zeros({3, 4}, DType::F64);
  Tensor weight = Tensor::zeros({5, 4}, DType::F64);
  Tensor targets = Tensor::from_vector<int64_t>({0, 1, 2}, {3});
  expect_error([&] { linear_cross_entropy(hidden, Tensor::zeros({5, 6}, DType::F64), targets); },
               {"linear_cross_entropy", "hidden [3, 4]", "weight [5, 6]", "targets [3]"});
  expect_error([&] { linear_cross_entropy(hidden, weight, Tensor::from_vector<int64_t>({0, 1}, {2})); },
               {"linear_cross_entropy", "[3, 4]", "[5, 4]", "targets [2]"});
  expect_error([&] { linear_cross_entropy(hidden, Tensor::zeros({4}, DType::F64), targets); },
               {"linear_cross_entropy", "[3, 4]", "weight [4]"});
  expect_error([&] { linear_cross_entropy(Tensor::zeros({4}, DType::F64), weight, targets); },
               {"linear_cross_entropy", "hidden [4]", "[5, 4]"});
  expect_error([&] { linear_cross_entropy(hidden, Tensor::zeros({0, 4}, DType::F64), targets); },
               {"linear_cross_entropy", "[3, 4]", "weight [0, 4]", "V >= 1"});
  expect_error([&] { linear_cross_entropy(hidden, Tensor::zeros({5, 4}), targets); },
               {"linear_cross_entropy", "f64[3, 4]", "f32[5, 4]"});
  expect_error([&] { linear_cross_entropy(hidden, weight, Tensor::zeros({3})); },
               {"linear_cross_entropy", "targets", "f32[3]", "f64[3, 4]"});
  expect_error(
      [&] {
        linear_cross_entropy(Tensor::zeros({3, 4}, DType::I64), Tensor::zeros({5, 4}, DType::I64),
                             targets);
      },
      {"linear_cross_entropy", "i64[3, 4]", "floating"});
  expect_error([&] { linear_cross_entropy(hidden, weight, targets, -100, -1); },
               {"linear_cross_entropy", "chunk_rows", "-1", "[3, 4]"});
  // A bad target names the chunk it is in and the row within that chunk.
  expect_error(
      [&] {
        linear_cross_entropy(hidden, weight, Tensor::from_vector<int64_t>({0, 1, 7}, {3}), -100, 2);
      },
      {"linear_cross_entropy", "rows [2, 3)", "target 7", "row 0", "V = 5"});
  expect_error(
      [&] { linear_cross_entropy(hidden, weight, Tensor::from_vector<int32_t>({-1, 1, 2}, {3})); },
      {"linear_cross_entropy", "rows [0, 3)", "target -1", "V = 5"});
}

// The fused op on CUDA (cuBLASLt GEMMs and the cuda/cross_entropy.cu kernels) against the
// CPU path on fresh random f32 inputs: the loss, the count and both gradients, through the
// differentiable wrapper, for chunks that do and do not divide N, vocabularies short
// (a warp per row) and long (a block per row), i32 and i64 targets. Skips without a GPU.
TEST(LinearCrossEntropy, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  uint64_t seed = 110;
  const int64_t rows = 300, dim = 64;
  // bf16 is compared with the CPU's bf16 path (f32 compute on the same bf16 values).
  for (DType dtype : testing::kGpuDtypes) {
    for (int64_t vocab : {1000, 5000}) {
      for (int64_t chunk : {0, 64, 100}) {
        for (DType index_dtype : {DType::I32, DType::I64}) {
          const std::string what = "linear_cross_entropy " + std::string(dtype_name(dtype)) +
                                   " V=" + std::to_string(vocab) + " chunk " +
                                   std::to_string(chunk) + " " + dtype_name(index_dtype);
          std::vector<int64_t> t = make_targets(rows, vocab, {0, 17, 18, 150, 299}, seed++);
          Tensor targets = targets_tensor(t, index_dtype).to(gpu);
          Tensor hidden =
              set_requires_grad(testing::random_tensor({rows, dim}, dtype, gpu, seed++));
          Tensor weight =
              set_requires_grad(testing::random_tensor({vocab, dim}, dtype, gpu, seed++, 0.3));
          Tensor hidden_cpu = set_requires_grad(hidden.to(Device::cpu()));
          Tensor weight_cpu = set_requires_grad(weight.to(Device::cpu()));
          Tensor targets_cpu = targets.to(Device::cpu());

          CrossEntropyStats want =
              linear_cross_entropy_sum(hidden_cpu, weight_cpu, targets_cpu, -100, chunk);
          CrossEntropyStats got = linear_cross_entropy_sum(hidden, weight, targets, -100, chunk);
          EXPECT_EQ(got.count, want.count) << what;
          EXPECT_EQ(got.loss.device(), gpu) << what;
          EXPECT_EQ(got.loss.dtype(), DType::F32) << what;
          testing::expect_matches_reference(got.loss, want.loss, dtype, what + " loss");
          Tensor upstream = Tensor::scalar(0.7, DType::F32);
          auto want_grads = gradients({want.loss}, {hidden_cpu, weight_cpu}, {upstream});
          auto got_grads = gradients({got.loss}, {hidden, weight}, {upstream.to(gpu)});
          testing::expect_matches_reference(got_grads[0], want_grads[0], dtype, what + " dhidden");
          testing::expect_matches_reference(got_grads[1], want_grads[1], dtype, what + " dweight");

          // The mean, and the loss alone under no-grad.
          Tensor mean = linear_cross_entropy(hidden, weight, targets, -100, chunk);
          testing::expect_matches_reference(
              mean, unfused_loss(detach(hidden_cpu), detach(weight_cpu), targets_cpu), dtype,
              what + " mean");
          NoGradGuard no_grad;
          testing::expect_matches_reference(
              linear_cross_entropy(hidden, weight, targets, -100, chunk), mean, dtype,
              what + " no-grad mean");
        }
      }
    }
  }
  const DType dtype = DType::F32;
  // Every row ignored: zero loss and gradients on the GPU too.
  Tensor hidden = set_requires_grad(testing::random_tensor({9, 8}, dtype, gpu, seed++));
  Tensor weight = set_requires_grad(testing::random_tensor({20, 8}, dtype, gpu, seed++));
  Tensor ignored = Tensor::full({9}, -100, DType::I64, gpu);
  Tensor loss = linear_cross_entropy(hidden, weight, ignored, -100, 4);
  EXPECT_EQ(loss.item(), 0.0);
  auto g = gradients({loss}, {hidden, weight});
  for (double v : g[0].to_vector<double>()) EXPECT_EQ(v, 0.0);
  for (double v : g[1].to_vector<double>()) EXPECT_EQ(v, 0.0);
  // A target out of range is named with its chunk, as on the CPU.
  Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 20, 5}, {6}).to(gpu);
  testing::expect_error(
      [&] { linear_cross_entropy(hidden.slice(0, 6), weight, bad, -100, 4); },
      {"linear_cross_entropy", "rows [4, 6)", "target 20", "row 0", "V = 20"});
}

}  // namespace
}  // namespace ham

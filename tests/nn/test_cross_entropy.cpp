#include "nn/cross_entropy.h"

#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include "autograd/engine.h"
#include "core/ops/cross_entropy.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::max_abs_diff;
using testing::randn64;

struct CrossEntropyCase {
  int64_t rows, vocab;
  std::vector<int64_t> ignored_rows;
  int64_t ignore_index = -100;
  DType target_dtype = DType::I64;
};

std::string case_name(const CrossEntropyCase& c) {
  std::ostringstream out;
  out << c.rows << "x" << c.vocab;
  if (!c.ignored_rows.empty()) out << "_ignore" << c.ignored_rows.size();
  if (c.ignore_index != -100) {
    out << "_index" << (c.ignore_index < 0 ? "m" : "") << std::abs(c.ignore_index);
  }
  out << "_" << dtype_name(c.target_dtype);
  return out.str();
}

void PrintTo(const CrossEntropyCase& c, std::ostream* os) { *os << case_name(c); }

// Random targets in [0, V) that avoid ignore_index, then ignore_index on ignored rows.
std::vector<int64_t> make_targets(const CrossEntropyCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, c.vocab - 1);
  std::vector<int64_t> t(size_t(c.rows));
  for (int64_t& v : t) {
    do v = pick(rng);
    while (v == c.ignore_index && c.vocab > 1);
  }
  for (int64_t r : c.ignored_rows) t[size_t(r)] = c.ignore_index;
  return t;
}

Tensor targets_tensor(const std::vector<int64_t>& t, DType dtype) {
  if (dtype == DType::I64) return Tensor::from_vector(t, {int64_t(t.size())});
  std::vector<int32_t> t32(t.begin(), t.end());
  return Tensor::from_vector(t32, {int64_t(t.size())});
}

// mean over kept rows of (log(sum_j e^z_j) - z_t), with plain exp/log (small logits only).
double naive_loss(const Tensor& logits, const std::vector<int64_t>& targets,
                  int64_t ignore_index) {
  auto z = logits.to_vector<double>();
  int64_t vocab = logits.size(-1), count = 0;
  double total = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == ignore_index) continue;
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(z[r * size_t(vocab) + size_t(j)]);
    total += std::log(s) - z[r * size_t(vocab) + size_t(targets[r])];
    ++count;
  }
  return count ? total / double(count) : 0.0;
}

class CrossEntropy : public ::testing::TestWithParam<CrossEntropyCase> {};

TEST_P(CrossEntropy, MeanAndSumGradcheck) {
  const CrossEntropyCase& c = GetParam();
  Tensor logits = randn64({c.rows, c.vocab}, 61, 2.0);
  Tensor targets = targets_tensor(make_targets(c, 62), c.target_dtype);
  int64_t ii = c.ignore_index;
  expect_gradcheck(
      [&](const std::vector<Tensor>& v) { return std::vector{cross_entropy(v[0], targets, ii)}; },
      {logits});
  expect_gradcheck(
      [&](const std::vector<Tensor>& v) {
        return std::vector{cross_entropy_sum(v[0], targets, ii).loss};
      },
      {logits});
}

TEST_P(CrossEntropy, ForwardMatchesNaiveFormula) {
  const CrossEntropyCase& c = GetParam();
  Tensor logits = randn64({c.rows, c.vocab}, 63, 2.0, false);
  std::vector<int64_t> t = make_targets(c, 64);
  Tensor targets = targets_tensor(t, c.target_dtype);
  Tensor loss = cross_entropy(logits, targets, c.ignore_index);
  EXPECT_EQ(loss.shape(), Shape{});
  EXPECT_NEAR(loss.item(), naive_loss(logits, t, c.ignore_index), 1e-12);
  CrossEntropyStats stats = cross_entropy_sum(logits, targets, c.ignore_index);
  EXPECT_EQ(stats.count, c.rows - int64_t(c.ignored_rows.size()));
  EXPECT_NEAR(stats.loss.item(), loss.item() * double(stats.count), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CrossEntropy,
    ::testing::Values(CrossEntropyCase{4, 7, {}}, CrossEntropyCase{6, 10, {1, 4}},
                      CrossEntropyCase{6, 10, {0, 5}, -100, DType::I32},
                      CrossEntropyCase{5, 4, {2}, 0},    // ignore_index inside [0, V)
                      CrossEntropyCase{5, 4, {3}, -1, DType::I32},
                      CrossEntropyCase{1, 1, {}}, CrossEntropyCase{1, 5, {}},
                      CrossEntropyCase{3, 1, {}},
                      CrossEntropyCase{3, 4, {0, 1, 2}}),  // every row ignored
    [](const ::testing::TestParamInfo<CrossEntropyCase>& info) { return case_name(info.param); });

// dlogits of the mean loss (dloss = 1).
Tensor logits_grad(const Tensor& logits_in, const Tensor& targets, int64_t ignore_index = -100) {
  Tensor logits = logits_in.clone();
  set_requires_grad(logits);
  backward(cross_entropy(logits, targets, ignore_index));
  return grad(logits);
}

TEST(CrossEntropy, IgnoredRowsContributeNothing) {
  CrossEntropyCase c{8, 6, {1, 2, 6}};
  Tensor logits = randn64({8, 6}, 65, 2.0, false);
  std::vector<int64_t> t = make_targets(c, 66);
  // The kept rows alone, copied out.
  std::vector<double> z = logits.to_vector<double>(), kept_z;
  std::vector<int64_t> kept_t, kept_rows;
  for (int64_t r = 0; r < 8; ++r) {
    if (t[size_t(r)] == -100) continue;
    kept_rows.push_back(r);
    kept_t.push_back(t[size_t(r)]);
    kept_z.insert(kept_z.end(), z.begin() + r * 6, z.begin() + r * 6 + 6);
  }
  int64_t kept = int64_t(kept_rows.size());
  Tensor kept_logits = Tensor::from_vector(kept_z, {kept, 6});
  Tensor kept_targets = Tensor::from_vector(kept_t, {kept});
  Tensor targets = Tensor::from_vector(t, {8});

  EXPECT_NEAR(cross_entropy(logits, targets).item(), cross_entropy(kept_logits, kept_targets).item(),
              1e-14);
  auto g = logits_grad(logits, targets).to_vector<double>();
  auto kept_g = logits_grad(kept_logits, kept_targets).to_vector<double>();
  for (int64_t r = 0, k = 0; r < 8; ++r) {
    bool is_kept = k < kept && kept_rows[size_t(k)] == r;
    for (int64_t j = 0; j < 6; ++j) {
      double expected = is_kept ? kept_g[size_t(k * 6 + j)] : 0.0;
      EXPECT_NEAR(g[size_t(r * 6 + j)], expected, 1e-15) << "row " << r << " col " << j;
    }
    if (is_kept) ++k;
  }
}

TEST(CrossEntropy, EveryRowIgnoredGivesZeroLossAndGradient) {
  Tensor logits = randn64({3, 4}, 67, 1.0, false);
  Tensor targets = Tensor::from_vector<int64_t>({-100, -100, -100}, {3});
  EXPECT_EQ(cross_entropy(logits, targets).item(), 0.0);
  CrossEntropyStats stats = cross_entropy_sum(logits, targets);
  EXPECT_EQ(stats.count, 0);
  EXPECT_EQ(stats.loss.item(), 0.0);
  for (double g : logits_grad(logits, targets).to_vector<double>()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropy, GradientMatchesSoftmaxMinusOneHot) {
  Tensor logits = randn64({3, 5}, 68, 1.0, false);
  std::vector<int64_t> t{4, 0, 2};
  auto g = logits_grad(logits, Tensor::from_vector(t, {3})).to_vector<double>();
  auto z = logits.to_vector<double>();
  for (size_t r = 0; r < 3; ++r) {
    double s = 0;
    for (size_t j = 0; j < 5; ++j) s += std::exp(z[r * 5 + j]);
    for (size_t j = 0; j < 5; ++j) {
      double expected = (std::exp(z[r * 5 + j]) / s - (int64_t(j) == t[r] ? 1.0 : 0.0)) / 3.0;
      EXPECT_NEAR(g[r * 5 + j], expected, 1e-15);
    }
  }
}

TEST(CrossEntropy, SumGradientIsCountTimesMeanGradient) {
  CrossEntropyCase c{7, 5, {3}};
  Tensor logits = randn64({7, 5}, 69, 1.0, false);
  Tensor targets = Tensor::from_vector(make_targets(c, 70), {7});
  Tensor leaf = logits.clone();
  set_requires_grad(leaf);
  CrossEntropyStats stats = cross_entropy_sum(leaf, targets);
  backward(stats.loss);
  Tensor mean_grad = logits_grad(logits, targets);
  auto gs = grad(leaf).to_vector<double>(), gm = mean_grad.to_vector<double>();
  for (size_t i = 0; i < gs.size(); ++i) EXPECT_NEAR(gs[i], gm[i] * double(stats.count), 1e-14);
}

TEST(CrossEntropy, F32AgreesWithF64) {
  CrossEntropyCase c{200, 300, {5, 17}};  // big enough for the parallel path
  Tensor logits = randn64({200, 300}, 71, 3.0, false);
  Tensor targets = targets_tensor(make_targets(c, 72), DType::I32);
  Tensor l64 = cross_entropy(logits, targets), l32 = cross_entropy(logits.to(DType::F32), targets);
  EXPECT_EQ(l32.dtype(), DType::F32);
  EXPECT_NEAR(l32.item(), l64.item(), 1e-5 * std::abs(l64.item()));
  EXPECT_LT(max_abs_diff(logits_grad(logits.to(DType::F32), targets), logits_grad(logits, targets)),
            1e-6);
}

TEST(CrossEntropy, StableForHugeLogits) {
  Tensor small = randn64({4, 50}, 73, 1.0, false);
  Tensor targets = Tensor::from_vector<int64_t>({3, 0, 49, 7}, {4});
  double reference = cross_entropy(small, targets).item();
  auto reference_grad = logits_grad(small, targets);
  // Softmax is shift invariant: adding 1e4 to every logit changes nothing.
  std::vector<double> shifted = small.to_vector<double>();
  for (double& v : shifted) v += 1e4;
  Tensor big = Tensor::from_vector(shifted, {4, 50});
  EXPECT_NEAR(cross_entropy(big, targets).item(), reference, 1e-9);
  EXPECT_LT(max_abs_diff(logits_grad(big, targets), reference_grad), 1e-9);
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Logits of size ~1e4 (naive exp overflows): loss = max - z[target] up to e^-large.
    Tensor wide = randn64({4, 50}, 74, 1e4, false).to(dtype);
    double loss = cross_entropy(wide, targets).item();
    EXPECT_TRUE(std::isfinite(loss));
    auto z = wide.to_vector<double>();
    double expected = 0;
    for (size_t r = 0; r < 4; ++r) {
      double m = *std::max_element(z.begin() + long(r) * 50, z.begin() + long(r) * 50 + 50);
      expected += (m - z[r * 50 + size_t(targets.to_vector<int64_t>()[r])]) / 4;
    }
    EXPECT_NEAR(loss, expected, 1e-6 * std::abs(expected) + 1e-3);
    for (double g : logits_grad(wide, targets).to_vector<double>()) EXPECT_TRUE(std::isfinite(g));
  }
}

TEST(CrossEntropy, LeadingDimsFlattenIntoRows) {
  Tensor logits = randn64({2, 3, 5}, 75, 1.0, false);
  Tensor targets = Tensor::from_vector<int64_t>({0, 4, -100, 2, 1, 3}, {2, 3});
  EXPECT_NEAR(cross_entropy(logits, targets).item(),
              cross_entropy(logits.reshape({6, 5}), targets.reshape({6})).item(), 1e-15);
}

using testing::expect_error;

TEST(CrossEntropy, BadInputErrorsNameOpAndShapes) {
  Tensor logits = Tensor::zeros({3, 5}, DType::F64);
  expect_error([&] { cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, 7}, {3})); },
               {"cross_entropy", "row 2", "7", "V = 5"});
  expect_error([&] { cross_entropy(logits, Tensor::from_vector<int32_t>({-1, 1, 2}, {3})); },
               {"cross_entropy", "row 0", "-1", "V = 5"});
  expect_error([&] { cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, 2, 3}, {4})); },
               {"cross_entropy", "[3, 5]", "[4]"});
  expect_error([&] { cross_entropy(Tensor::zeros({5}), Tensor::from_vector<int64_t>({1}, {1})); },
               {"cross_entropy", "[5]", "[1]"});
  expect_error([&] { cross_entropy(logits, Tensor::zeros({3})); },
               {"cross_entropy", "f32[3]", "f64[3, 5]"});
  expect_error([&] { cross_entropy_sum(Tensor::zeros({3, 5}, DType::I64), Tensor::zeros({3}, DType::I64)); },
               {"cross_entropy", "i64[3, 5]"});
}

// The CUDA kernels against the CPU reference: fresh random logits, ignored rows, i32 and
// i64 targets, NaN-poisoned outputs, f32, bf16 and f64; vocabularies short (a warp per row)
// and long (a block per row). Skips without a GPU.
// bf16 logits: lse and the loss are f32 and equal the f32 op's on the same values.
TEST(CrossEntropy, Bf16LogitsGiveAnF32LossAndLse) {
  Tensor logits = testing::random_tensor({6, 300}, DType::BF16, Device::cpu(), 40, 3.0);
  Tensor targets = Tensor::from_vector<int64_t>({0, 299, -100, 7, 150, 1}, {6});
  auto bf = ops::cross_entropy(logits, targets, -100);
  auto f32 = ops::cross_entropy(logits.to(DType::F32), targets, -100);
  EXPECT_EQ(bf.loss_sum.dtype(), DType::F32);
  EXPECT_EQ(bf.lse.dtype(), DType::F32);
  EXPECT_EQ(bf.loss_sum.item(), f32.loss_sum.item());
  EXPECT_EQ(bf.lse.to_vector<float>(), f32.lse.to_vector<float>());
  Tensor logits_grad = set_requires_grad(logits.clone());
  Tensor loss = cross_entropy(logits_grad, targets);
  EXPECT_EQ(loss.dtype(), DType::F32);
  Tensor dlogits = gradients({loss}, {logits_grad})[0];
  EXPECT_EQ(dlogits.dtype(), DType::BF16);
  Tensor logits32 = set_requires_grad(logits.to(DType::F32));
  Tensor want = gradients({cross_entropy(logits32, targets)}, {logits32})[0];
  EXPECT_EQ(dlogits.to_vector<float>(), want.to(DType::BF16).to_vector<float>());
  testing::expect_error([&] { ops::cross_entropy_backward(logits, targets, bf.lse, -100,
                                                          Tensor::scalar(1.0, DType::BF16), 1.0); },
                        {"cross_entropy backward", "f32"});
}

TEST(CrossEntropy, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 50;
    // warp rows as 16-byte packs (100 in f32, 104) and element by element (101; 100 in
    // bf16), block rows as packs (5000) and element by element (2051); the loss summed
    // over more rows than one pass of the sum takes (3000)
    for (const auto& [vocab, rows] : std::vector<std::pair<int64_t, int64_t>>{
             {100, 37}, {101, 37}, {104, 37}, {5000, 37}, {2051, 37}, {33, 3000}}) {
      for (DType index_dtype : {DType::I32, DType::I64}) {
        const std::string what = "cross_entropy V=" + std::to_string(vocab) + " rows " +
                                 std::to_string(rows) + " " +
                                 dtype_name(index_dtype) + " targets";
        std::vector<int64_t> t = testing::random_indices({rows}, DType::I64, Device::cpu(), seed++,
                                                         0, vocab).to_vector<int64_t>();
        t[3] = t[20] = -100;  // ignored rows
        Tensor targets = Tensor::from_vector(t, {rows}).to(index_dtype).to(gpu);
        Tensor logits = testing::random_tensor({rows, vocab}, dtype, gpu, seed++, 3.0);
        Tensor logits_cpu = testing::cpu_reference(logits), targets_cpu = targets.to(Device::cpu());
        auto want = ops::cross_entropy(logits_cpu, targets_cpu, -100);

        // lse and the loss are f32 for f32 and bf16 logits.
        const DType stats = cross_entropy_stats_dtype(dtype);
        Tensor lse = testing::poisoned({rows}, stats, gpu);
        Tensor loss = testing::poisoned({}, stats, gpu);
        int64_t count = cross_entropy_kernels()(gpu, logits, targets, -100, lse, loss);
        EXPECT_EQ(count, want.count) << what;
        testing::expect_matches_reference(lse, want.lse, dtype, what + " lse");
        testing::expect_matches_reference(loss, want.loss_sum, dtype, what + " loss");

        Tensor dloss = Tensor::scalar(1.3, stats, gpu);
        const double scale = 1.0 / double(want.count);
        Tensor want_dlogits = ops::cross_entropy_backward(logits_cpu, targets_cpu, want.lse, -100,
                                                          testing::cpu_reference(dloss), scale);
        Tensor dlogits = testing::poisoned({rows, vocab}, dtype, gpu);
        cross_entropy_backward_kernels()(gpu, logits, targets, lse, -100, dloss, scale, dlogits);
        testing::expect_matches_reference(dlogits, want_dlogits, dtype, what + " dlogits");
      }
    }
  }
  // A target out of range is named as on the CPU.
  Tensor logits = testing::random_tensor({4, 10}, DType::F32, gpu, 1);
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{1, 2, 10, 3}, {4}).to(gpu);
  testing::expect_error([&] { ops::cross_entropy(logits, targets, -100); },
                        {"cross_entropy", "target 10", "row 2", "V = 10"});
}

// The forward and backward in one call (the linear cross-entropy's chunk kernel), on
// `device`, against the two CPU kernels: loss, the gradient written over the logits, and
// the tally of kept rows and the first bad row (offset by row_offset). Row 5 is bad.
void expect_with_grad_matches_cpu(Device device, DType dtype, int64_t vocab, uint64_t seed,
                                  DType index_dtype = DType::I64) {
  const int64_t rows = 9, row_offset = 1000;
  const std::string what = std::string("cross_entropy_with_grad on ") + device.str() + " " +
                           dtype_name(dtype) + " V=" + std::to_string(vocab) + " " +
                           dtype_name(index_dtype) + " targets";
  std::vector<int64_t> t = testing::random_indices({rows}, DType::I64, Device::cpu(), seed, 0,
                                                   vocab).to_vector<int64_t>();
  t[2] = -100;  // ignored
  Tensor logits = testing::random_tensor({rows, vocab}, dtype, device, seed + 1, 3.0);
  Tensor logits_cpu = testing::cpu_reference(logits);
  const double scale = 0.37;
  const DType stats = cross_entropy_stats_dtype(dtype);
  for (bool with_bad_row : {false, true}) {
    std::vector<int64_t> targets_now = t;
    if (with_bad_row) targets_now[5] = vocab;
    Tensor targets = Tensor::from_vector(targets_now, {rows}).to(index_dtype).to(device);
    Tensor targets_cpu = targets.to(Device::cpu());
    Tensor got = logits.clone();
    Tensor loss = testing::poisoned({}, stats, device);
    Tensor tally = Tensor::from_vector<int64_t>({4, 1 << 30}, {2}).to(device);
    cross_entropy_with_grad_kernels()(device, got, targets, -100, scale, row_offset, loss, tally);
    const std::vector<int64_t> counts = tally.to(Device::cpu()).to_vector<int64_t>();
    if (with_bad_row) {  // the bad row is tallied and its gradient is 0; the rest is the caller's
      EXPECT_EQ(counts[1], row_offset + 5) << what;
      for (double v : got.slice(5, 6).to_vector<double>()) ASSERT_EQ(v, 0.0) << what;
      continue;
    }
    auto want = ops::cross_entropy(logits_cpu, targets_cpu, -100);
    Tensor want_dlogits = ops::cross_entropy_backward(
        logits_cpu, targets_cpu, want.lse, -100, Tensor::scalar(1.0, stats), scale);
    EXPECT_EQ(counts[0], 4 + want.count) << what;
    EXPECT_EQ(counts[1], 1 << 30) << what;
    testing::expect_matches_reference(loss, want.loss_sum, dtype, what + " loss");
    testing::expect_matches_reference(got, want_dlogits, dtype, what + " dlogits");
  }
}

TEST(CrossEntropy, WithGradMatchesTheTwoKernelsCpu) {
  uint64_t seed = 70;
  for (int64_t vocab : {7, 300}) {
    expect_with_grad_matches_cpu(Device::cpu(), DType::F64, vocab, seed += 2);
    expect_with_grad_matches_cpu(Device::cpu(), DType::F32, vocab, seed += 2);
  }
}

// Warp rows (100; 101 and 104 packed or not as in GpuMatchesCpu), block rows with the
// whole row kept in shared memory between the passes (5000), unpacked rows (2051), and
// rows longer than that cache (60000: 240 KB in f32, 120 KB in bf16), whose tail is read
// twice; with i64 and i32 targets.
TEST(CrossEntropy, WithGradGpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  uint64_t seed = 90;
  for (DType dtype : testing::kGpuDtypesAndF64) {
    for (int64_t vocab : {100, 101, 104, 5000, 2051, 60000}) {
      for (DType index_dtype : {DType::I64, DType::I32}) {
        expect_with_grad_matches_cpu(Device::cuda(), dtype, vocab, seed += 2, index_dtype);
      }
    }
  }
}

}  // namespace
}  // namespace ham

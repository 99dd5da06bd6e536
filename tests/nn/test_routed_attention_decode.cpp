// routed_attention_decode: queries over a KV cache equal routed_attention_forward over the
// packed sequence the cache came from (CPU, f64), and the CUDA kernels equal the CPU one.
#include "core/ops/routed_attention_decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/ops/routed_attention.h"
#include "tests/testing.h"
#ifdef HAM_WITH_CUDA
#include "cuda/routed_attention.h"
#endif

namespace ham {
namespace {

using testing::randn64;
using testing::time_slice;

struct DecodeCase {
  int64_t batch, queries, q_heads, kv_heads, key_dim, value_dim;
  int64_t history;  // tokens before the queries
  double density;   // selection rate of row 0 (row 1, if any, selects nothing)
  bool value_scaled;
};

void PrintTo(const DecodeCase& c, std::ostream* os) {
  *os << "B" << c.batch << "_n" << c.queries << "_Hq" << c.q_heads << "_Hkv" << c.kv_heads
      << "_Dk" << c.key_dim << "_Dv" << c.value_dim << "_T" << c.history << "_rho" << c.density
      << (c.value_scaled ? "_scaled" : "");
}

// A sequence of history + n tokens, the cache its selected tokens leave (keys, values and
// value scales in order of position, then spare slots of large junk that a kernel reading
// past `visible` would pick up), the last n tokens' queries, and what
// routed_attention_forward gives those queries over the whole sequence.
struct DecodeScenario {
  Tensor q, k_cache, v_cache, value_scale, visible;  // f64 / i64, CPU
  Tensor expected_out, expected_lse;
};

DecodeScenario make_scenario(const DecodeCase& c, uint64_t seed) {
  const int64_t B = c.batch, n = c.queries, T = c.history + n;
  const int64_t Hq = c.q_heads, Hkv = c.kv_heads, Dk = c.key_dim, Dv = c.value_dim;
  const Tensor q = randn64({B, T, Hq, Dk}, seed, 1.0, false);
  const Tensor k = randn64({B, T, Hkv, Dk}, seed + 1, 1.0, false);
  const Tensor v = randn64({B, T, Hkv, Dv}, seed + 2, 1.0, false);
  std::mt19937_64 rng(seed + 3);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<uint8_t> select(size_t(B * T));
  std::vector<double> scales(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      select[size_t(b * T + t)] = b == 0 && uni(rng) < c.density ? 1 : 0;
      if (b >= 2) select[size_t(b * T + t)] = uni(rng) < 0.5 ? 1 : 0;
      scales[size_t(b * T + t)] = 0.2 + 0.8 * uni(rng);
    }
  }
  const Tensor select_t = Tensor::from_vector(select, {B, T});
  const Tensor p = c.value_scaled ? Tensor::from_vector(scales, {B, T}) : Tensor();
  const ops::RoutedAttentionOutput full =
      ops::routed_attention_forward(q, k, v, ops::compact_selection(select_t), p);

  std::vector<int64_t> counts(size_t(B), 0), visible(size_t(B * n));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      counts[size_t(b)] += select[size_t(b * T + t)];
      if (t >= c.history) visible[size_t(b * n + t - c.history)] = counts[size_t(b)];
    }
  }
  const int64_t capacity = *std::max_element(counts.begin(), counts.end()) + 7;
  std::vector<double> k_cache = randn64({B, capacity, Hkv, Dk}, seed + 4, 100.0, false).to_vector<double>();
  std::vector<double> v_cache = randn64({B, capacity, Hkv, Dv}, seed + 5, 100.0, false).to_vector<double>();
  std::vector<double> p_cache(size_t(B * capacity), 1e3);
  const std::vector<double> k_all = k.to_vector<double>(), v_all = v.to_vector<double>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t slot = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (!select[size_t(b * T + t)]) continue;
      std::copy_n(k_all.begin() + (b * T + t) * Hkv * Dk, Hkv * Dk,
                  k_cache.begin() + (b * capacity + slot) * Hkv * Dk);
      std::copy_n(v_all.begin() + (b * T + t) * Hkv * Dv, Hkv * Dv,
                  v_cache.begin() + (b * capacity + slot) * Hkv * Dv);
      p_cache[size_t(b * capacity + slot)] = scales[size_t(b * T + t)];
      ++slot;
    }
  }
  DecodeScenario s;
  s.q = time_slice(q, c.history, n);
  s.k_cache = Tensor::from_vector(k_cache, {B, capacity, Hkv, Dk});
  s.v_cache = Tensor::from_vector(v_cache, {B, capacity, Hkv, Dv});
  if (c.value_scaled) s.value_scale = Tensor::from_vector(p_cache, {B, capacity});
  s.visible = Tensor::from_vector(visible, {B, n});
  s.expected_out = time_slice(full.out, c.history, n);
  s.expected_lse = time_slice(full.lse, c.history, n);
  return s;
}

class RoutedAttentionDecodeCases : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(RoutedAttentionDecodeCases, F64MatchesForwardOverTheSequence) {
  const DecodeScenario s = make_scenario(GetParam(), 11);
  const ops::RoutedAttentionOutput got =
      ops::routed_attention_decode(s.q, s.k_cache, s.v_cache, s.visible, s.value_scale);
  EXPECT_LE(testing::relative_rms_error(got.out, s.expected_out), 1e-13);
  EXPECT_LE(testing::relative_rms_error(got.lse, s.expected_lse), 1e-13);
}

// The CUDA kernels against the CPU kernel in f64 on the same (rounded) values, outputs
// NaN-poisoned; and run to run bit for bit.
void expect_gpu_matches_cpu(const DecodeScenario& s, const std::vector<DType>& dtypes) {
  for (DType dtype : dtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto put = [&](const Tensor& t) {
      return t.defined() ? t.to(dtype).to(Device::cuda()) : Tensor();
    };
    const Tensor q = put(s.q), k = put(s.k_cache), v = put(s.v_cache), p = put(s.value_scale);
    auto reference = [](const Tensor& t) {
      return t.defined() ? testing::cpu_reference(t).to(DType::F64) : Tensor();
    };
    const ops::RoutedAttentionOutput want = ops::routed_attention_decode(
        reference(q), reference(k), reference(v), s.visible, reference(p));
    const Shape out_shape = want.out.shape(), lse_shape = want.lse.shape();
    const DType lse_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
    auto run = [&] {
      ops::RoutedAttentionOutput r{testing::poisoned(out_shape, dtype, Device::cuda()),
                                   testing::poisoned(lse_shape, lse_dtype, Device::cuda())};
      const double scale = ops::routed_attention_scale(0.0, q.size(3));
      routed_attention_decode_kernels()(Device::cuda(), q, k, v, p, s.visible, scale, r.out, r.lse);
      return r;
    };
    const ops::RoutedAttentionOutput got = run();
    testing::expect_matches_reference(got.out, want.out, dtype, "o");
    testing::expect_matches_reference(got.lse, want.lse, dtype, "lse");
    const ops::RoutedAttentionOutput again = run();
    EXPECT_EQ(testing::max_abs_diff(got.out, again.out), 0.0);
    EXPECT_EQ(got.lse.to_vector<double>(), again.lse.to_vector<double>());
  }
}

TEST_P(RoutedAttentionDecodeCases, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  expect_gpu_matches_cpu(make_scenario(GetParam(), 23), testing::kGpuDtypesAndF64);
}

// Every tile size: those the host may pick (8, 16, 32) and 64, taken only when set. At 8
// and 16 keys a tile, a split of 128 keys or more walks 8 tiles or more, so the three-slot
// ring wraps (the automatic choice gives these cases 2 to 4 tiles a split). 64-key tiles
// of f32 heads of 128 x 192 and wider exceed a block's shared memory, so 64 runs in bf16
// only.
TEST_P(RoutedAttentionDecodeCases, GpuMatchesCpuAtEveryTileSize) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const DecodeScenario s = make_scenario(GetParam(), 29);
  for (int keys : {8, 16, 32, 64}) {
    SCOPED_TRACE("keys a tile " + std::to_string(keys));
    const testing::ScopedSetting setting(&cuda::set_attention_decode_keys, keys);
    expect_gpu_matches_cpu(s, keys == 64 ? std::vector<DType>{DType::BF16} : testing::kGpuDtypes);
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RoutedAttentionDecodeCases,
    ::testing::Values(
        DecodeCase{2, 1, 2, 2, 64, 64, 40, 0.5, false},
        DecodeCase{2, 3, 4, 2, 128, 192, 700, 0.25, true},   // grouped heads, value scales
        DecodeCase{1, 1, 10, 10, 128, 192, 3000, 0.05, true},  // the paper's HAM heads
        DecodeCase{1, 1, 2, 2, 64, 64, 4000, 1.0, false},    // dense: many splits
        DecodeCase{1, 2, 3, 1, 36, 20, 150, 1.0, false},     // 3 heads a group; unpacked rows
        DecodeCase{1, 1, 16, 1, 256, 256, 300, 0.5, true},   // 16 heads a group, wide heads
        DecodeCase{3, 1, 8, 2, 64, 512, 100, 0.3, false},    // widest values
        DecodeCase{2, 1, 16, 2, 128, 128, 260, 0.5, true},   // 8 heads a group, as in Llama
        DecodeCase{1, 2, 8, 2, 64, 96, 180, 0.25, false},    // 4 heads a group, narrow values
        DecodeCase{2, 1, 2, 2, 64, 384, 120, 0.5, true},     // no grouping, wide values
        DecodeCase{5, 16, 2, 2, 32, 32, 50, 0.5, false}));   // 80 rows: counts copied to the GPU

// f64, whose P values move in two 16-byte loads per four keys: heads of 64 (32-key tiles)
// and of 512, where no tile of 16 keys or more fits the shared memory of a block, so the
// host picks a smaller one; a tile set too large is a one-line error, as is a size the
// kernel does not take.
TEST(RoutedAttentionDecodeGpu, F64MatchesCpuAndWideHeadsTakeASmallerTile) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  expect_gpu_matches_cpu(make_scenario({2, 1, 4, 2, 64, 64, 300, 0.5, true}, 37), {DType::F64});
  const DecodeScenario s = make_scenario({1, 1, 2, 1, 512, 512, 300, 0.5, true}, 31);
  expect_gpu_matches_cpu(s, {DType::F64});
  const testing::ScopedSetting setting(&cuda::set_attention_decode_keys, 64);
  const Tensor q = s.q.to(Device::cuda()), k = s.k_cache.to(Device::cuda()),
               v = s.v_cache.to(Device::cuda());
  Tensor out = Tensor::empty(s.expected_out.shape(), DType::F64, Device::cuda());
  Tensor lse = Tensor::empty(s.expected_lse.shape(), DType::F64, Device::cuda());
  testing::expect_error(
      [&] {
        routed_attention_decode_kernels()(Device::cuda(), q, k, v, Tensor(), s.visible, 0.1,
                                          out, lse);
      },
      {"routed_attention_decode (cuda)", "Dk = 512, Dv = 512", "at 64 keys a tile",
       "shared memory"});
  testing::expect_error([] { cuda::set_attention_decode_keys(48); },
                        {"set_attention_decode_keys", "48", "0 (automatic), 8, 16, 32 or 64"});
#endif
}

TEST(RoutedAttentionDecode, NothingVisibleGivesZerosAndMinusInfinity) {
  const Tensor q = randn64({1, 2, 2, 8}, 1, 1.0, false);
  const Tensor k = randn64({1, 5, 1, 8}, 2, 1.0, false);
  const Tensor v = randn64({1, 5, 1, 4}, 3, 1.0, false);
  const Tensor visible = Tensor::from_vector(std::vector<int64_t>{0, 0}, {1, 2});
  const ops::RoutedAttentionOutput r = ops::routed_attention_decode(q, k, v, visible);
  for (double x : r.out.to_vector<double>()) EXPECT_EQ(x, 0.0);
  for (double x : r.lse.to_vector<double>()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
}

// bf16 on the CPU runs the f32 kernel on the same values and rounds its output once.
TEST(RoutedAttentionDecode, Bf16OnTheCpuIsTheF32ResultRounded) {
  const DecodeScenario s = make_scenario({2, 2, 4, 2, 16, 12, 30, 0.6, true}, 5);
  auto bf = [](const Tensor& t) { return t.to(DType::BF16); };
  const ops::RoutedAttentionOutput got = ops::routed_attention_decode(
      bf(s.q), bf(s.k_cache), bf(s.v_cache), s.visible, bf(s.value_scale));
  auto wide = [&](const Tensor& t) { return bf(t).to(DType::F32); };
  const ops::RoutedAttentionOutput want = ops::routed_attention_decode(
      wide(s.q), wide(s.k_cache), wide(s.v_cache), s.visible, wide(s.value_scale));
  EXPECT_EQ(got.out.dtype(), DType::BF16);
  EXPECT_EQ(got.out.to_vector<float>(), want.out.to(DType::BF16).to_vector<float>());
  EXPECT_EQ(got.lse.to_vector<float>(), want.lse.to_vector<float>());
}

TEST(RoutedAttentionDecode, BadInputsNameTheArgument) {
  const Tensor q = randn64({2, 1, 4, 8}, 1, 1.0, false);
  const Tensor k = randn64({2, 6, 2, 8}, 2, 1.0, false);
  const Tensor v = randn64({2, 6, 2, 4}, 3, 1.0, false);
  const Tensor visible = Tensor::from_vector(std::vector<int64_t>{3, 6}, {2, 1});
  using testing::expect_error;
  const char* op = "routed_attention_decode";
  expect_error([&] { ops::routed_attention_decode(q, k, v, Tensor::from_vector(std::vector<int64_t>{3, 7}, {2, 1})); },
               {op, "visible[1, 0] = 7", "outside [0, C = 6]"});
  expect_error([&] { ops::routed_attention_decode(q, k, v, Tensor::from_vector(std::vector<int64_t>{-1, 0}, {2, 1})); },
               {op, "visible[0, 0] = -1"});
  expect_error([&] { ops::routed_attention_decode(q, k, v, visible.to(DType::I32)); },
               {op, "visible", "i64 tensor on the CPU"});
  expect_error([&] { ops::routed_attention_decode(q, k, v, Tensor::from_vector(std::vector<int64_t>{1}, {1, 1})); },
               {op, "visible [1, 1]", "[B, n] = [2, 1]"});
  expect_error([&] { ops::routed_attention_decode(q, randn64({2, 6, 3, 8}, 4, 1.0, false), randn64({2, 6, 3, 4}, 5, 1.0, false), visible); },
               {op, "q heads (4)", "multiple of the cache's heads (3)"});
  expect_error([&] { ops::routed_attention_decode(q, k, randn64({2, 5, 2, 4}, 6, 1.0, false), visible); },
               {op, "v_cache [2, 5, 2, 4]", "B, C and heads of k_cache [2, 6, 2, 8]"});
  expect_error([&] { ops::routed_attention_decode(q, k.to(DType::F32), v, visible); },
               {op, "share one dtype"});
  expect_error([&] { ops::routed_attention_decode(q, k, v, visible, randn64({2, 5}, 7, 1.0, false)); },
               {op, "value_scale [2, 5]", "[B, C] = [2, 6]"});
}

}  // namespace
}  // namespace ham

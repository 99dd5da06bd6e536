#include "core/random.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>
#include <set>
#include <string>

namespace ham {
namespace {

using Words = std::array<uint32_t, 4>;

// Random123's published known-answer vectors for Philox4x32-10.
TEST(Philox, KnownAnswerZeroCounterZeroKey) {
  EXPECT_EQ(philox4x32_10(Words{0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(Philox, KnownAnswerAllOnes) {
  EXPECT_EQ(philox4x32_10(Words{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, KnownAnswerPiDigits) {
  EXPECT_EQ(philox4x32_10(Words{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, StreamBlockUsesDocumentedCounterAndKey) {
  uint64_t seed = 0x0123456789abcdefull, counter = 0xfedcba9876543210ull;
  PhiloxBlock b = rng::stream_block(seed, counter, 7);
  Words expected = philox4x32_10(Words{0x76543210u, 0xfedcba98u, 7u, 0u},
                                 {0x89abcdefu, 0x01234567u});
  EXPECT_EQ((Words{b.word[0], b.word[1], b.word[2], b.word[3]}), expected);
}

TEST(Philox, BoundedMultiplyMatchesInt128) {
  uint64_t cases[][2] = {{0, 0},
                         {1, 1},
                         {~0ull, ~0ull},
                         {~0ull, 2},
                         {0x123456789abcdef0ull, 0x0fedcba987654321ull},
                         {1ull << 63, 3}};
  for (auto& c : cases) {
    unsigned __int128 full = (unsigned __int128)c[0] * c[1];
    uint64_t low = 0;
    uint64_t high = rng::multiply_high_low_64(c[0], c[1], low);
    EXPECT_EQ(high, uint64_t(full >> 64));
    EXPECT_EQ(low, uint64_t(full));
  }
}

TEST(RandomGenerator, AdvanceReservesBlocks) {
  Generator gen(42);
  EXPECT_EQ(gen.seed(), 42u);
  EXPECT_EQ(gen.offset(), 0u);
  EXPECT_EQ(gen.advance(5), 0u);
  EXPECT_EQ(gen.advance(3), 5u);
  EXPECT_EQ(gen.offset(), 8u);
  gen.set_state(7, 100);
  EXPECT_EQ(gen.seed(), 7u);
  EXPECT_EQ(gen.offset(), 100u);
  gen.set_state(7, std::numeric_limits<uint64_t>::max() - 1);
  EXPECT_THROW(gen.advance(2), Error);
}

TEST(RandomGenerator, FillsAdvanceByBlocksConsumed) {
  Generator gen(1);
  uniform({10}, gen);  // 4 per block
  EXPECT_EQ(gen.offset(), 3u);
  uniform({10}, gen, 0, 1, DType::F64);  // 2 per block
  EXPECT_EQ(gen.offset(), 8u);
  normal({2, 5}, gen, 0, 1, DType::BF16);  // 4 per block
  EXPECT_EQ(gen.offset(), 11u);
  truncated_normal({3}, gen, 0, 1, 2, DType::F64);  // 2 per block
  EXPECT_EQ(gen.offset(), 13u);
  randint({5}, gen, 0, 10);  // 2 per block
  EXPECT_EQ(gen.offset(), 16u);
  uniform({0}, gen);
  EXPECT_EQ(gen.offset(), 16u);
  std::vector<int64_t> v(100);
  shuffle(v, gen);  // 99 swaps, 2 per block
  EXPECT_EQ(gen.offset(), 66u);
  EXPECT_EQ(random_blocks_needed(RandomDistribution::Normal, DType::F32, 9), 3u);
  EXPECT_EQ(random_values_per_block(RandomDistribution::Uniform, DType::F64), 2);
}

// Every fill, in each floating dtype it supports, as a function of a stream.
struct NamedFill {
  std::string name;
  std::function<Tensor(const Shape&, const RandomStream&)> by_stream;
  std::function<Tensor(const Shape&, Generator&)> by_generator;
  int per_block;
};

std::vector<NamedFill> all_fills() {
  std::vector<NamedFill> fills;
  for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
    std::string suffix = std::string("/") + dtype_name(dtype);
    int per = dtype == DType::F64 ? 2 : 4;
    fills.push_back({"uniform" + suffix,
                     [=](const Shape& s, const RandomStream& r) {
                       return uniform(s, r, -1, 3, dtype);
                     },
                     [=](const Shape& s, Generator& g) { return uniform(s, g, -1, 3, dtype); },
                     per});
    fills.push_back({"normal" + suffix,
                     [=](const Shape& s, const RandomStream& r) {
                       return normal(s, r, 1, 2, dtype);
                     },
                     [=](const Shape& s, Generator& g) { return normal(s, g, 1, 2, dtype); },
                     per});
    fills.push_back({"truncated_normal" + suffix,
                     [=](const Shape& s, const RandomStream& r) {
                       return truncated_normal(s, r, 0, 1, 0.5, dtype);
                     },
                     [=](const Shape& s, Generator& g) {
                       return truncated_normal(s, g, 0, 1, 0.5, dtype);
                     },
                     per});
  }
  for (DType dtype : {DType::I64, DType::I32, DType::F64}) {
    fills.push_back({std::string("randint/") + dtype_name(dtype),
                     [=](const Shape& s, const RandomStream& r) {
                       return randint(s, r, -1000, 1000, dtype);
                     },
                     [=](const Shape& s, Generator& g) {
                       return randint(s, g, -1000, 1000, dtype);
                     },
                     2});
  }
  return fills;
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

std::vector<double> concat(std::vector<double> a, const std::vector<double>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(RandomFill, SameSeedAndOffsetGiveIdenticalTensors) {
  for (const NamedFill& fill : all_fills()) {
    SCOPED_TRACE(fill.name);
    Generator a(1234), b(1234);
    a.advance(17);
    b.advance(17);
    Tensor x = fill.by_generator({7, 9}, a), y = fill.by_generator({7, 9}, b);
    EXPECT_EQ(values(x), values(y));
    EXPECT_EQ(a.offset(), b.offset());
    EXPECT_EQ(x.shape(), (Shape{7, 9}));
  }
}

TEST(RandomFill, DifferentOffsetsOrSeedsGiveDifferentValues) {
  for (const NamedFill& fill : all_fills()) {
    SCOPED_TRACE(fill.name);
    auto base = values(fill.by_stream({64}, {5, 0, 0}));
    auto shifted = values(fill.by_stream({64}, {5, 1000, 0}));
    auto reseeded = values(fill.by_stream({64}, {6, 0, 0}));
    EXPECT_NE(base, shifted);
    EXPECT_NE(base, reseeded);
    // Consecutive fills from one generator do not repeat each other either.
    Generator gen(5);
    EXPECT_NE(values(fill.by_generator({64}, gen)), values(fill.by_generator({64}, gen)));
  }
}

// The rank-split property: a fill of N elements equals a fill of the first K elements
// followed by a fill of the remaining N - K started at element K, for every K.
TEST(RandomFill, SplitAtAnyElementMatchesWholeFill) {
  const int64_t n = 23;
  for (const NamedFill& fill : all_fills()) {
    SCOPED_TRACE(fill.name);
    RandomStream whole{99, 12345, 0};
    auto expected = values(fill.by_stream({n}, whole));
    for (int64_t k = 0; k <= n; ++k) {
      SCOPED_TRACE(k);
      auto head = values(fill.by_stream({k}, whole));
      auto tail = values(fill.by_stream({n - k}, RandomStream{99, 12345, uint64_t(k)}));
      EXPECT_EQ(concat(head, tail), expected);
    }
  }
}

// With split points on a block boundary the second part is simply the next fill of the
// same generator (its offset has advanced by exactly the blocks the first part used).
TEST(RandomFill, ConsecutiveGeneratorFillsMatchWholeFillAtBlockBoundaries) {
  for (const NamedFill& fill : all_fills()) {
    SCOPED_TRACE(fill.name);
    const int64_t n = 6 * fill.per_block;
    Generator whole(77);
    whole.advance(3);
    auto expected = values(fill.by_generator({n}, whole));
    for (int64_t k = 0; k <= n; k += fill.per_block) {
      Generator split(77);
      split.advance(3);
      auto head = values(fill.by_generator({k}, split));
      EXPECT_EQ(split.offset(), 3u + uint64_t(k / fill.per_block));
      auto tail = values(fill.by_generator({n - k}, split));
      EXPECT_EQ(concat(head, tail), expected);
      EXPECT_EQ(split.offset(), whole.offset());
    }
  }
}

// Ranks holding row blocks of a [rows, cols] weight reproduce the whole initialisation.
TEST(RandomFill, RowShardsReproduceWholeMatrix) {
  const int64_t rows = 10, cols = 7;
  Generator gen(2024);
  RandomStream whole{gen.seed(), gen.offset(), 0};
  Tensor full = normal({rows, cols}, gen, 0, 0.02);
  for (int64_t r0 : {0, 3, 4, 9}) {
    int64_t r1 = std::min(rows, r0 + 3);
    RandomStream shard = whole;
    shard.first_element = uint64_t(r0 * cols);
    Tensor part = normal({r1 - r0, cols}, shard, 0, 0.02);
    EXPECT_EQ(values(part), values(full.slice(r0, r1)));
  }
}

TEST(RandomFill, ThreadCountDoesNotChangeValues) {
  const Shape shape{1 << 17};
  RandomStream stream{3, 5, 2};
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto serial_uniform = values(uniform(shape, stream));
  auto serial_normal = values(truncated_normal(shape, stream, 0, 1, 1, DType::F64));
  auto serial_int = values(randint(shape, stream, 0, 1000003));
  omp_set_num_threads(4);
  EXPECT_EQ(values(uniform(shape, stream)), serial_uniform);
  EXPECT_EQ(values(truncated_normal(shape, stream, 0, 1, 1, DType::F64)), serial_normal);
  EXPECT_EQ(values(randint(shape, stream, 0, 1000003)), serial_int);
  omp_set_num_threads(saved);
}

TEST(RandomFill, ElementFormulaMatchesDocumentedLayout) {
  uint64_t seed = 11, offset = 40;
  auto u32 = uniform({6}, RandomStream{seed, offset, 0}).to_vector<float>();
  auto u64 = uniform({3}, RandomStream{seed, offset, 0}, 0, 1, DType::F64).to_vector<double>();
  for (int i = 0; i < 6; ++i) {
    PhiloxBlock b = rng::stream_block(seed, offset + uint64_t(i / 4));
    EXPECT_EQ(u32[size_t(i)], float((b.word[i % 4] >> 8) * std::ldexp(1.0, -24)));
  }
  for (int i = 0; i < 3; ++i) {
    PhiloxBlock b = rng::stream_block(seed, offset + uint64_t(i / 2));
    uint64_t bits = ((uint64_t(b.word[2 * (i % 2)]) << 32) | b.word[2 * (i % 2) + 1]) >> 11;
    EXPECT_EQ(u64[size_t(i)], double(bits) * std::ldexp(1.0, -53));
  }
  // f64 normal: u1 from words 0-1, u2 from words 2-3; element 0 is cos, element 1 sin.
  auto z = normal({2}, RandomStream{seed, offset, 0}, 0, 1, DType::F64).to_vector<double>();
  PhiloxBlock b = rng::stream_block(seed, offset);
  double u1 = (double(((uint64_t(b.word[0]) << 32 | b.word[1]) >> 11)) + 1) * std::ldexp(1.0, -53);
  double u2 = double((uint64_t(b.word[2]) << 32 | b.word[3]) >> 11) * std::ldexp(1.0, -53);
  EXPECT_DOUBLE_EQ(z[0], std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2));
  EXPECT_DOUBLE_EQ(z[1], std::sqrt(-2 * std::log(u1)) * std::sin(2 * std::numbers::pi * u2));
}

struct Moments {
  double mean = 0, std = 0, min = 0, max = 0;
};

Moments moments(const std::vector<double>& v) {
  Moments m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(ss / double(v.size() - 1));
  m.min = *std::min_element(v.begin(), v.end());
  m.max = *std::max_element(v.begin(), v.end());
  return m;
}

// Bounds are about 5 standard errors for n = 1e5.
TEST(RandomStats, UniformMeanAndVarianceF32AndF64) {
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(8);
    auto v = values(uniform({100000}, gen, -3, 5, dtype));
    Moments m = moments(v);
    EXPECT_NEAR(m.mean, 1.0, 8 * 0.0046);
    EXPECT_NEAR(m.std * m.std, 64.0 / 12.0, 64 * 0.0013);
    EXPECT_GE(m.min, -3.0);
    EXPECT_LT(m.max, 5.0);
    auto unit = values(uniform({100000}, gen, 0, 1, dtype));
    Moments mu = moments(unit);
    EXPECT_NEAR(mu.mean, 0.5, 0.0046);
    EXPECT_NEAR(mu.std * mu.std, 1.0 / 12.0, 0.0013);
    EXPECT_GE(mu.min, 0.0);
    EXPECT_LT(mu.max, 1.0);
  }
}

TEST(RandomStats, NormalMeanStdAndTailF32AndF64) {
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(9);
    auto v = values(normal({100000}, gen, 3, 2, dtype));
    Moments m = moments(v);
    EXPECT_NEAR(m.mean, 3.0, 2 * 0.016);
    EXPECT_NEAR(m.std, 2.0, 2 * 0.012);
    double within_one_std =
        double(std::count_if(v.begin(), v.end(), [](double x) { return std::abs(x - 3) < 2; })) /
        double(v.size());
    EXPECT_NEAR(within_one_std, 0.682689, 0.0075);
    for (double x : v) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(RandomStats, TruncatedNormalStaysWithinBoundWithTruncatedStd) {
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(10);
    auto v = values(truncated_normal({100000}, gen, 0.5, 0.1, 2, dtype));
    Moments m = moments(v);
    EXPECT_GE(m.min, 0.5 - 0.2 * (1 + 1e-6));
    EXPECT_LE(m.max, 0.5 + 0.2 * (1 + 1e-6));
    EXPECT_NEAR(m.mean, 0.5, 0.1 * 0.016);
    // Var of N(0,1) truncated to [-2, 2]: 1 - 2*2*phi(2)/(Phi(2)-Phi(-2)) = 0.773741.
    EXPECT_NEAR(m.std, 0.1 * std::sqrt(0.773741), 0.1 * 0.012);
    // Values near the bound are not piled up (no clamping in practice).
    double near_edge = double(std::count_if(v.begin(), v.end(), [](double x) {
                         return std::abs(x - 0.5) > 0.1999;
                       })) /
                       double(v.size());
    EXPECT_LT(near_edge, 0.001);
  }
}

TEST(RandomStats, RandintRangeAndUniformCounts) {
  Generator gen(11);
  auto v = randint({100000}, gen, -3, 7).to_vector<int64_t>();
  std::map<int64_t, int> counts;
  for (int64_t x : v) counts[x]++;
  ASSERT_EQ(counts.size(), 10u);
  EXPECT_EQ(counts.begin()->first, -3);
  EXPECT_EQ(counts.rbegin()->first, 6);
  for (auto [value, count] : counts) EXPECT_NEAR(count, 10000, 480) << value;
}

TEST(RandomStats, RandintDtypesAndExtremeRanges) {
  Generator gen(12);
  Tensor bytes = randint({1000}, gen, 0, 256, DType::U8);
  EXPECT_EQ(bytes.dtype(), DType::U8);
  Tensor i32 = randint({1000}, gen, -5, 5, DType::I32);
  EXPECT_EQ(i32.dtype(), DType::I32);
  for (int32_t x : i32.to_vector<int32_t>()) EXPECT_TRUE(x >= -5 && x < 5);
  // Beyond 2^53: integer path, no rounding through double.
  const int64_t big = int64_t(1) << 62;
  for (int64_t x : randint({1000}, gen, big, big + 3).to_vector<int64_t>()) {
    EXPECT_TRUE(x >= big && x < big + 3) << x;
  }
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  const int64_t highest = std::numeric_limits<int64_t>::max();
  auto wide = randint({1000}, gen, lowest, highest).to_vector<int64_t>();
  EXPECT_GT(std::set<int64_t>(wide.begin(), wide.end()).size(), 990u);
  EXPECT_TRUE(std::any_of(wide.begin(), wide.end(), [](int64_t x) { return x < 0; }));
  EXPECT_TRUE(std::any_of(wide.begin(), wide.end(), [](int64_t x) { return x > 0; }));
  for (int64_t x : randint({100}, gen, 5, 6).to_vector<int64_t>()) EXPECT_EQ(x, 5);
}

TEST(RandomShuffle, IsADeterministicPermutation) {
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  Generator a(13), b(13);
  auto x = identity, y = identity;
  shuffle(x, a);
  shuffle(y, b);
  EXPECT_EQ(x, y);
  EXPECT_NE(x, identity);
  auto sorted = x;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);
  auto z = identity;
  shuffle(z, a);  // the next shuffle uses new blocks
  EXPECT_NE(z, x);
  std::vector<int64_t> empty, one{4};
  shuffle(empty, a);
  shuffle(one, a);
  EXPECT_EQ(one, std::vector<int64_t>{4});
}

TEST(RandomShuffle, AllPermutationsOfThreeEquallyLikely) {
  Generator gen(14);
  std::map<std::vector<int64_t>, int> counts;
  for (int trial = 0; trial < 60000; ++trial) {
    std::vector<int64_t> v{0, 1, 2};
    shuffle(v, gen);
    counts[v]++;
  }
  ASSERT_EQ(counts.size(), 6u);
  for (auto& [perm, count] : counts) EXPECT_NEAR(count, 10000, 460);
}

void expect_one_line_error(const std::function<void()>& fn, const std::string& keyword) {
  try {
    fn();
    ADD_FAILURE() << "expected a ham::Error containing '" << keyword << "'";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(keyword), std::string::npos) << message;
  }
}

TEST(RandomErrors, BadArgumentsThrowOneLineAndLeaveGeneratorAlone) {
  Generator gen(15);
  gen.advance(4);
  expect_one_line_error([&] { uniform({3}, gen, 0, 1, DType::I64); }, "not floating");
  expect_one_line_error([&] { normal({3}, gen, 0, 1, DType::U8); }, "not floating");
  expect_one_line_error([&] { uniform({3}, gen, 2, 1); }, "lo = 2 > hi = 1");
  expect_one_line_error([&] { normal({3}, gen, 0, -1); }, "negative");
  expect_one_line_error([&] { normal({3}, gen, NAN, 1); }, "not finite");
  expect_one_line_error([&] { truncated_normal({3}, gen, 0, 1, 0); }, "bound");
  expect_one_line_error([&] { randint({3}, gen, 5, 5); }, "empty range [5, 5)");
  expect_one_line_error([&] { randint({3}, gen, 0, 300, DType::U8); }, "does not fit dtype u8");
  expect_one_line_error([&] { uniform({-2, 3}, gen); }, "[-2, 3]");
  EXPECT_EQ(gen.offset(), 4u);
}

TEST(RandomFill, CudaFillMatchesCpuFill) {
  if (!has_device_backend(DeviceKind::CUDA)) GTEST_SKIP() << "this build has no CUDA backend";
  Tensor on_device;
  try {
    on_device = uniform({1000}, RandomStream{1, 2, 3}, 0, 1, DType::F32, Device::cuda());
  } catch (const Error& e) {
    GTEST_SKIP() << "no usable GPU: " << e.what();
  }
  EXPECT_TRUE(on_device.device().is_cuda());
  EXPECT_EQ(values(on_device), values(uniform({1000}, RandomStream{1, 2, 3})));
}

}  // namespace
}  // namespace ham

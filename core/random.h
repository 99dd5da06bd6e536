#pragma once
// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel
// random numbers: as easy as 1, 2, 3", SC 2011) and the fills built on it.
//
// A fill never depends on the device, the thread count or how the tensor is split across
// ranks: every element's value is a pure function of (seed, offset, element index).
//
// Stream layout. A Generator holds (seed, offset); `offset` counts 128-bit Philox blocks
// already handed out. A fill reserves the blocks it needs with advance() and then
//   block(c, attempt) = philox4x32_10(counter = {lo32(c), hi32(c), attempt, 0},
//                                     key     = {lo32(seed), hi32(seed)})
//   element i of the fill reads block c = offset + i / per, at position p = i % per,
// where `per` (values per block) is:
//   uniform          f32/bf16: 4  (word p, top 24 bits: u = (w >> 8) * 2^-24, in [0, 1))
//                    f64:      2  (words 2p, 2p+1: u = ((w0 << 32 | w1) >> 11) * 2^-53)
//   normal,          f32/bf16: 4  (Box-Muller on words (2*(p/2), 2*(p/2)+1); cos for even p,
//   truncated_normal                sin for odd p; u1 = (w_a + 1) * 2^-32, u2 = w_b * 2^-32)
//                    f64:      2  (u1 = (53 bits of words 0,1 + 1) * 2^-53,
//                                  u2 = 53 bits of words 2,3 * 2^-53; cos for p = 0, sin p = 1)
//   randint, shuffle:          2  (64-bit x = w_2p << 32 | w_2p+1, Lemire's bounded multiply)
// Box-Muller uses u1 in (0, 1], so log(u1) is finite. Rejection sampling (truncated_normal
// outside the bound, randint's biased zone) retries element i with attempt = 1, 2, ...
// in counter word 2, so a retry never touches another element's or another fill's blocks.
// Floating values are computed in f64 and rounded once to the output dtype.
//
// Generator is not thread-safe; fills parallelise internally.
#include <array>
#include <cstdint>
#include <math.h>  // ::log, ::sqrt, ::cos, ::sin: callable from host and CUDA device code
#include <vector>

#include "core/tensor.h"

#ifndef HAM_HOST_DEVICE
#if defined(__CUDACC__)
#define HAM_HOST_DEVICE __host__ __device__
#else
#define HAM_HOST_DEVICE
#endif
#endif

namespace ham {

constexpr uint32_t kPhiloxMultiplier0 = 0xD2511F53u;
constexpr uint32_t kPhiloxMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

struct PhiloxBlock {
  uint32_t word[4];
};

// One round: (c0, c1, c2, c3) -> (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)),
// with the key bumped by the Weyl constants before every round but the first.
HAM_HOST_DEVICE inline PhiloxBlock philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                 uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      k0 += kPhiloxWeyl0;
      k1 += kPhiloxWeyl1;
    }
    uint64_t product0 = uint64_t(kPhiloxMultiplier0) * c0;
    uint64_t product1 = uint64_t(kPhiloxMultiplier1) * c2;
    uint32_t next0 = uint32_t(product1 >> 32) ^ c1 ^ k0;
    uint32_t next2 = uint32_t(product0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(product1);
    c3 = uint32_t(product0);
    c0 = next0;
    c2 = next2;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// Device code can call this too when compiled with --expt-relaxed-constexpr (ham_cuda is);
// std::array's operator[] is a constexpr host function.
HAM_HOST_DEVICE inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                                             std::array<uint32_t, 2> key) {
  PhiloxBlock b = philox4x32_10(counter[0], counter[1], counter[2], counter[3], key[0], key[1]);
  return {b.word[0], b.word[1], b.word[2], b.word[3]};
}

namespace rng {

// Block c of the stream keyed by `seed` (see the layout above).
HAM_HOST_DEVICE inline PhiloxBlock stream_block(uint64_t seed, uint64_t counter,
                                                uint32_t attempt = 0) {
  return philox4x32_10(uint32_t(counter), uint32_t(counter >> 32), attempt, 0u, uint32_t(seed),
                       uint32_t(seed >> 32));
}

// k * 2^-24 for the top 24 bits: exact in f32, in [0, 1).
HAM_HOST_DEVICE inline double unit_from_24_bits(uint32_t w) {
  return double(w >> 8) * (1.0 / 16777216.0);
}
HAM_HOST_DEVICE inline uint64_t top_53_bits(uint32_t high_word, uint32_t low_word) {
  return ((uint64_t(high_word) << 32) | low_word) >> 11;
}
// k * 2^-53 for 53 bits of two words: exact in f64, in [0, 1).
HAM_HOST_DEVICE inline double unit_from_53_bits(uint32_t high_word, uint32_t low_word) {
  return double(top_53_bits(high_word, low_word)) * (1.0 / 9007199254740992.0);
}

HAM_HOST_DEVICE inline int normal_values_per_block(bool f64) { return f64 ? 2 : 4; }
HAM_HOST_DEVICE inline int uniform_values_per_block(bool f64) { return f64 ? 2 : 4; }
constexpr int kIntegerValuesPerBlock = 2;
// After this many rejected attempts a sampler gives up (probability < 0.05^1024 for the
// default truncation; < 2^-1024 for randint) and clamps / accepts.
constexpr uint32_t kMaxAttempts = 1024;

// Uniform [0, 1) value at position p of a block.
HAM_HOST_DEVICE inline double uniform_from_block(const PhiloxBlock& b, int p, bool f64) {
  return f64 ? unit_from_53_bits(b.word[2 * p], b.word[2 * p + 1])
             : unit_from_24_bits(b.word[p]);
}

// Standard normal value at position p of a block (Box-Muller, both outputs used).
HAM_HOST_DEVICE inline double normal_from_block(const PhiloxBlock& b, int p, bool f64) {
  double u1, u2;  // u1 in (0, 1] so that log(u1) is finite; u2 in [0, 1)
  if (f64) {
    u1 = (double(top_53_bits(b.word[0], b.word[1])) + 1.0) * (1.0 / 9007199254740992.0);
    u2 = unit_from_53_bits(b.word[2], b.word[3]);
  } else {
    int first = p & 2;
    u1 = (double(b.word[first]) + 1.0) * (1.0 / 4294967296.0);
    u2 = double(b.word[first + 1]) * (1.0 / 4294967296.0);
  }
  double radius = ::sqrt(-2.0 * ::log(u1));
  double angle = 6.283185307179586476925 * u2;
  return (p & 1) ? radius * ::sin(angle) : radius * ::cos(angle);
}

// Standard normal restricted to [-bound, bound] by deterministic rejection: attempt k
// re-reads the same position of block (counter, attempt k).
HAM_HOST_DEVICE inline double truncated_normal_from_block(const PhiloxBlock& first_attempt,
                                                          uint64_t seed, uint64_t counter,
                                                          int p, bool f64, double bound) {
  double z = normal_from_block(first_attempt, p, f64);
  for (uint32_t attempt = 1; (z < -bound || z > bound) && attempt < kMaxAttempts; ++attempt) {
    z = normal_from_block(stream_block(seed, counter, attempt), p, f64);
  }
  return z < -bound ? -bound : (z > bound ? bound : z);
}

// Full 128-bit product a * b; returns the high 64 bits and stores the low 64 in `low`.
HAM_HOST_DEVICE inline uint64_t multiply_high_low_64(uint64_t a, uint64_t b, uint64_t& low) {
  uint64_t a_lo = uint32_t(a), a_hi = a >> 32, b_lo = uint32_t(b), b_hi = b >> 32;
  uint64_t p00 = a_lo * b_lo, p01 = a_lo * b_hi, p10 = a_hi * b_lo, p11 = a_hi * b_hi;
  uint64_t middle = (p00 >> 32) + uint32_t(p01) + uint32_t(p10);
  low = (middle << 32) | uint32_t(p00);
  return p11 + (p01 >> 32) + (p10 >> 32) + (middle >> 32);
}

// Uniform integer in [0, range), range >= 1, from position p (of 2) of a block.
// Lemire's method: hi64(x * range) is exact once the low half is past 2^64 mod range;
// otherwise retry with the next attempt.
HAM_HOST_DEVICE inline uint64_t bounded_from_block(const PhiloxBlock& first_attempt,
                                                   uint64_t seed, uint64_t counter, int p,
                                                   uint64_t range) {
  uint64_t threshold = (uint64_t(0) - range) % range;  // 2^64 mod range
  PhiloxBlock b = first_attempt;
  for (uint32_t attempt = 1;; ++attempt) {
    uint64_t x = (uint64_t(b.word[2 * p]) << 32) | b.word[2 * p + 1];
    uint64_t low = 0;
    uint64_t value = multiply_high_low_64(x, range, low);
    if (low >= threshold || attempt >= kMaxAttempts) return value;
    b = stream_block(seed, counter, attempt);
  }
}

}  // namespace rng

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // Philox blocks handed out so far
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves n blocks and returns the first; throws if the 64-bit counter would wrap.
  uint64_t advance(uint64_t n);

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

// Where a fill reads its bits: element i of the fill is element (first_element + i) of the
// stream whose element 0 reads block `offset`. A rank holding rows [r0, r1) of a tensor
// initialised as a whole uses the whole fill's offset and first_element = r0 * row_numel.
struct RandomStream {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint64_t first_element = 0;
};

enum class RandomDistribution : uint8_t { Uniform, Normal, TruncatedNormal, RandInt };
// Values one Philox block yields (see the layout at the top of this file).
int random_values_per_block(RandomDistribution distribution, DType dtype);
// Blocks a fill of `numel` elements reserves: ceil(numel / values_per_block).
uint64_t random_blocks_needed(RandomDistribution distribution, DType dtype, int64_t numel);

// uniform: lo + (hi - lo) * u, u in [0, 1) (rounding to the output dtype may reach hi).
// Floating dtypes only.
Tensor uniform(const Shape& shape, Generator& gen, double lo = 0, double hi = 1,
               DType dtype = DType::F32, Device device = Device::cpu());
Tensor uniform(const Shape& shape, const RandomStream& stream, double lo = 0, double hi = 1,
               DType dtype = DType::F32, Device device = Device::cpu());

// normal: mean + std * z, z standard normal (Box-Muller). Floating dtypes only.
Tensor normal(const Shape& shape, Generator& gen, double mean = 0, double std = 1,
              DType dtype = DType::F32, Device device = Device::cpu());
Tensor normal(const Shape& shape, const RandomStream& stream, double mean = 0, double std = 1,
              DType dtype = DType::F32, Device device = Device::cpu());

// truncated_normal: mean + std * z with z standard normal conditioned on |z| <= bound
// (deterministic rejection, see above). Floating dtypes only; bound > 0.
Tensor truncated_normal(const Shape& shape, Generator& gen, double mean = 0, double std = 1,
                        double bound = 2, DType dtype = DType::F32,
                        Device device = Device::cpu());
Tensor truncated_normal(const Shape& shape, const RandomStream& stream, double mean = 0,
                        double std = 1, double bound = 2, DType dtype = DType::F32,
                        Device device = Device::cpu());

// randint: uniform integers in [low, high), exactly unbiased. Any dtype whose range holds
// [low, high - 1].
Tensor randint(const Shape& shape, Generator& gen, int64_t low, int64_t high,
               DType dtype = DType::I64, Device device = Device::cpu());
Tensor randint(const Shape& shape, const RandomStream& stream, int64_t low, int64_t high,
               DType dtype = DType::I64, Device device = Device::cpu());

// Fisher-Yates: for k = 0 .. n-2, i = n-1-k swaps with j uniform in [0, i] drawn as
// randint element k (range i + 1). Reserves ceil((n - 1) / 2) blocks.
void shuffle(std::vector<int64_t>& values, Generator& gen);

}  // namespace ham

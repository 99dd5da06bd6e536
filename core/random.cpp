#include "core/random.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/cpu/parallel.h"

namespace ham {

uint64_t Generator::advance(uint64_t n) {
  HAM_CHECK(n <= std::numeric_limits<uint64_t>::max() - offset_, "Generator(seed ", seed_,
            "): reserving ", n, " blocks at offset ", offset_, " wraps the 64-bit counter");
  uint64_t first = offset_;
  offset_ += n;
  return first;
}

int random_values_per_block(RandomDistribution distribution, DType dtype) {
  bool f64 = dtype == DType::F64;
  switch (distribution) {
    case RandomDistribution::Uniform: return rng::uniform_values_per_block(f64);
    case RandomDistribution::Normal:
    case RandomDistribution::TruncatedNormal: return rng::normal_values_per_block(f64);
    case RandomDistribution::RandInt: return rng::kIntegerValuesPerBlock;
  }
  HAM_FAIL("random_values_per_block: invalid distribution ", int(distribution));
}

uint64_t random_blocks_needed(RandomDistribution distribution, DType dtype, int64_t numel) {
  HAM_CHECK(numel >= 0, "random_blocks_needed: negative element count ", numel);
  uint64_t per = uint64_t(random_values_per_block(distribution, dtype));
  return (uint64_t(numel) + per - 1) / per;
}

namespace {

template <class T, class V>
T store_as(V value) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return float_to_bf16(float(value));
  } else {
    return static_cast<T>(value);
  }
}

void check_floating(const char* op, const Shape& shape, DType dtype) {
  HAM_CHECK(is_floating(dtype), op, shape_str(shape), ": dtype ", dtype_name(dtype),
            " is not floating (use f32, f64 or bf16)");
}

void check_finite(const char* op, const Shape& shape, const char* name, double value) {
  HAM_CHECK(std::isfinite(value), op, shape_str(shape), ": ", name, " = ", value,
            " is not finite");
}

// Fills a new CPU tensor: element j gets value_at(block, position, counter) for the stream
// element g = first_element + j, block = philox(offset + g / per), position = g % per.
// The loop runs over blocks so each block is computed once, in parallel when large.
template <class ValueFn>
Tensor fill_from_stream(const Shape& shape, DType dtype, Device device,
                        const RandomStream& stream, int per, ValueFn&& value_at) {
  Tensor host = Tensor::empty(shape, dtype, Device::cpu());
  uint64_t n = uint64_t(host.numel());
  if (n == 0) return host.to(device);
  uint64_t first = stream.first_element;
  HAM_CHECK(first <= std::numeric_limits<uint64_t>::max() - n, "random fill", shape_str(shape),
            ": first_element ", first, " + ", n, " elements overflows");
  uint64_t first_block = first / uint64_t(per);
  uint64_t last_block = (first + n - 1) / uint64_t(per);
  HAM_CHECK(last_block <= std::numeric_limits<uint64_t>::max() - stream.offset, "random fill",
            shape_str(shape), ": offset ", stream.offset, " + ", last_block,
            " blocks wraps the 64-bit counter");
  visit_dtype(dtype, [&]<class T>() {
    T* out = host.data<T>();
    int64_t blocks = int64_t(last_block - first_block + 1);
    cpu::parallel_for(blocks, 8 * per, [&](int64_t b) {
      uint64_t block_index = first_block + uint64_t(b);
      uint64_t counter = stream.offset + block_index;
      PhiloxBlock bits = rng::stream_block(stream.seed, counter);
      for (int p = 0; p < per; ++p) {
        uint64_t g = block_index * uint64_t(per) + uint64_t(p);
        if (g < first || g - first >= n) continue;
        out[g - first] = store_as<T>(value_at(bits, p, counter));
      }
    });
  });
  return host.to(device);
}

// Runs fill(stream) on the blocks reserved from gen; gen only advances when fill succeeds.
template <class Fill>
Tensor fill_with_generator(Generator& gen, RandomDistribution distribution, DType dtype,
                           const Shape& shape, Fill&& fill) {
  Generator next = gen;
  uint64_t blocks = random_blocks_needed(distribution, dtype, shape_numel(shape));
  Tensor out = fill(RandomStream{next.seed(), next.advance(blocks), 0});
  gen = next;
  return out;
}

// Integer range of each dtype, for randint's check.
std::pair<double, double> representable_integers(DType dtype) {
  switch (dtype) {
    case DType::U8: return {0.0, 255.0};
    case DType::I32: return {-2147483648.0, 2147483647.0};
    default: return {-std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::infinity()};
  }
}

}  // namespace

Tensor uniform(const Shape& shape, const RandomStream& stream, double lo, double hi,
               DType dtype, Device device) {
  check_floating("uniform", shape, dtype);
  check_finite("uniform", shape, "lo", lo);
  check_finite("uniform", shape, "hi", hi);
  HAM_CHECK(lo <= hi, "uniform", shape_str(shape), ": lo = ", lo, " > hi = ", hi);
  bool f64 = dtype == DType::F64;
  double width = hi - lo;
  return fill_from_stream(shape, dtype, device, stream, rng::uniform_values_per_block(f64),
                          [&](const PhiloxBlock& bits, int p, uint64_t) {
                            return lo + width * rng::uniform_from_block(bits, p, f64);
                          });
}

Tensor uniform(const Shape& shape, Generator& gen, double lo, double hi, DType dtype,
               Device device) {
  return fill_with_generator(gen, RandomDistribution::Uniform, dtype, shape,
                             [&](const RandomStream& stream) {
                               return uniform(shape, stream, lo, hi, dtype, device);
                             });
}

Tensor normal(const Shape& shape, const RandomStream& stream, double mean, double std,
              DType dtype, Device device) {
  check_floating("normal", shape, dtype);
  check_finite("normal", shape, "mean", mean);
  check_finite("normal", shape, "std", std);
  HAM_CHECK(std >= 0, "normal", shape_str(shape), ": std = ", std, " is negative");
  bool f64 = dtype == DType::F64;
  return fill_from_stream(shape, dtype, device, stream, rng::normal_values_per_block(f64),
                          [&](const PhiloxBlock& bits, int p, uint64_t) {
                            return mean + std * rng::normal_from_block(bits, p, f64);
                          });
}

Tensor normal(const Shape& shape, Generator& gen, double mean, double std, DType dtype,
              Device device) {
  return fill_with_generator(gen, RandomDistribution::Normal, dtype, shape,
                             [&](const RandomStream& stream) {
                               return normal(shape, stream, mean, std, dtype, device);
                             });
}

Tensor truncated_normal(const Shape& shape, const RandomStream& stream, double mean,
                        double std, double bound, DType dtype, Device device) {
  check_floating("truncated_normal", shape, dtype);
  check_finite("truncated_normal", shape, "mean", mean);
  check_finite("truncated_normal", shape, "std", std);
  HAM_CHECK(std >= 0, "truncated_normal", shape_str(shape), ": std = ", std, " is negative");
  HAM_CHECK(bound > 0, "truncated_normal", shape_str(shape), ": bound = ", bound,
            " must be positive (it is in units of std)");
  bool f64 = dtype == DType::F64;
  uint64_t seed = stream.seed;
  return fill_from_stream(
      shape, dtype, device, stream, rng::normal_values_per_block(f64),
      [&](const PhiloxBlock& bits, int p, uint64_t counter) {
        return mean + std * rng::truncated_normal_from_block(bits, seed, counter, p, f64, bound);
      });
}

Tensor truncated_normal(const Shape& shape, Generator& gen, double mean, double std,
                        double bound, DType dtype, Device device) {
  return fill_with_generator(
      gen, RandomDistribution::TruncatedNormal, dtype, shape, [&](const RandomStream& stream) {
        return truncated_normal(shape, stream, mean, std, bound, dtype, device);
      });
}

Tensor randint(const Shape& shape, const RandomStream& stream, int64_t low, int64_t high,
               DType dtype, Device device) {
  HAM_CHECK(low < high, "randint", shape_str(shape), ": empty range [", low, ", ", high, ")");
  auto [min_value, max_value] = representable_integers(dtype);
  HAM_CHECK(double(low) >= min_value && double(high - 1) <= max_value, "randint",
            shape_str(shape), ": range [", low, ", ", high, ") does not fit dtype ",
            dtype_name(dtype));
  uint64_t range = uint64_t(high) - uint64_t(low);  // wraps correctly for any low < high
  uint64_t seed = stream.seed;
  return fill_from_stream(shape, dtype, device, stream, rng::kIntegerValuesPerBlock,
                          [&](const PhiloxBlock& bits, int p, uint64_t counter) {
                            uint64_t k = rng::bounded_from_block(bits, seed, counter, p, range);
                            return int64_t(uint64_t(low) + k);  // two's complement wrap
                          });
}

Tensor randint(const Shape& shape, Generator& gen, int64_t low, int64_t high, DType dtype,
               Device device) {
  return fill_with_generator(gen, RandomDistribution::RandInt, dtype, shape,
                             [&](const RandomStream& stream) {
                               return randint(shape, stream, low, high, dtype, device);
                             });
}

void shuffle(std::vector<int64_t>& values, Generator& gen) {
  uint64_t n = values.size();
  if (n < 2) return;
  uint64_t steps = n - 1;
  uint64_t per = rng::kIntegerValuesPerBlock;
  uint64_t offset = gen.advance((steps + per - 1) / per);
  for (uint64_t k = 0; k < steps; ++k) {
    uint64_t i = n - 1 - k;
    uint64_t counter = offset + k / per;
    PhiloxBlock bits = rng::stream_block(gen.seed(), counter);
    uint64_t j = rng::bounded_from_block(bits, gen.seed(), counter, int(k % per), i + 1);
    std::swap(values[i], values[j]);
  }
}

}  // namespace ham

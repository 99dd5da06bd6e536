#pragma once
// Element types. bf16 is a storage format: kernels compute in f32 and round on store.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ham {

enum class DType : uint8_t { F32, F64, BF16, I32, I64, U8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "f64", "bf16", "i32", "i64", "u8"
DType dtype_from_name(const std::string& name);  // throws on unknown
bool is_floating(DType dtype);

// bf16 = the top 16 bits of an IEEE f32; conversion rounds to nearest, ties to even,
// and keeps NaN a NaN.
struct BFloat16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(BFloat16 value) {
  uint32_t u = uint32_t(value.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline BFloat16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return BFloat16{uint16_t((u >> 16) | 0x0040u)};  // quiet NaN
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{uint16_t((u + rounding_bias) >> 16)};
}

template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

}  // namespace ham

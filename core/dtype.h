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

// Converts n elements between host buffers of any two dtypes: to bf16 rounds to nearest
// even (f64 goes through f32), floating to integer truncates toward zero.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

// Calls fn.template operator()<T>() with T the C++ type of `dtype` (float, double,
// BFloat16, int32_t, int64_t or uint8_t).
template <class Fn>
void visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: fn.template operator()<float>(); return;
    case DType::F64: fn.template operator()<double>(); return;
    case DType::BF16: fn.template operator()<BFloat16>(); return;
    case DType::I32: fn.template operator()<int32_t>(); return;
    case DType::I64: fn.template operator()<int64_t>(); return;
    case DType::U8: fn.template operator()<uint8_t>(); return;
  }
}

}  // namespace ham

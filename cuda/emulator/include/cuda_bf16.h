#pragma once
// bf16 for the SIMT emulator: the upper 16 bits of an f32, converted from f32 by rounding to
// nearest, ties to even (what __float2bfloat16_rn and the device's cvt.rn.bf16.f32 do; NaN
// stays a quiet NaN).
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t __x;

  static uint16_t round_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }

  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(round_bits(f)) {}
  __nv_bfloat16(double d) : __x(round_bits(float(d))) {}
  operator float() const {
    uint32_t u = uint32_t(__x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
using nv_bfloat16 = __nv_bfloat16;

inline float __bfloat162float(__nv_bfloat16 x) { return float(x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 x) { return x.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
  __nv_bfloat16 x;
  x.__x = bits;
  return x;
}

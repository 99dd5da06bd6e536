#pragma once
// The device functions cuda/*.cu call, for the SIMT emulator: barriers and warp collectives
// go to the scheduler (cuda/emulator/simt.h); atomics are plain read-modify-writes, since
// only one fiber runs at a time and none is switched out inside one; integer intrinsics and
// the fast-math spellings map to their exact host equivalents.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/emulator/simt.h"

// ---- Barriers -----------------------------------------------------------------------------
inline void __syncthreads() { ham::cuda::emulator::block_barrier(0); }
inline int __syncthreads_count(int predicate) {
  return ham::cuda::emulator::block_barrier(predicate).passed;
}
inline int __syncthreads_or(int predicate) {
  return ham::cuda::emulator::block_barrier(predicate).passed > 0;
}
inline int __syncthreads_and(int predicate) {
  const auto count = ham::cuda::emulator::block_barrier(predicate);
  return count.passed == count.total;
}
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- Warp collectives ---------------------------------------------------------------------
namespace ham::cuda::emulator {
template <class T>
uint64_t to_bits(T value) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "warp values are at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}
template <class T>
T shuffle(WarpCollective kind, unsigned mask, T value, int lane_operand, int width) {
  return from_bits<T>(warp_collective(kind, mask, to_bits(value), lane_operand, width));
}
}  // namespace ham::cuda::emulator

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ham::cuda::emulator::warp_collective(ham::cuda::emulator::WarpCollective::Sync, mask, 0, 0, 32);
}
template <class T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = 32) {
  return ham::cuda::emulator::shuffle(ham::cuda::emulator::WarpCollective::ShuffleIndex, mask,
                                      value, source_lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ham::cuda::emulator::shuffle(ham::cuda::emulator::WarpCollective::ShuffleUp, mask, value,
                                      int(delta), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ham::cuda::emulator::shuffle(ham::cuda::emulator::WarpCollective::ShuffleDown, mask,
                                      value, int(delta), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return ham::cuda::emulator::shuffle(ham::cuda::emulator::WarpCollective::ShuffleXor, mask, value,
                                      lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return unsigned(ham::cuda::emulator::warp_collective(
      ham::cuda::emulator::WarpCollective::Ballot, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return int(ham::cuda::emulator::warp_collective(ham::cuda::emulator::WarpCollective::Any, mask,
                                                  predicate != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
  return int(ham::cuda::emulator::warp_collective(ham::cuda::emulator::WarpCollective::All, mask,
                                                  predicate != 0, 0, 32));
}
template <class T>
unsigned __match_any_sync(unsigned mask, T value) {
  using namespace ham::cuda::emulator;
  return unsigned(warp_collective(WarpCollective::MatchAny, mask, to_bits(value), 0, 32));
}

[[noreturn]] inline void __trap() { ham::cuda::emulator::trap("__trap()"); }

// ---- Atomics ------------------------------------------------------------------------------
namespace ham::cuda::emulator {
// *address = f(old), returning old. Not instrumented: it tells the racecheck (racecheck.h)
// itself, as an atomic, which races only with plain loads and stores. Never inlined, so
// that its return address is the kernel's line.
template <class T, class F>
[[gnu::noinline]] __attribute__((no_sanitize_thread)) T atomic_update(T* address, F f) {
  instrumented_atomic(address, sizeof(T), __builtin_return_address(0));
  const T old = *address;
  *address = f(old);
  return old;
}
}  // namespace ham::cuda::emulator
using ham::cuda::emulator::atomic_update;

// Inlined into the kernel, so that atomic_update's return address is the kernel's line.
template <class T>
[[gnu::always_inline]] inline T atomicAdd(T* a, T v) {
  return atomic_update(a, [v](T x) { return T(x + v); });
}
template <class T>
[[gnu::always_inline]] inline T atomicSub(T* a, T v) {
  return atomic_update(a, [v](T x) { return T(x - v); });
}
template <class T>
[[gnu::always_inline]] inline T atomicMin(T* a, T v) {
  return atomic_update(a, [v](T x) { return v < x ? v : x; });
}
template <class T>
[[gnu::always_inline]] inline T atomicMax(T* a, T v) {
  return atomic_update(a, [v](T x) { return v > x ? v : x; });
}
template <class T>
[[gnu::always_inline]] inline T atomicExch(T* a, T v) {
  return atomic_update(a, [v](T) { return v; });
}
template <class T>
[[gnu::always_inline]] inline T atomicOr(T* a, T v) {
  return atomic_update(a, [v](T x) { return T(x | v); });
}
template <class T>
[[gnu::always_inline]] inline T atomicAnd(T* a, T v) {
  return atomic_update(a, [v](T x) { return T(x & v); });
}
template <class T>
[[gnu::always_inline]] inline T atomicCAS(T* a, T compare, T v) {
  return atomic_update(a, [=](T x) { return x == compare ? v : x; });
}

// ---- Integer intrinsics -------------------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}

// ---- Math ---------------------------------------------------------------------------------
// CUDA's overloads of min and max for the device, in the global namespace.
#define HAM_EMULATOR_MIN_MAX(T)                          \
  inline T min(T a, T b) { return b < a ? b : a; }       \
  inline T max(T a, T b) { return a < b ? b : a; }
HAM_EMULATOR_MIN_MAX(int)
HAM_EMULATOR_MIN_MAX(unsigned)
HAM_EMULATOR_MIN_MAX(long)
HAM_EMULATOR_MIN_MAX(unsigned long)
HAM_EMULATOR_MIN_MAX(long long)
HAM_EMULATOR_MIN_MAX(unsigned long long)
#undef HAM_EMULATOR_MIN_MAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }

#pragma once
// Asynchronous copies from global to shared memory (cp.async, sm_80 and later), the way a
// kernel loads its next tile while it computes on the current one: a thread issues 16-byte
// copies, which need no registers and do not stall it, closes them into a group
// (commit), and later waits until all but its `pending` most recent groups have landed.
// A thread sees its own completed copies after the wait; other threads see them only after
// a barrier that follows it.
//
// The SIMT emulator (HAM_CUDA_EMULATOR) defers each copy to the wait that covers it
// (cuda/emulator/simt.h), so a tile read too early holds stale bytes in the tests.
#include <cstdint>
#include <type_traits>

#ifdef HAM_CUDA_EMULATOR
#include "cuda/emulator/simt.h"
#endif

namespace ham::cuda {

#ifdef HAM_CUDA_EMULATOR

inline void async_copy_16(void* shared_destination, const void* global_source) {
  emulator::async_copy_16(shared_destination, global_source);
}
inline void async_copy_16_or_zeros(void* shared_destination, const void* global_source,
                                   bool copy) {
  emulator::async_copy_16_or_zeros(shared_destination, global_source, copy);
}
inline void async_copy_commit() { emulator::async_copy_commit(); }
template <int kPending>
void async_copy_wait() {
  emulator::async_copy_wait(kPending);
}
template <class Index>  // uint32_t or int32_t
const void* strided_address(const char* base, Index index, Index step_bytes) {
  return base + int64_t(index) * int64_t(step_bytes);
}
// The emulator has no cache to warm: it reads one byte, so that an address outside every
// tensor fails the sanitizer's checks as a load would (on the GPU a prefetch is a hint that
// no test could see go wrong).
inline void prefetch_to_l2(const void* global_address) {
  (void)*static_cast<const volatile char*>(global_address);
}

#else

// 16 bytes, both addresses 16-byte aligned; .cg keeps the line out of L1 (read once).
__device__ __forceinline__ void async_copy_16(void* shared_destination, const void* global_source) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared_destination));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global_source)
               : "memory");
}
// The copy where `copy`, else 16 zero bytes, landing as the copy would (they join the
// open group: read them after the wait, like the copies). The source is then not read
// (ignore-src), but stays 16-byte aligned. One LDGSTS with a zero-fill predicate: the
// alternative, a zero store where !copy, cost the store and the three never-executed
// `LDS RZ` that ptxas places before each LDGSTS that follows a shared store (sm_90a).
__device__ __forceinline__ void async_copy_16_or_zeros(void* shared_destination,
                                                       const void* global_source, bool copy) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared_destination));
  asm volatile(
      "{\n.reg .pred ignore;\nsetp.eq.u32 ignore, %2, 0;\n"
      "cp.async.cg.shared.global [%0], [%1], 16, ignore;\n}\n" ::"r"(to),
      "l"(global_source), "r"(unsigned(copy))
      : "memory");
}
__device__ __forceinline__ void async_copy_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void async_copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Asks for the 128-byte line at `global_address` to be brought into L2 (prefetch.global.L2),
// with no register to wait on: for loads a later step makes, so that they find the line
// there rather than in HBM. A hint: it changes no value. Its address is a tensor's, as a
// load's would be (the emulator checks that).
__device__ __forceinline__ void prefetch_to_l2(const void* global_address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(global_address));
}

// base + index step_bytes, a copy's source row, as one 32 x 32 -> 64-bit multiply-add
// (mad.wide.u32). The same in C++ (a uint64 product) compiled to that plus two moves and
// an add of a zero high word (sm_90, nvcc 13.0). A signed index takes mad.wide.s32, as
// cheap: index -1, a row that lands zeros (async_copy_16_or_zeros), then points one step
// before base, not 2^32 - 1 steps on.
template <class Index>  // uint32_t or int32_t
__device__ __forceinline__ const void* strided_address(const char* base, Index index,
                                                       Index step_bytes) {
  static_assert(std::is_same_v<Index, uint32_t> || std::is_same_v<Index, int32_t>);
  const uint64_t from = reinterpret_cast<uint64_t>(base);
  uint64_t address;
  if constexpr (std::is_same_v<Index, int32_t>) {
    asm("mad.wide.s32 %0, %1, %2, %3;\n" : "=l"(address) : "r"(index), "r"(step_bytes), "l"(from));
  } else {
    asm("mad.wide.u32 %0, %1, %2, %3;\n" : "=l"(address) : "r"(index), "r"(step_bytes), "l"(from));
  }
  return reinterpret_cast<const void*>(address);
}

#endif

}  // namespace ham::cuda

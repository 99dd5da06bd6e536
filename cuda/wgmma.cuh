#pragma once
// Warpgroup tensor-core primitives (sm_90a): wgmma.mma_async, issued together by the 4
// warps of a warpgroup (128 consecutive threads starting at a multiple of 128), with B (and
// optionally A) read from shared memory by the tensor cores themselves. Against mma.sync
// (cuda/mma.cuh), whose B fragments every warp loads into its own registers, a B tile is
// read once per 64 rows of the product instead of once per 16.
//
// m64nNk16, bf16 in, f32 accumulate: D (64 x N) += A (64 x 16) B (16 x N). Warp w of the
// group holds rows 16 w .. 16 w + 15 of D as `float d[N / 8][4]`, block j the 16 x 8 block
// of columns 8 j in mma.m16n8k16's C layout (cuda/mma.cuh): the accumulators of a wgmma
// and of a warp's mma.sync tiles over the same 16 rows are the same registers. A from
// registers is warp w's rows 16 w .. in mma.m16n8k16's A layout (mma::accumulator_as_a).
//
// Shared-memory tiles use the 128-byte swizzle. A bf16 tile of R rows (a multiple of 8)
// and D columns (a multiple of 64) is D / 64 panels of R rows x 64 columns, one after the
// other; a panel row is 128 bytes, and row r's 16-byte chunk j (columns 8 j .. 8 j + 7 of
// the panel) is stored at chunk j ^ (r % 8) of the row (swizzled_index). The hardware
// applies that XOR to shared-memory address bits 4-6 from bits 7-9, so a tile starts at a
// shared address that is a multiple of 1024. Rows of 8 chunks in 8 different orders put
// every 8 x 16-byte core matrix the tensor cores read across all 32 banks.
//
// A tile serves two ways (descriptors below; PTX ISA, "Matrix Descriptor Format": bits
// 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 swizzle mode, 1 for 128 bytes):
//   K-major, its rows being the M (or N) index and 16 of its columns the reduction (K in
//     K Q^T): start at column c0's panel, 2 (c0 % 64) bytes into row 0; the next 8 rows
//     1024 bytes on (stride offset); the leading offset unused.
//   MN-major, 16 of its rows being the reduction and its columns N (Q in dS^T Q): start at
//     row r0 of panel 0; rows r0 + 8 .. 1024 bytes on (stride offset); columns 64 .. one
//     panel on (leading offset, R 128 bytes).
//
// Ordering: a wgmma's shared-memory reads belong to the async proxy, so what ordinary
// stores or cp.async wrote is fenced (fence_proxy_async) by each writing thread before the
// barrier that publishes it. Registers: fence() before a wgmma whose accumulators or A
// registers other instructions wrote; wait<n>() before the accumulators are read.
//
// The SIMT emulator (HAM_CUDA_EMULATOR) runs each warp's 16 rows of a wgmma when that warp
// reaches it (cuda/emulator/mma.cpp), decoding the descriptors as the hardware does
// (swizzle included) from shared addresses counted from the dynamic shared memory, and
// fails the kernel where a shared operand changes before the wait<n>() that covers the
// wgmma (cuda/emulator/simt.h, wgmma_issued), or holds a write that no fence_proxy_async
// and barrier handed to the tensor cores (async_proxy_fence).
#include <cstdint>

#ifdef HAM_CUDA_EMULATOR
#include "cuda/emulator/mma.h"
#endif

// Whether this compilation has the wgmma instructions: the emulator, and device code for
// sm_90a (an architecture-specific target: `90a` in CMAKE_CUDA_ARCHITECTURES).
#if defined(HAM_CUDA_EMULATOR) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define HAM_WGMMA_DEVICE 1
#else
#define HAM_WGMMA_DEVICE 0
#endif

namespace ham::cuda::wgmma {

// Element index of (row r, column c) in a swizzled tile of R rows (see above): panel
// c / 64, row r, chunk (c % 64) / 8 ^ r % 8, element c % 8; in bit operations, so that the
// compiler sees a copy loop's rows r0 + 8 k keep r0's chunk order.
template <int R>
__host__ __device__ constexpr int swizzled_index(int r, int c) {
  return (c >> 6) * R * 64 + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

inline constexpr uint32_t kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes

__host__ __device__ constexpr uint64_t descriptor(uint32_t address, uint32_t leading_bytes,
                                                  uint32_t stride_bytes) {
  return uint64_t((address >> 4) & 0x3fff) | uint64_t((leading_bytes >> 4) & 0x3fff) << 16 |
         uint64_t((stride_bytes >> 4) & 0x3fff) << 32 | uint64_t(1) << 62;
}

// The descriptors below are a tile's descriptor plus the step's offset in the start field,
// (offset >> 4) added to the whole word: shared addresses are below 2^18, so the field does
// not carry, and a loop's descriptors cost one 64-bit add each instead of the masks and
// shifts of descriptor() (a quarter of the dQ kernel's tile loop, in uniform registers).

// Descriptor of columns [c0, c0 + 16) of every row of a swizzled tile (R rows) at shared
// address `tile`, the tile's rows being M or N.
template <int R>
__host__ __device__ constexpr uint64_t k_major(uint32_t tile, int c0) {
  return descriptor(tile, 16, kSwizzleAtomBytes) +
         uint64_t(((c0 / 64) * R * 128 + (c0 % 64) * 2) >> 4);
}

// Descriptor of rows [r0, r0 + 16) of a swizzled tile (R rows) at shared address `tile`,
// its columns being N.
template <int R>
__host__ __device__ constexpr uint64_t mn_major(uint32_t tile, int r0) {
  return descriptor(tile, uint32_t(R * 128), kSwizzleAtomBytes) + uint64_t((r0 * 128) >> 4);
}

#ifdef HAM_CUDA_EMULATOR

inline uint32_t shared_address(const void* p) { return emulator::shared_address(p); }
inline void fence() {}
inline void commit() { emulator::wgmma_commit(); }
template <int kPending>
void wait() {
  emulator::wgmma_wait(kPending);
}
inline void fence_proxy_async() { emulator::async_proxy_fence(); }

// d (this warp's 16 rows of 64 x N) = A B (+ d when kAccumulate), A and B by descriptor,
// both K-major.
template <int N, bool kAccumulate>
void mma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b) {
  if constexpr (!kAccumulate) {
    for (auto& block : d) block[0] = block[1] = block[2] = block[3] = 0.f;
  }
  emulator::wgmma_bf16(&d[0][0], N, nullptr, a, b, false);
}
// d += A B, A (this warp's 16 x 16) from registers, B by descriptor, MN-major.
template <int N>
void mma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {
  emulator::wgmma_bf16(&d[0][0], N, a, 0, b, true);
}

#elif HAM_WGMMA_DEVICE

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define HAM_WGMMA_D4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define HAM_WGMMA_OUT4(d, j) "=f"(d[j][0]), "=f"(d[j][1]), "=f"(d[j][2]), "=f"(d[j][3])
#define HAM_WGMMA_OUT8(d) HAM_WGMMA_OUT4(d, 0), HAM_WGMMA_OUT4(d, 1)
#define HAM_WGMMA_D8(d) HAM_WGMMA_D4(d, 0), HAM_WGMMA_D4(d, 1)
#define HAM_WGMMA_OUT16(d) \
  HAM_WGMMA_OUT4(d, 0), HAM_WGMMA_OUT4(d, 1), HAM_WGMMA_OUT4(d, 2), HAM_WGMMA_OUT4(d, 3)
#define HAM_WGMMA_D16(d) \
  HAM_WGMMA_D4(d, 0), HAM_WGMMA_D4(d, 1), HAM_WGMMA_D4(d, 2), HAM_WGMMA_D4(d, 3)
#define HAM_WGMMA_OUT32(d)                                                                 \
  HAM_WGMMA_OUT4(d, 0), HAM_WGMMA_OUT4(d, 1), HAM_WGMMA_OUT4(d, 2), HAM_WGMMA_OUT4(d, 3),  \
      HAM_WGMMA_OUT4(d, 4), HAM_WGMMA_OUT4(d, 5), HAM_WGMMA_OUT4(d, 6), HAM_WGMMA_OUT4(d, 7)
#define HAM_WGMMA_D32(d)                                                                   \
  HAM_WGMMA_D4(d, 0), HAM_WGMMA_D4(d, 1), HAM_WGMMA_D4(d, 2), HAM_WGMMA_D4(d, 3),          \
      HAM_WGMMA_D4(d, 4), HAM_WGMMA_D4(d, 5), HAM_WGMMA_D4(d, 6), HAM_WGMMA_D4(d, 7)
#define HAM_WGMMA_D64(d)                                                                   \
  HAM_WGMMA_D32(d), HAM_WGMMA_D4(d, 8), HAM_WGMMA_D4(d, 9), HAM_WGMMA_D4(d, 10),           \
      HAM_WGMMA_D4(d, 11), HAM_WGMMA_D4(d, 12), HAM_WGMMA_D4(d, 13), HAM_WGMMA_D4(d, 14),  \
      HAM_WGMMA_D4(d, 15)
#define HAM_WGMMA_REGS8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define HAM_WGMMA_REGS16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define HAM_WGMMA_REGS32                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define HAM_WGMMA_REGS64                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "  \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d = A B (+ d when kAccumulate: scale-d), A and B by descriptor, both K-major
// (imm-trans-a = imm-trans-b = 0). Without kAccumulate the accumulators need no zeroing:
// zeroed by ordinary moves, they would need a wgmma.fence after the moves, and the compiler
// may move them past one (ptxas then inserts waits and fences of its own).
template <int N, bool kAccumulate>
__device__ __forceinline__ void mma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b) {
  static_assert(N == 16 || N == 32 || N == 64, "mma_ss: N is 16, 32 or 64");
  if constexpr (N == 16 && kAccumulate) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " HAM_WGMMA_REGS8
                 ", %8, %9, 1, 1, 1, 0, 0;\n"
                 : HAM_WGMMA_D8(d)
                 : "l"(a), "l"(b));
  } else if constexpr (N == 16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " HAM_WGMMA_REGS8
                 ", %8, %9, 0, 1, 1, 0, 0;\n"
                 : HAM_WGMMA_OUT8(d)
                 : "l"(a), "l"(b));
  } else if constexpr (N == 32 && kAccumulate) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " HAM_WGMMA_REGS16
                 ", %16, %17, 1, 1, 1, 0, 0;\n"
                 : HAM_WGMMA_D16(d)
                 : "l"(a), "l"(b));
  } else if constexpr (N == 32) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " HAM_WGMMA_REGS16
                 ", %16, %17, 0, 1, 1, 0, 0;\n"
                 : HAM_WGMMA_OUT16(d)
                 : "l"(a), "l"(b));
  } else if constexpr (kAccumulate) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HAM_WGMMA_REGS32
                 ", %32, %33, 1, 1, 1, 0, 0;\n"
                 : HAM_WGMMA_D32(d)
                 : "l"(a), "l"(b));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HAM_WGMMA_REGS32
                 ", %32, %33, 0, 1, 1, 0, 0;\n"
                 : HAM_WGMMA_OUT32(d)
                 : "l"(a), "l"(b));
  }
}

// d += A B, A from registers, B by descriptor, MN-major (imm-trans-b = 1), scale-d 1.
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                       uint64_t b) {
  if constexpr (N == 64) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HAM_WGMMA_REGS32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : HAM_WGMMA_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  } else {
    static_assert(N == 128, "mma_rs: N is 64 or 128");
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HAM_WGMMA_REGS64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : HAM_WGMMA_D64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
}

#undef HAM_WGMMA_D4
#undef HAM_WGMMA_OUT4
#undef HAM_WGMMA_OUT8
#undef HAM_WGMMA_D8
#undef HAM_WGMMA_REGS8
#undef HAM_WGMMA_OUT16
#undef HAM_WGMMA_D16
#undef HAM_WGMMA_REGS16
#undef HAM_WGMMA_OUT32
#undef HAM_WGMMA_D32
#undef HAM_WGMMA_D64
#undef HAM_WGMMA_REGS32
#undef HAM_WGMMA_REGS64

#else

// Where wgmma does not exist (host code, device code for other targets): declarations only,
// so that templates naming these compile; a kernel that would call them is compiled to a
// trap there (#if HAM_WGMMA_DEVICE) and never launched.
__device__ uint32_t shared_address(const void* p);
__device__ void fence();
__device__ void commit();
template <int kPending>
__device__ void wait();
__device__ void fence_proxy_async();
template <int N, bool kAccumulate>
__device__ void mma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b);
template <int N>
__device__ void mma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b);

#endif

// Products of whole tiles, for a warpgroup (each warp's 16 rows of the 64 in `d`), issued
// only: fence() before, commit() and wait() after are the caller's.

// d = A B^T over D columns: A the 64 rows from shared address `a` of a swizzled tile of RA
// rows, B^T the first N rows of the tile of RB rows at `b` (as Q K^T); the first step
// overwrites d.
template <int N, int D, int RA, int RB>
__device__ __forceinline__ void rows_times_rows(float (&d)[N / 8][4], uint32_t a, uint32_t b) {
  mma_ss<N, false>(d, k_major<RA>(a, 0), k_major<RB>(b, 0));
#pragma unroll
  for (int kk = 16; kk < D; kk += 16) mma_ss<N, true>(d, k_major<RA>(a, kk), k_major<RB>(b, kk));
}

// Columns [8 kFirst, 8 (kFirst + kBlocks)) of an accumulator: kBlocks of its 8-column
// blocks, the same registers.
template <int kFirst, int kBlocks, int kAll>
__device__ __forceinline__ float (&column_blocks(float (&d)[kAll][4]))[kBlocks][4] {
  static_assert(kFirst + kBlocks <= kAll, "column_blocks: past the accumulator");
  return *reinterpret_cast<float(*)[kBlocks][4]>(&d[kFirst][0]);
}

// d += X B: X (64 x K) as each warp's bf16 A fragments, 16 columns each, B the first K
// rows of the swizzled tile of R rows at `b`, N columns (as P V). N is 64, 128, 192 or
// 256: a wide product is one wgmma of columns [0, 128) and one of the rest, whose panels
// start two panels (2 R 128 bytes) into the tile (mma_rs has the two widths of the kernels'
// tiles, 64 and 128).
template <int N, int K, int R>
__device__ __forceinline__ void fragments_times_matrix(float (&d)[N / 8][4],
                                                       const uint32_t (&x)[K / 16][4],
                                                       uint32_t b) {
  static_assert(N % 64 == 0 && N <= 256, "fragments_times_matrix: N is 64, 128, 192 or 256");
  constexpr int kFirst = N > 128 ? 128 : N;
#pragma unroll
  for (int j = 0; j < K / 16; ++j) {
    mma_rs<kFirst>(column_blocks<0, kFirst / 8>(d), x[j], mn_major<R>(b, 16 * j));
    if constexpr (N > 128) {
      mma_rs<N - 128>(column_blocks<16, (N - 128) / 8>(d), x[j],
                      mn_major<R>(b + 2 * R * 128, 16 * j));
    }
  }
}

// The first 1024-byte boundary (in shared addresses) at or after `p`, where a kernel's
// swizzled tiles start; its dynamic shared memory asks for 1024 bytes more.
template <class T>
__device__ __forceinline__ T* swizzle_aligned(T* p) {
  const uint32_t address = shared_address(p);
  return reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(p) +
                              (kSwizzleAtomBytes - address % kSwizzleAtomBytes) %
                                  kSwizzleAtomBytes);
}

}  // namespace ham::cuda::wgmma

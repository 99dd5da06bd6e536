#pragma once
// Warp-level tensor-core primitives (sm_80 and later): the bf16 mma.sync with f32
// accumulation and the ldmatrix loads that feed it, which every lane of the warp must call
// together (all 32 lanes, converged); and an 8-byte store of an accumulator's column pair.
//
// Fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4, two bf16 per 32-bit register, the lower column (or row)
// in the low half:
//   A, 16 x 16, row-major:  a0 = A[g][2t, 2t+1]    a1 = A[g+8][2t, 2t+1]
//                           a2 = A[g][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//   B, 16 x 8 (k x n):      b0 = B[2t, 2t+1][g]    b1 = B[2t+8, 2t+9][g]
//   C and D, 16 x 8, f32:   d0 = D[g][2t]  d1 = D[g][2t+1]  d2 = D[g+8][2t]  d3 = D[g+8][2t+1]
//
// ldmatrix.m8n8 (x1, x2, x4 matrices of 8 x 8 b16): lane l gives the shared-memory address
// of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); register j of lane l receives
// M_j[l / 4][2 (l % 4), 2 (l % 4) + 1], or with .trans M_j[2 (l % 4), 2 (l % 4) + 1][l / 4].
// So for a row-major 16 x 16 tile at `p` (row stride `ld` elements), ldmatrix_x4 with
// lane l pointing at p + (l % 16) ld + 8 (l / 16) yields exactly a0..a3; for B stored as
// [n][k] rows (K-major, like K in Q K^T), ldmatrix_x2 with lanes 0-15 pointing at
// p + (l % 8) ld + 8 (l / 8) yields b0, b1; for B stored as [k][n] rows (like V in P V),
// ldmatrix_x2_trans with lanes 0-15 pointing at p + (l % 16) ld yields b0, b1.
//
// The SIMT emulator (HAM_CUDA_EMULATOR) runs the same definitions on the CPU
// (cuda/emulator/mma.cpp), so kernels built on these are tested without a GPU.
#include <cstdint>

#ifdef HAM_CUDA_EMULATOR
#include <cfloat>
#include <cmath>

#include "cuda/emulator/mma.h"
#else
#include <cuda_bf16.h>
#endif

namespace ham::cuda::mma {

// log2(e): e^x = 2^(x log2 e), for exp2_ftz on natural-log exponents.
inline constexpr float kLog2e = 1.4426950408889634f;

#ifdef HAM_CUDA_EMULATOR

using emulator::ldmatrix;
using emulator::mma_bf16_16816;
using emulator::pack_bf16;

inline void store_f32x2(float* to, float x0, float x1) {
  to[0] = x0;
  to[1] = x1;
}

// 2^x as the hardware's ex2.approx.ftz computes it, to the emulator's precision: a result
// below the smallest normal float is 0.
inline float exp2_ftz(float x) {
  const float r = std::exp2(x);
  return r < FLT_MIN ? 0.f : r;
}

#else

// d += A B for one 16 x 8 x 16 tile.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// N (1, 2 or 4) 8 x 8 matrices of b16 from shared memory; `row` is this lane's row address.
template <int N, bool kTranspose>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (N == 4 && !kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else if constexpr (N == 4 && kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else if constexpr (N == 2 && !kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(address));
  } else if constexpr (N == 2 && kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(address));
  } else if constexpr (N == 1 && !kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(address));
  } else {
    static_assert(N == 1 && kTranspose, "ldmatrix loads 1, 2 or 4 matrices");
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(address));
  }
}

// 2^x by one ex2.approx.ftz (2 ulp; 2^-inf = 0, NaN stays NaN, results below the smallest
// normal float are 0). exp2f without fast math adds a compare and two multiplies for
// denormal results to every call, which a softmax over probabilities at most 1 never needs.
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// Two floats rounded to bf16 (nearest even) in one register, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// x0, x1 to to[0], to[1] in global memory (8-byte aligned) by one 8-byte store. A float2
// store of an accumulator pair came out of the compiler as two 4-byte stores in some
// kernels (gated_delta_rule.cu's backward).
__device__ __forceinline__ void store_f32x2(float* to, float x0, float x1) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(__cvta_generic_to_global(to)),
               "f"(x0), "f"(x1)
               : "memory");
}

#endif

}  // namespace ham::cuda::mma

#pragma once
// Warp tiles on the tensor cores, built from cuda/mma.cuh: one warp computes a 16-row slice
// of a product, its accumulator `acc[NB][4]` holding 16 x 8 NB f32 values in the mma
// D-fragment layout (element e of block nb: row lane / 4 + 8 (e / 2), column
// 8 nb + 2 (lane % 4) + e % 2). Operands are bf16 tiles in shared memory with row stride LD
// elements (16-byte aligned rows; padding LD by 8 puts ldmatrix's rows in different banks).
// Shared by the tensor-core kernels of routed_attention and gated_delta_rule.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>

#include "cuda/mma.cuh"

namespace ham::cuda::mma {

using bf16_t = __nv_bfloat16;

__device__ __forceinline__ int lane_id() { return int(threadIdx.x % 32); }

// A-fragment of the 16 x 16 block at column `col` of a row-major tile (rows = the warp's 16).
template <int LD>
__device__ __forceinline__ void load_a(uint32_t (&frag)[4], const bf16_t* tile, int col) {
  const int lane = lane_id();
  ldmatrix<4, false>(frag, tile + (lane % 16) * LD + col + 8 * (lane / 16));
}

// A-fragment of the 16 x 16 block (rows m0.., columns k0..) of A = X^T, X stored [k][m]
// (e.g. K^T from the rows of K): ldmatrix's transposing load.
template <int LD>
__device__ __forceinline__ void load_a_trans(uint32_t (&frag)[4], const bf16_t* x, int m0,
                                             int k0) {
  const int lane = lane_id();
  ldmatrix<4, true>(frag, x + (k0 + lane % 8 + 8 * (lane / 16)) * LD + m0 + 8 * ((lane / 8) % 2));
}

// B-fragment (k 16 x n 8) from a tile stored [n][k] (rows n0.., columns k0..).
template <int LD>
__device__ __forceinline__ void load_b_nk(uint32_t (&frag)[2], const bf16_t* tile, int n0,
                                          int k0) {
  const int lane = lane_id();
  ldmatrix<2, false>(frag, tile + (n0 + lane % 8) * LD + k0 + 8 * ((lane / 8) % 2));
}

// B-fragment (k 16 x n 8) from a tile stored [k][n] (rows k0.., columns n0..).
template <int LD>
__device__ __forceinline__ void load_b_kn(uint32_t (&frag)[2], const bf16_t* tile, int k0,
                                          int n0) {
  const int lane = lane_id();
  ldmatrix<2, true>(frag, tile + (k0 + lane % 16) * LD + n0);
}

// The B-fragments of two adjacent 8-column blocks, n0 and n0 + 8, by one ldmatrix.x4 (the
// x2 loads above, with lanes 16-31 pointing at the second block): frag[0..1] for n0,
// frag[2..3] for n0 + 8. Half the load instructions of two x2 loads, the same bytes.
template <int LD>
__device__ __forceinline__ void load_b_nk_pair(uint32_t (&frag)[4], const bf16_t* tile, int n0,
                                               int k0) {
  const int lane = lane_id();
  ldmatrix<4, false>(frag,
                     tile + (n0 + lane % 8 + 8 * (lane / 16)) * LD + k0 + 8 * ((lane / 8) % 2));
}
template <int LD>
__device__ __forceinline__ void load_b_kn_pair(uint32_t (&frag)[4], const bf16_t* tile, int k0,
                                               int n0) {
  const int lane = lane_id();
  ldmatrix<4, true>(frag, tile + (k0 + lane % 16) * LD + n0 + 8 * (lane / 16));
}

// fn(nb, b) for the B-fragments b of the 8-column blocks nb < NB at row (k) k0: B given
// as rows [n][k] (kBRows, like K in Q K^T) or as [k][n] (like V in P V). kPaired: two
// blocks per ldmatrix.x4 (an odd last block by x2); otherwise one x2 per block, which
// holds two fewer registers (the gated delta rule's kernels at a 128-register bound
// spilled with pairs).
template <bool kBRows, int LDB, int NB, bool kPaired, class Fn>
__device__ __forceinline__ void each_b_fragment(const bf16_t* b_tile, int k0, Fn&& fn) {
  if constexpr (!kPaired) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      uint32_t bf[2];
      if constexpr (kBRows) load_b_nk<LDB>(bf, b_tile, nb * 8, k0);
      else load_b_kn<LDB>(bf, b_tile, k0, nb * 8);
      fn(nb, bf);
    }
  } else {  // (an else, not a return: nvcc warns of an unreachable loop after one)
#pragma unroll
    for (int nb = 0; nb + 1 < NB; nb += 2) {
      uint32_t both[4];
      if constexpr (kBRows) load_b_nk_pair<LDB>(both, b_tile, nb * 8, k0);
      else load_b_kn_pair<LDB>(both, b_tile, k0, nb * 8);
      const uint32_t first[2] = {both[0], both[1]}, second[2] = {both[2], both[3]};
      fn(nb, first);
      fn(nb + 1, second);
    }
    if constexpr (NB % 2 == 1) {
      uint32_t last[2];
      if constexpr (kBRows) load_b_nk<LDB>(last, b_tile, (NB - 1) * 8, k0);
      else load_b_kn<LDB>(last, b_tile, k0, (NB - 1) * 8);
      fn(NB - 1, last);
    }
  }
}

// Max and sum over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int NB>
__device__ __forceinline__ void zero(float (&acc)[NB][4]) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
}

// Accumulator blocks 2j and 2j + 1 (16 x 16) as an A-fragment, rounded to bf16: the
// accumulator of one product feeds the next one without leaving registers.
template <int NB>
__device__ __forceinline__ void accumulator_as_a(const float (&acc)[NB][4], int j,
                                                 uint32_t (&frag)[4]) {
  frag[0] = pack_bf16(acc[2 * j][0], acc[2 * j][1]);
  frag[1] = pack_bf16(acc[2 * j][2], acc[2 * j][3]);
  frag[2] = pack_bf16(acc[2 * j + 1][0], acc[2 * j + 1][1]);
  frag[3] = pack_bf16(acc[2 * j + 1][2], acc[2 * j + 1][3]);
}

// acc (16 x 8 NB) += A B over D, A the warp's 16 rows of the row-major `a_tile` (D
// columns). kBRows: B^T is given, as the rows [0, 8 NB) of `b_tile` (a product like Q K^T);
// otherwise B itself, as the [D][8 NB] row-major `b_tile` (like W S). kPairedB: B's
// fragments two blocks per load (each_b_fragment), here and in the functions below.
template <bool kBRows, int D, int LDA, int LDB, int NB, bool kPairedB = false>
__device__ __forceinline__ void rows_times(const bf16_t* a_tile, const bf16_t* b_tile,
                                           float (&acc)[NB][4]) {
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t af[4];
    load_a<LDA>(af, a_tile, kk);
    each_b_fragment<kBRows, LDB, NB, kPairedB>(
        b_tile, kk, [&](int nb, const uint32_t(&bf)[2]) { mma_bf16_16816(acc[nb], af, bf); });
  }
}

// acc += A B^T over D columns: B^T the rows [0, 8 NB) of `b_tile` (as Q K^T).
template <int D, int LDA, int LDB, int NB, bool kPairedB = false>
__device__ __forceinline__ void rows_times_rows(const bf16_t* a_tile, const bf16_t* b_tile,
                                                float (&acc)[NB][4]) {
  rows_times<true, D, LDA, LDB, NB, kPairedB>(a_tile, b_tile, acc);
}

// acc += A B over D: B the [D][8 NB] row-major tile `b_tile` (as W S).
template <int D, int LDA, int LDB, int NB>
__device__ __forceinline__ void rows_times_matrix(const bf16_t* a_tile, const bf16_t* b_tile,
                                                  float (&acc)[NB][4]) {
  rows_times<false, D, LDA, LDB>(a_tile, b_tile, acc);
}

// rows_times_matrix with the sum over D in kSums partial sums, 16-row step s of D into
// sum s % kSums, the sums then added to acc in order:
//   acc += (sum_{s % kSums = 0} A_s B_s) + ... + (sum_{s % kSums = kSums - 1} A_s B_s).
// Each block's mma chain is then D / 16 / kSums long instead of D / 16, for a warp with
// few accumulator blocks, whose chains are a sequential pass's critical path (2 blocks of
// 16 steps a warp in the gated delta rule's v_new at K = 256). The sums' order differs
// from kSums = 1, so the results are not the same to the bit.
template <int kSums, int D, int LDA, int LDB, int NB>
__device__ __forceinline__ void rows_times_matrix_in_sums(const bf16_t* a_tile,
                                                          const bf16_t* b_tile,
                                                          float (&acc)[NB][4]) {
  static_assert(kSums >= 1 && D % (16 * kSums) == 0, "whole 16-row steps in each sum");
  if constexpr (kSums == 1) {
    rows_times_matrix<D, LDA, LDB, NB>(a_tile, b_tile, acc);
  } else {
    float sums[kSums][NB][4];
#pragma unroll
    for (int p = 0; p < kSums; ++p) zero(sums[p]);
#pragma unroll
    for (int kk = 0; kk < D; kk += 16) {
      uint32_t af[4];
      load_a<LDA>(af, a_tile, kk);
      float (&sum)[NB][4] = sums[kk / 16 % kSums];
      each_b_fragment<false, LDB, NB, false>(b_tile, kk, [&](int nb, const uint32_t(&bf)[2]) {
        mma_bf16_16816(sum[nb], af, bf);
      });
    }
#pragma unroll
    for (int p = 0; p < kSums; ++p) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nb][e] += sums[p][nb][e];
      }
    }
  }
}

// acc (16 x 8 NB) += X^T B over D rows: X^T's 16 rows are the columns [m0, m0 + 16) of
// `x` ([D][...] row-major), B the [D][8 NB] tile `b_tile` (as K^T v).
template <int D, int LDX, int LDB, int NB>
__device__ __forceinline__ void columns_times_matrix(const bf16_t* x, int m0, const bf16_t* b_tile,
                                                     float (&acc)[NB][4]) {
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t af[4];
    load_a_trans<LDX>(af, x, m0, kk);
    each_b_fragment<false, LDB, NB, false>(
        b_tile, kk, [&](int nb, const uint32_t(&bf)[2]) { mma_bf16_16816(acc[nb], af, bf); });
  }
}

// acc (16 x 8 NB) += X B, X (16 x 8 NX) held as an accumulator: its blocks rounded to bf16
// A-fragments, with B as in rows_times (kBRows: B^T given as rows [n][k]).
template <bool kBRows, int NX, int LDB, int NB, bool kPairedB = false>
__device__ __forceinline__ void accumulator_times(const float (&x)[NX][4], const bf16_t* b_tile,
                                                  float (&acc)[NB][4]) {
#pragma unroll
  for (int j = 0; j < NX / 2; ++j) {
    uint32_t af[4];
    accumulator_as_a(x, j, af);
    each_b_fragment<kBRows, LDB, NB, kPairedB>(
        b_tile, j * 16, [&](int nb, const uint32_t(&bf)[2]) { mma_bf16_16816(acc[nb], af, bf); });
  }
}

// acc (16 x 8 NB) += X B: B the rows [0, 8 NX) of a row-major tile of 8 NB columns (as P V).
template <int NX, int LDB, int NB, bool kPairedB = false>
__device__ __forceinline__ void accumulator_times_matrix(const float (&x)[NX][4],
                                                         const bf16_t* b_tile,
                                                         float (&acc)[NB][4]) {
  accumulator_times<false, NX, LDB, NB, kPairedB>(x, b_tile, acc);
}

// acc (16 x 8 NB) += X B^T: B^T the rows [0, 8 NB) of a row-major tile of 8 NX columns (as
// T A^T with A's rows).
template <int NX, int LDB, int NB>
__device__ __forceinline__ void accumulator_times_rows(const float (&x)[NX][4],
                                                       const bf16_t* b_tile,
                                                       float (&acc)[NB][4]) {
  accumulator_times<true, NX, LDB, NB>(x, b_tile, acc);
}

// The same products for kM row tiles at once (a warp owning 16 kM rows): each B fragment
// is loaded from shared memory once for the kM products, which halves the B traffic per
// product at kM = 2, and two blocks' fragments come in one load. (The one-tile functions
// above are kept as they are: written through these, some kernels compiled to different
// registers and spilled.)

// acc[m] (16 x 8 NB each) += A_m B^T over D, A_m the 16 rows at a_tile + m * a_stride and
// B^T the rows [0, 8 NB) of `b_tile` (as Q K^T for 16 kM query rows).
template <int kM, int D, int LDA, int LDB, int NB>
__device__ __forceinline__ void row_tiles_times_rows(const bf16_t* a_tile, int a_stride,
                                                     const bf16_t* b_tile,
                                                     float (&acc)[kM][NB][4]) {
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t af[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) load_a<LDA>(af[m], a_tile + m * a_stride, kk);
    each_b_fragment<true, LDB, NB, true>(b_tile, kk, [&](int nb, const uint32_t(&bf)[2]) {
#pragma unroll
      for (int m = 0; m < kM; ++m) mma_bf16_16816(acc[m][nb], af[m], bf);
    });
  }
}

// acc[m] (16 x 8 NB each) += X_m B, X_m (16 x 8 NX) held as an accumulator and B the rows
// [0, 8 NX) of a row-major tile of 8 NB columns (as P V for 16 kM query rows).
template <int kM, int NX, int LDB, int NB>
__device__ __forceinline__ void accumulators_times_matrix(const float (&x)[kM][NX][4],
                                                          const bf16_t* b_tile,
                                                          float (&acc)[kM][NB][4]) {
#pragma unroll
  for (int j = 0; j < NX / 2; ++j) {
    uint32_t af[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) accumulator_as_a(x[m], j, af[m]);
    each_b_fragment<false, LDB, NB, true>(b_tile, j * 16, [&](int nb, const uint32_t(&bf)[2]) {
#pragma unroll
      for (int m = 0; m < kM; ++m) mma_bf16_16816(acc[m][nb], af[m], bf);
    });
  }
}

}  // namespace ham::cuda::mma

#pragma once
// The tensor-core instructions of cuda/mma.cuh for the SIMT emulator: each is a warp-wide
// exchange (simt.h) whose combine step reads every lane's fragments in the layouts the PTX
// ISA gives (cuda/mma.cuh repeats them) and writes every lane's results. Products of bf16
// are exact in f32; the emulator adds them in f64 and rounds once into the f32 accumulator.
#include <cstdint>

#include "cuda/emulator/simt.h"

namespace ham::cuda::emulator {

// d += A B (16 x 8 x 16, bf16 in, f32 accumulate).
void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

struct LdmatrixLane {
  const void* row;
  uint32_t* out;
  const void* pc;  // the lane's ldmatrix, for the racecheck's messages
};
void ldmatrix_combine_x1(void* const* lanes, unsigned mask);
void ldmatrix_combine_x2(void* const* lanes, unsigned mask);
void ldmatrix_combine_x4(void* const* lanes, unsigned mask);
void ldmatrix_combine_x1_trans(void* const* lanes, unsigned mask);
void ldmatrix_combine_x2_trans(void* const* lanes, unsigned mask);
void ldmatrix_combine_x4_trans(void* const* lanes, unsigned mask);

// N 8 x 8 matrices of b16 from this lane's row address (see cuda/mma.cuh).
template <int N, bool kTranspose>
void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  LdmatrixLane lane{row, r, code_address_here()};
  WarpCombine combine = nullptr;
  if constexpr (kTranspose) {
    combine = N == 1 ? &ldmatrix_combine_x1_trans
              : N == 2 ? &ldmatrix_combine_x2_trans
                       : &ldmatrix_combine_x4_trans;
  } else {
    combine = N == 1 ? &ldmatrix_combine_x1 : N == 2 ? &ldmatrix_combine_x2 : &ldmatrix_combine_x4;
  }
  warp_exchange(0xffffffffu, &lane, combine, kTranspose ? "ldmatrix.trans" : "ldmatrix");
}

// Two floats rounded to bf16 (nearest even), `lo` in the low half.
uint32_t pack_bf16(float lo, float hi);

// The shared-memory address of `p` in the block's dynamic shared memory, counted from its
// start (what __cvta_generic_to_shared gives on a GPU, where static __shared__ variables
// may come first); an error outside it.
uint32_t shared_address(const void* p);

// One warp's part of wgmma.mma_async m64nNk16 (cuda/wgmma.cuh): its 16 rows of D (64 x N,
// `d` holding N / 2 floats in the C layout) += A B. A is the warp's 16 x 16 from registers
// (`a`, four words in the mma.m16n8k16 A layout) or, when `a` is null, rows 16 w .. of the
// K-major swizzled tile `desc_a` names, w = the warp within its warpgroup; B (16 x N) is the
// K-major (`b_mn_major` false) or MN-major swizzled tile `desc_b` names. Descriptors
// are decoded as the hardware does (128-byte swizzle only). Products are exact in f32 and
// added in f64, rounded once into d. It fails where an operand holds a write no fence
// handed to the tensor cores, or changes before the wait that covers it (simt.h).
void wgmma_bf16(float* d, int n, const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
                bool b_mn_major);

}  // namespace ham::cuda::emulator

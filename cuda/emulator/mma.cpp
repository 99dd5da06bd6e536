// mma.sync and ldmatrix for the SIMT emulator (cuda/emulator/mma.h).
#include "cuda/emulator/mma.h"

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace ham::cuda::emulator {

namespace {

constexpr unsigned kFullWarp = 0xffffffffu;

float low_bf16(uint32_t word) { return bf16_to_float(BFloat16{uint16_t(word & 0xffffu)}); }
float high_bf16(uint32_t word) { return bf16_to_float(BFloat16{uint16_t(word >> 16)}); }

struct MmaLane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
};

void mma_combine(void* const* lanes, unsigned mask) {
  HAM_CHECK(mask == kFullWarp, "mma.sync needs the whole warp");
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto* in = static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int half = 0; half < 2; ++half) {  // a0/a1: columns 2t..; a2/a3: columns 2t + 8..
      const int col = 2 * t + 8 * half;
      A[g][col] = low_bf16(in->a[2 * half]);
      A[g][col + 1] = high_bf16(in->a[2 * half]);
      A[g + 8][col] = low_bf16(in->a[2 * half + 1]);
      A[g + 8][col + 1] = high_bf16(in->a[2 * half + 1]);
      B[col][g] = low_bf16(in->b[half]);
      B[col + 1][g] = high_bf16(in->b[half]);
    }
    C[g][2 * t] = in->d[0];
    C[g][2 * t + 1] = in->d[1];
    C[g + 8][2 * t] = in->d[2];
    C[g + 8][2 * t + 1] = in->d[3];
  }
  for (int lane = 0; lane < 32; ++lane) {
    auto* out = static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int r = 0; r < 4; ++r) {
      double sum = C[rows[r]][cols[r]];
      for (int k = 0; k < 16; ++k) sum += double(A[rows[r]][k]) * double(B[k][cols[r]]);
      out->d[r] = float(sum);
    }
  }
}

template <int N, bool kTranspose>
void ldmatrix_combine(void* const* lanes, unsigned mask) {
  HAM_CHECK(mask == kFullWarp, "ldmatrix needs the whole warp");
  uint16_t M[N][8][8];
  for (int j = 0; j < N; ++j) {
    for (int i = 0; i < 8; ++i) {
      const void* row = static_cast<const LdmatrixLane*>(lanes[8 * j + i])->row;
      HAM_CHECK(reinterpret_cast<uintptr_t>(row) % 16 == 0, "ldmatrix row ", i,
                " of matrix ", j, " (lane ", 8 * j + i, ") is not 16-byte aligned");
      std::memcpy(M[j][i], row, 16);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t* out = static_cast<const LdmatrixLane*>(lanes[lane])->out;
    const int r = lane / 4, c = 2 * (lane % 4);
    for (int j = 0; j < N; ++j) {
      const uint16_t lo = kTranspose ? M[j][c][r] : M[j][r][c];
      const uint16_t hi = kTranspose ? M[j][c + 1][r] : M[j][r][c + 1];
      out[j] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
}

}  // namespace

void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaLane lane{d, a, b};
  warp_exchange(kFullWarp, &lane, &mma_combine, "mma.sync.m16n8k16.bf16");
}

void ldmatrix_combine_x1(void* const* l, unsigned m) { ldmatrix_combine<1, false>(l, m); }
void ldmatrix_combine_x2(void* const* l, unsigned m) { ldmatrix_combine<2, false>(l, m); }
void ldmatrix_combine_x4(void* const* l, unsigned m) { ldmatrix_combine<4, false>(l, m); }
void ldmatrix_combine_x1_trans(void* const* l, unsigned m) { ldmatrix_combine<1, true>(l, m); }
void ldmatrix_combine_x2_trans(void* const* l, unsigned m) { ldmatrix_combine<2, true>(l, m); }
void ldmatrix_combine_x4_trans(void* const* l, unsigned m) { ldmatrix_combine<4, true>(l, m); }

uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(float_to_bf16(lo).bits) | uint32_t(float_to_bf16(hi).bits) << 16;
}

}  // namespace ham::cuda::emulator

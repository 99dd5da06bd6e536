// The warpgroup tensor-core primitives (cuda/wgmma.cuh) on their own, so that a fault in
// their layouts shows here before it shows in a kernel built on them: products of tiles
// stored with the 128-byte swizzle, read through descriptors (A and B K-major; A from
// registers with B MN-major), against the same products on the host, exactly (small
// integers). Compiled by nvcc into test_cuda, where it runs on a GPU of compute capability
// 9.0 from sm_90a code and skips elsewhere, and as C++ into test_cuda_emulator
// (tests/cuda_emulator/test_wgmma_emulated.cpp), where the emulator decodes the
// descriptors as the PTX ISA describes them and also refuses a misplaced one.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/wgmma.cuh"
#include "tests/error_testing.h"
#include "tests/testing.h"

namespace ham::cuda {
namespace {

constexpr int kRows = 64, kCols = 128;
constexpr size_t kTile = size_t(kRows) * kCols;

// This warp's rows of A's first 64 columns (A: 64 x kCols, row-major, in global memory) as
// mma.m16n8k16 A fragments, 16 columns from 16 j each (where the kernels below use it).
#if HAM_WGMMA_DEVICE
__device__ __forceinline__ void a_fragments(const uint16_t* a, uint32_t (&frags)[4][4]) {
  const int warp = int(threadIdx.x / 32), g = int(threadIdx.x % 32) / 4, t = int(threadIdx.x % 4);
  auto pair = [&](int r, int k) {
    return uint32_t(a[r * kCols + k]) | uint32_t(a[r * kCols + k + 1]) << 16;
  };
  for (int j = 0; j < 4; ++j) {
    const int row = 16 * warp + g, col = 16 * j + 2 * t;
    frags[j][0] = pair(row, col);
    frags[j][1] = pair(row + 8, col);
    frags[j][2] = pair(row, col + 8);
    frags[j][3] = pair(row + 8, col + 8);
  }
}
#endif

// D1 (64 x 64) = A B^T, both by K-major descriptor, the first step overwriting D1; D2
// (64 x 128) = 0.5 + A[:, 0:64] C, A's fragments built in registers, C by MN-major
// descriptor; A, B, C 64 x 128. Both written out row-major. `misplace` shifts B's first
// descriptor by one swizzle row. *status: 1 where the wgmma code ran, -1 in a compilation
// without it (host code for another GPU).
__global__ void wgmma_tiles(const uint16_t* a, const uint16_t* b, const uint16_t* c, float* d1,
                            float* d2, int misplace, int* status) {
#if HAM_WGMMA_DEVICE
  HAM_DYNAMIC_SHARED(unsigned char, raw);
  uint16_t* A = reinterpret_cast<uint16_t*>(wgmma::swizzle_aligned(raw));
  uint16_t *B = A + kTile, *C = B + kTile;
  for (int i = int(threadIdx.x); i < int(kTile); i += 128) {
    const int r = i / kCols, col = i % kCols;
    A[wgmma::swizzled_index<kRows>(r, col)] = a[i];
    B[wgmma::swizzled_index<kRows>(r, col)] = b[i];
    C[wgmma::swizzled_index<kRows>(r, col)] = c[i];
  }
  wgmma::fence_proxy_async();
  __syncthreads();
  const uint32_t tile_a = wgmma::shared_address(A), tile_b = wgmma::shared_address(B);
  const uint32_t tile_c = wgmma::shared_address(C);
  const int warp = int(threadIdx.x / 32), g = int(threadIdx.x % 32) / 4, t = int(threadIdx.x % 4);
  float acc1[8][4], acc2[16][4];
  for (auto& block : acc2) block[0] = block[1] = block[2] = block[3] = 0.5f;
  uint32_t frags[4][4];
  a_fragments(a, frags);
  wgmma::fence();
  wgmma::mma_ss<64, false>(acc1, wgmma::k_major<kRows>(tile_a, 0),
                           wgmma::k_major<kRows>(tile_b + uint32_t(misplace) * 128, 0));
#pragma unroll
  for (int kk = 16; kk < kCols; kk += 16) {
    wgmma::mma_ss<64, true>(acc1, wgmma::k_major<kRows>(tile_a, kk),
                            wgmma::k_major<kRows>(tile_b, kk));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wgmma::mma_rs<128>(acc2, frags[j], wgmma::mn_major<kRows>(tile_c, 16 * j));
  }
  wgmma::commit();
  wgmma::wait<0>();
  for (int e = 0; e < 4; ++e) {
    const int row = 16 * warp + g + 8 * (e / 2), col = 2 * t + e % 2;
#pragma unroll
    for (int j = 0; j < 8; ++j) d1[row * 64 + 8 * j + col] = acc1[j][e];
#pragma unroll
    for (int j = 0; j < 16; ++j) d2[row * kCols + 8 * j + col] = acc2[j][e];
  }
  if (threadIdx.x == 0) *status = 1;
#else
  if (threadIdx.x == 0) *status = -1;
#endif
}

// Device copies of the inputs and outputs, freed at the end.
struct Buffers {
  uint16_t *a = nullptr, *b = nullptr, *c = nullptr;
  float *d1 = nullptr, *d2 = nullptr;
  int* status = nullptr;
  Buffers() {
    for (uint16_t** p : {&a, &b, &c}) {
      HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(p), kTile * 2));
    }
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d1), 64 * 64 * sizeof(float)));
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d2), kTile * sizeof(float)));
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&status), sizeof(int)));
  }
  ~Buffers() {
    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c),
                    static_cast<void*>(d1), static_cast<void*>(d2), static_cast<void*>(status)}) {
      cudaFree(p);
    }
  }
  void launch(int misplace) {
    const size_t shared = wgmma::kSwizzleAtomBytes + 3 * kTile * 2;
    HAM_CUDA_CHECK(cudaFuncSetAttribute(wgmma_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(shared)));
    HAM_LAUNCH(1, 128, shared, nullptr, wgmma_tiles)(a, b, c, d1, d2, misplace, status);
    HAM_CUDA_CHECK_LAUNCH();
    HAM_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

// Whether the current device runs wgmma: compute capability 9.0, or the SIMT emulator.
bool device_runs_wgmma() {
  int device = 0, major = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  HAM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
#ifdef HAM_CUDA_EMULATOR
  return true;
#else
  return major == 9;
#endif
}

TEST(WgmmaGpu, ProductsOfSwizzledTilesThroughDescriptorsAreExact) {
  HAM_SKIP_UNLESS_CUDA();
  if (!device_runs_wgmma()) GTEST_SKIP() << "wgmma needs a GPU of compute capability 9.0";
  std::vector<uint16_t> a(kTile), b(kTile), c(kTile);
  for (size_t i = 0; i < kTile; ++i) {
    a[i] = float_to_bf16(float(int(i * 7 % 13) - 6)).bits;
    b[i] = float_to_bf16(float(int(i * 5 % 11) - 5) * 0.5f).bits;
    c[i] = float_to_bf16(float(int(i * 3 % 7) - 3)).bits;
  }
  auto at = [](const std::vector<uint16_t>& x, int r, int k) {
    return double(bf16_to_float({x[size_t(r * kCols + k)]}));
  };
  Buffers dev;
  HAM_CUDA_CHECK(cudaMemcpy(dev.a, a.data(), kTile * 2, cudaMemcpyHostToDevice));
  HAM_CUDA_CHECK(cudaMemcpy(dev.b, b.data(), kTile * 2, cudaMemcpyHostToDevice));
  HAM_CUDA_CHECK(cudaMemcpy(dev.c, c.data(), kTile * 2, cudaMemcpyHostToDevice));
  dev.launch(0);
  int status = 0;
  HAM_CUDA_CHECK(cudaMemcpy(&status, dev.status, sizeof(int), cudaMemcpyDeviceToHost));
  if (status == -1) {
    GTEST_SKIP() << "this build has no sm_90a code (90a in CMAKE_CUDA_ARCHITECTURES)";
  }
  ASSERT_EQ(status, 1);
  std::vector<float> d1(64 * 64), d2(kTile);
  HAM_CUDA_CHECK(cudaMemcpy(d1.data(), dev.d1, d1.size() * 4, cudaMemcpyDeviceToHost));
  HAM_CUDA_CHECK(cudaMemcpy(d2.data(), dev.d2, d2.size() * 4, cudaMemcpyDeviceToHost));
  for (int m = 0; m < 64; ++m) {
    for (int j = 0; j < 64; ++j) {
      double want = 0;
      for (int k = 0; k < kCols; ++k) want += at(a, m, k) * at(b, j, k);
      ASSERT_EQ(d1[size_t(m * 64 + j)], float(want)) << "A B^T [" << m << "][" << j << "]";
    }
    for (int j = 0; j < kCols; ++j) {
      double want = 0.5;
      for (int k = 0; k < 64; ++k) want += at(a, m, k) * at(c, k, j);
      ASSERT_EQ(d2[size_t(m * kCols + j)], float(want)) << "0.5 + A C [" << m << "][" << j << "]";
    }
  }
#ifdef HAM_CUDA_EMULATOR
  // A tile that does not start a swizzle atom is refused, not read in another order.
  testing::expect_error([&] { dev.launch(1); },
                        {"wgmma_tiles", "wgmma", "B starts at shared address",
                         "1024-byte swizzle atom"});
#endif
}

// The narrow and wide products the attention kernels take at their largest and smallest
// tiles: D3 (64 x 32) = A B32^T with mma_ss<32> (B32: 32 rows, its own swizzled tile of
// 32 rows), then D4 (64 x 256) and D5 (64 x 192) = A[:, 0:64] W with
// fragments_times_matrix (W: 64 x 256, four panels; a product past 128 columns is two
// wgmmas, the second from W's third panel on). Written out row-major; *status as above.
constexpr int kWide = 256, kNarrow = 32;

// This lane's elements of a warpgroup's 64 x (8 kBlocks) accumulator, stored row-major.
template <int kBlocks>
__device__ __forceinline__ void store_rows(float* d, const float (&acc)[kBlocks][4]) {
  const int warp = int(threadIdx.x / 32), g = int(threadIdx.x % 32) / 4, t = int(threadIdx.x % 4);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = 16 * warp + g + 8 * (e / 2), col = 2 * t + e % 2;
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) d[row * 8 * kBlocks + 8 * j + col] = acc[j][e];
  }
}

__global__ void wgmma_narrow_and_wide(const uint16_t* a, const uint16_t* b32, const uint16_t* w,
                                      float* d3, float* d4, float* d5, int* status) {
#if HAM_WGMMA_DEVICE
  HAM_DYNAMIC_SHARED(unsigned char, raw);
  uint16_t* A = reinterpret_cast<uint16_t*>(wgmma::swizzle_aligned(raw));
  uint16_t *B = A + kTile, *W = B + kNarrow * kCols;
  for (int i = int(threadIdx.x); i < int(kTile); i += 128) {
    A[wgmma::swizzled_index<kRows>(i / kCols, i % kCols)] = a[i];
  }
  for (int i = int(threadIdx.x); i < kNarrow * kCols; i += 128) {
    B[wgmma::swizzled_index<kNarrow>(i / kCols, i % kCols)] = b32[i];
  }
  for (int i = int(threadIdx.x); i < kRows * kWide; i += 128) {
    W[wgmma::swizzled_index<kRows>(i / kWide, i % kWide)] = w[i];
  }
  wgmma::fence_proxy_async();
  __syncthreads();
  const uint32_t tile_a = wgmma::shared_address(A), tile_b = wgmma::shared_address(B);
  const uint32_t tile_w = wgmma::shared_address(W);
  uint32_t frags[4][4];
  a_fragments(a, frags);
  {
    float acc[kNarrow / 8][4];
    wgmma::fence();
    wgmma::rows_times_rows<kNarrow, kCols, kRows, kNarrow>(acc, tile_a, tile_b);
    wgmma::commit();
    wgmma::wait<0>();
    store_rows(d3, acc);
  }
  {
    float acc[kWide / 8][4] = {};
    wgmma::fence();
    wgmma::fragments_times_matrix<kWide, 64, kRows>(acc, frags, tile_w);
    wgmma::commit();
    wgmma::wait<0>();
    store_rows(d4, acc);
  }
  {
    float acc[192 / 8][4] = {};
    wgmma::fence();
    wgmma::fragments_times_matrix<192, 64, kRows>(acc, frags, tile_w);
    wgmma::commit();
    wgmma::wait<0>();
    store_rows(d5, acc);
  }
  if (threadIdx.x == 0) *status = 1;
#else
  if (threadIdx.x == 0) *status = -1;
#endif
}

TEST(WgmmaGpu, NarrowAndWideProductsAreExact) {
  HAM_SKIP_UNLESS_CUDA();
  if (!device_runs_wgmma()) GTEST_SKIP() << "wgmma needs a GPU of compute capability 9.0";
  std::vector<uint16_t> a(kTile), b(size_t(kNarrow) * kCols), w(size_t(kRows) * kWide);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float_to_bf16(float(int(i * 7 % 13) - 6)).bits;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float_to_bf16(float(int(i * 5 % 11) - 5)).bits;
  for (size_t i = 0; i < w.size(); ++i) w[i] = float_to_bf16(float(int(i * 3 % 7) - 3)).bits;
  auto value = [](const std::vector<uint16_t>& x, size_t i) {
    return double(bf16_to_float({x[i]}));
  };
  std::vector<uint16_t*> inputs(3);
  std::vector<float*> outputs(3);
  const std::vector<const std::vector<uint16_t>*> host = {&a, &b, &w};
  const size_t out_sizes[3] = {size_t(kRows) * kNarrow, size_t(kRows) * kWide,
                               size_t(kRows) * 192};
  int* status = nullptr;
  for (int i = 0; i < 3; ++i) {
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&inputs[i]), host[i]->size() * 2));
    HAM_CUDA_CHECK(cudaMemcpy(inputs[i], host[i]->data(), host[i]->size() * 2,
                              cudaMemcpyHostToDevice));
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&outputs[i]), out_sizes[i] * 4));
  }
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&status), sizeof(int)));
  const size_t shared = wgmma::kSwizzleAtomBytes + (a.size() + b.size() + w.size()) * 2;
  HAM_CUDA_CHECK(cudaFuncSetAttribute(wgmma_narrow_and_wide,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
  HAM_LAUNCH(1, 128, shared, nullptr, wgmma_narrow_and_wide)(
      inputs[0], inputs[1], inputs[2], outputs[0], outputs[1], outputs[2], status);
  HAM_CUDA_CHECK_LAUNCH();
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  int ran = 0;
  HAM_CUDA_CHECK(cudaMemcpy(&ran, status, sizeof(int), cudaMemcpyDeviceToHost));
  std::vector<std::vector<float>> got(3);
  for (int i = 0; i < 3; ++i) {
    got[i].resize(out_sizes[i]);
    HAM_CUDA_CHECK(cudaMemcpy(got[i].data(), outputs[i], out_sizes[i] * 4,
                              cudaMemcpyDeviceToHost));
    cudaFree(inputs[i]);
    cudaFree(outputs[i]);
  }
  cudaFree(status);
  if (ran == -1) GTEST_SKIP() << "this build has no sm_90a code (90a in CMAKE_CUDA_ARCHITECTURES)";
  ASSERT_EQ(ran, 1);
  for (int m = 0; m < kRows; ++m) {
    for (int j = 0; j < kNarrow; ++j) {
      double want = 0;
      for (int k = 0; k < kCols; ++k) {
        want += value(a, size_t(m * kCols + k)) * value(b, size_t(j * kCols + k));
      }
      ASSERT_EQ(got[0][size_t(m * kNarrow + j)], float(want))
          << "A B32^T [" << m << "][" << j << "]";
    }
    for (int j = 0; j < kWide; ++j) {
      double want = 0;
      for (int k = 0; k < 64; ++k) {
        want += value(a, size_t(m * kCols + k)) * value(w, size_t(k * kWide + j));
      }
      ASSERT_EQ(got[1][size_t(m * kWide + j)], float(want)) << "A W [" << m << "][" << j << "]";
      if (j < 192) {
        ASSERT_EQ(got[2][size_t(m * 192 + j)], float(want))
            << "A W[:, :192] [" << m << "][" << j << "]";
      }
    }
  }
}

}  // namespace
}  // namespace ham::cuda

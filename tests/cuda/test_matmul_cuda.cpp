// matmul on the GPU (cuBLASLt) against the CPU reference, on fresh random inputs.
// Relative RMS error: <= 1e-5 for f32 (full fp32, TF32 off), <= 1e-2 for bf16 (the CPU
// computes in f32 from the same bf16-rounded inputs), 1e-12 for f64.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>

#include "core/ops/matmul.h"
#include "tests/testing.h"
#include "tests/error_testing.h"

namespace ham {
namespace {

using testing::random_tensor;
using testing::relative_rms_error;

std::atomic<uint64_t> next_seed{1000};

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::BF16: return 1e-2;
    default: return 1e-5;
  }
}

// The CPU reference in f32 (f64 for f64) of alpha op(A) op(B) + beta C.
Tensor cpu_reference(const Tensor& a, const Tensor& b, const Tensor& c, bool ta, bool tb,
                     double alpha, double beta) {
  DType compute = a.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor out = c.to(Device::cpu()).to(compute).clone();
  ops::gemm(a.to(Device::cpu()).to(compute), b.to(Device::cpu()).to(compute), out, ta, tb, alpha,
            beta);
  return out;
}

struct Case {
  Shape a, b;
  bool trans_a = false, trans_b = false;
  double alpha = 1.0, beta = 0.0;
};

void check_case(const Case& cs, DType dtype) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " A" + shape_str(cs.a) + (cs.trans_a ? "^T" : "") +
               " B" + shape_str(cs.b) + (cs.trans_b ? "^T" : "") +
               " alpha=" + std::to_string(cs.alpha) + " beta=" + std::to_string(cs.beta));
  Tensor a = random_tensor(cs.a, dtype, Device::cpu(), next_seed++);
  Tensor b = random_tensor(cs.b, dtype, Device::cpu(), next_seed++);
  GemmShape s = ops::gemm_shape(a, b, cs.trans_a, cs.trans_b);
  Shape c_shape(cs.a.size() >= cs.b.size() ? cs.a.begin() : cs.b.begin(),
                cs.a.size() >= cs.b.size() ? cs.a.end() - 2 : cs.b.end() - 2);
  c_shape.push_back(s.m);
  c_shape.push_back(s.n);
  Tensor c = random_tensor(c_shape, dtype, Device::cpu(), next_seed++);
  Tensor ref = cpu_reference(a, b, c, cs.trans_a, cs.trans_b, cs.alpha, cs.beta);

  Tensor a_gpu = a.to(Device::cuda()), b_gpu = b.to(Device::cuda());
  Tensor c_gpu = c.to(Device::cuda());
  if (cs.beta == 0.0) c_gpu.fill_(NAN);  // beta = 0 must overwrite even NaN
  ops::gemm(a_gpu, b_gpu, c_gpu, cs.trans_a, cs.trans_b, cs.alpha, cs.beta);
  EXPECT_LE(relative_rms_error(c_gpu.to(Device::cpu()), ref), tolerance(dtype));

  if (cs.alpha == 1.0 && cs.beta == 0.0) {
    Tensor out = ops::matmul(a_gpu, b_gpu, cs.trans_a, cs.trans_b);
    EXPECT_EQ(out.device(), Device::cuda());
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_LE(relative_rms_error(out.to(Device::cpu()), ref), tolerance(dtype));
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{64, 32}, {32, 48}},
      {{33, 17}, {17, 29}},                       // odd sizes: unaligned rows
      {{17, 33}, {17, 29}, true, false},          // A^T
      {{33, 17}, {29, 17}, false, true},          // B^T
      {{17, 33}, {29, 17}, true, true},           // both
      {{256, 512}, {512, 384}},
      {{1, 1000}, {1000, 1}},                     // a dot product
      {{4, 37, 19}, {19, 23}},                    // Linear: batch shares 2-D B (folded)
      {{4, 19, 37}, {19, 23}, true, false},       // shared B, transposed A: strided
      {{3, 2, 16, 24}, {3, 2, 24, 8}},            // batched, 2 batch dims
      {{5, 24, 16}, {5, 8, 24}, true, true},      // batched, both transposed
      {{24, 16}, {6, 16, 40}},                    // shared A, batched B
      {{40, 64}, {64, 30}, false, false, 0.5, 0.0},
      {{40, 64}, {64, 30}, false, false, 1.0, 1.0},   // accumulate
      {{40, 64}, {30, 64}, false, true, -2.0, 0.25},  // scale both
  };
  return all;
}

TEST(CudaMatmul, F32MatchesCpuReference) {
  HAM_SKIP_UNLESS_CUDA();
  for (const Case& cs : cases()) check_case(cs, DType::F32);
}

TEST(CudaMatmul, Bf16WithFp32AccumulationMatchesCpuReference) {
  HAM_SKIP_UNLESS_CUDA();
  for (const Case& cs : cases()) check_case(cs, DType::BF16);
}

TEST(CudaMatmul, F64MatchesCpuReference) {
  HAM_SKIP_UNLESS_CUDA();
  for (const Case& cs : cases()) check_case(cs, DType::F64);
}

TEST(CudaMatmul, LargeSquareF32AndBf16) {
  HAM_SKIP_UNLESS_CUDA();
  check_case({{1024, 1536}, {1536, 768}}, DType::F32);
  check_case({{1024, 1536}, {768, 1536}, false, true}, DType::BF16);
}

// The trainer's MFU denominator on a GPU (ops::measure_matmul_peak_flops): with tensor
// cores the bf16 GEMM peak is several times the f32 one (TF32 off; the H200's spec sheet:
// 989 against 67 TFLOP/s), and a large bf16 GEMM timed here alone never beats it by more
// than the clock's noise.
TEST(CudaMatmul, MeasuredPeakOfBf16ExceedsF32AndBoundsALargeGemm) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_TESTS_ON_SIMT_EMULATOR
  GTEST_SKIP() << "the SIMT emulator has no tensor cores: the two peaks' ratio is the GPU's";
#endif
  const Device gpu = Device::cuda();
  const double bf16_peak = ops::measure_matmul_peak_flops(gpu, DType::BF16);
  const double f32_peak = ops::measure_matmul_peak_flops(gpu, DType::F32);
  EXPECT_GT(bf16_peak, 3 * f32_peak) << "bf16 " << bf16_peak << ", f32 " << f32_peak;
  const int64_t n = 4096;
  const Tensor a = random_tensor({n, n}, DType::BF16, gpu, next_seed++);
  const Tensor b = random_tensor({n, n}, DType::BF16, gpu, next_seed++);
  Tensor c = Tensor::empty({n, n}, DType::BF16, gpu);
  ops::gemm(a, b, c, false, false);
  c.to(Device::cpu());  // waits for the warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) ops::gemm(a, b, c, false, false);
  c.to(Device::cpu());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LE(8 * 2.0 * double(n * n * n) / seconds, 1.1 * bf16_peak) << "bf16 peak " << bf16_peak;
  testing::expect_error([&] { ops::measure_matmul_peak_flops(gpu, DType::BF16, 0); },
                        {"measure_matmul_peak_flops", "trials must be at least 1", "0"});
}

TEST(CudaMatmul, UnalignedViewsMatchCpuReference) {
  HAM_SKIP_UNLESS_CUDA();
  // Row slices start at odd offsets inside their storage: pointers only 4-byte aligned.
  Tensor a_full = random_tensor({41, 13}, DType::F32, Device::cpu(), next_seed++);
  Tensor b = random_tensor({13, 7}, DType::F32, Device::cpu(), next_seed++);
  Tensor a = a_full.slice(1, 40);
  Tensor ref = ops::matmul(a, b);
  Tensor out = ops::matmul(a_full.to(Device::cuda()).slice(1, 40), b.to(Device::cuda()));
  EXPECT_LE(relative_rms_error(out.to(Device::cpu()), ref), 1e-5);
}

// K = 0 leaves C = beta * C, which cuBLASLt is not asked for: a kernel of ours scales C.
TEST(CudaMatmul, EmptyInnerDimensionScalesC) {
  HAM_SKIP_UNLESS_CUDA();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = Tensor::empty({2, 3, 0}, dtype, Device::cuda());
    Tensor b = Tensor::empty({2, 0, 517}, dtype, Device::cuda());
    Tensor c = random_tensor({2, 3, 517}, dtype, Device::cuda(), next_seed++);
    const Tensor expected = cpu_reference(a, b, c, false, false, 1.0, 0.37);
    ops::gemm(a, b, c, false, false, 1.0, 0.37);
    EXPECT_LE(relative_rms_error(c.to(Device::cpu()), expected), tolerance(dtype));
    ops::gemm(a, b, c, false, false, 1.0, 0.0);  // beta 0: zeros, whatever C held
    EXPECT_EQ(c.to(Device::cpu()).to(DType::F64).to_vector<double>(),
              std::vector<double>(c.numel(), 0.0));
    Tensor zeros = ops::matmul(a, b);
    EXPECT_EQ(zeros.to(Device::cpu()).to(DType::F64).to_vector<double>(),
              std::vector<double>(zeros.numel(), 0.0));
  }
}

TEST(CudaMatmul, MixedDevicesAreAOneLineError) {
  HAM_SKIP_UNLESS_CUDA();
  Tensor a = random_tensor({4, 4}, DType::F32, Device::cpu(), next_seed++);
  testing::expect_error([&] { ops::matmul(a, a.to(Device::cuda())); },
                        {"matmul", "different devices", "[4, 4]"});
}

TEST(CudaMatmul, IntegerDtypeIsAOneLineError) {
  HAM_SKIP_UNLESS_CUDA();
  Tensor a = Tensor::zeros({4, 4}, DType::I32, Device::cuda());
  testing::expect_error([&] { ops::matmul(a, a); }, {"matmul", "i32"});
}

}  // namespace
}  // namespace ham

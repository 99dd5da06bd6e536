#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "core/ops/matmul.h"
#include "core/random.h"

namespace ham {

HAM_DEFINE_KERNEL_TABLE(gemm, &cpu::gemm,
                        void(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape&))

namespace ops {

GemmShape gemm_shape(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  auto fail = [&](const char* why) {
    HAM_FAIL("matmul: ", why, ": A", shape_str(a.shape()), trans_a ? "^T" : "", " @ B",
             shape_str(b.shape()), trans_b ? "^T" : "");
  };
  if (a.dim() < 2 || b.dim() < 2) fail("operands need at least 2 dims");
  if (a.dtype() != b.dtype()) {
    fail(("dtypes differ (" + std::string(dtype_name(a.dtype())) + " and " +
          dtype_name(b.dtype()) + ")").c_str());
  }
  if (a.device() != b.device()) {
    fail(("operands on different devices (" + a.device().str() + " and " + b.device().str() +
          ")").c_str());
  }
  GemmShape s;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  int64_t a_rows = a.size(-2), a_cols = a.size(-1);
  int64_t b_rows = b.size(-2), b_cols = b.size(-1);
  s.m = trans_a ? a_cols : a_rows;
  s.k = trans_a ? a_rows : a_cols;
  int64_t kb = trans_b ? b_cols : b_rows;
  s.n = trans_b ? b_rows : b_cols;
  if (s.k != kb) fail("inner dimensions differ");
  Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  if (b_batch.empty()) {
    s.batch = shape_numel(a_batch);
    s.a_batch_stride = a_rows * a_cols;
    s.b_batch_stride = 0;
  } else if (a_batch.empty()) {
    s.batch = shape_numel(b_batch);
    s.a_batch_stride = 0;
    s.b_batch_stride = b_rows * b_cols;
  } else {
    if (a_batch != b_batch) fail("batch dimensions differ");
    s.batch = shape_numel(a_batch);
    s.a_batch_stride = a_rows * a_cols;
    s.b_batch_stride = b_rows * b_cols;
  }
  return s;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  GemmShape s = gemm_shape(a, b, trans_a, trans_b);
  Shape out_shape(a.dim() >= b.dim() ? a.shape().begin() : b.shape().begin(),
                  a.dim() >= b.dim() ? a.shape().end() - 2 : b.shape().end() - 2);
  out_shape.push_back(s.m);
  out_shape.push_back(s.n);
  Tensor c = Tensor::empty(out_shape, a.dtype(), a.device());
  gemm_kernels()(a.device(), a, b, c, s);
  return c;
}

void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, double alpha,
          double beta) {
  GemmShape s = gemm_shape(a, b, trans_a, trans_b);
  s.alpha = alpha;
  s.beta = beta;
  HAM_CHECK(c.numel() == s.batch * s.m * s.n && c.dim() >= 2 && c.size(-2) == s.m &&
                c.size(-1) == s.n,
            "gemm: output shape ", shape_str(c.shape()), " does not match [", s.batch, " x ", s.m,
            ", ", s.n, "] for A", shape_str(a.shape()), " @ B", shape_str(b.shape()));
  const bool wide_output = a.dtype() == DType::BF16 && c.dtype() == DType::F32;
  HAM_CHECK((c.dtype() == a.dtype() || wide_output) && c.device() == a.device(),
            "gemm: output ", c.str(), " must be on the operands' device with their dtype ",
            dtype_name(a.dtype()), a.dtype() == DType::BF16 ? " (or f32)" : "");
  gemm_kernels()(a.device(), a, b, c, s);
}

double measure_matmul_peak_flops(Device device, DType dtype, int trials) {
  HAM_CHECK(trials >= 1, "measure_matmul_peak_flops: trials must be at least 1, got ", trials);
  Generator gen(0);
  auto seconds_for = [&](int64_t n, int gemms) {
    const Tensor a = uniform({n, n}, gen, -1, 1, dtype, device);
    const Tensor b = uniform({n, n}, gen, -1, 1, dtype, device);
    Tensor c = Tensor::empty({n, n}, dtype, device);
    gemm(a, b, c, false, false);  // warm-up: the library's first call may set itself up
    unsigned char last = 0;
    device_backend(device).copy_to_host(&last, c.raw_data(), 1, device);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < gemms; ++i) gemm(a, b, c, false, false);
    device_backend(device).copy_to_host(&last, c.raw_data(), 1, device);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int64_t n = 256;
  while (n < 8192 && seconds_for(n, 1) < 2e-3) n *= 2;
  constexpr int kGemms = 4;
  double best = 1e30;
  for (int t = 0; t < trials; ++t) best = std::min(best, seconds_for(n, kGemms));
  return kGemms * 2.0 * double(n) * double(n) * double(n) / best;
}

}  // namespace ops
}  // namespace ham

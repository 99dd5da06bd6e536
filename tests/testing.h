#pragma once
// Shared test helpers: f64 random inputs and a gradcheck assertion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "autograd/gradcheck.h"
#include "tests/error_testing.h"
#include "autograd/node.h"
#include "core/device.h"
#include "core/tensor.h"

namespace ham::testing {

// Normal(0, scale) values, f64, requiring grad unless told otherwise.
inline Tensor randn64(const Shape& shape, uint64_t seed, double scale = 1.0,
                      bool grad = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(size_t(shape_numel(shape)));
  for (double& x : v) x = normal(rng);
  Tensor t = Tensor::from_vector(v, shape);
  if (grad) set_requires_grad(t);
  return t;
}

// Uniform(lo, hi) values, f64.
inline Tensor uniform64(const Shape& shape, uint64_t seed, double lo, double hi,
                        bool grad = true) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(lo, hi);
  std::vector<double> v(size_t(shape_numel(shape)));
  for (double& x : v) x = uni(rng);
  Tensor t = Tensor::from_vector(v, shape);
  if (grad) set_requires_grad(t);
  return t;
}

// OpenMP's thread count for a scope, restored after it: results that depend on the
// threads (peak memory, the order of sums) are compared at a fixed count.
class ScopedThreadCount {
 public:
  explicit ScopedThreadCount(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedThreadCount() { omp_set_num_threads(saved_); }
  ScopedThreadCount(const ScopedThreadCount&) = delete;
  ScopedThreadCount& operator=(const ScopedThreadCount&) = delete;

 private:
  int saved_;
};

// An empty directory path under the system's temp folder, unique to this process and
// `name` (removed first if a previous run left it).
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("ham_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

// Asserts the f64 finite-difference check passes (relative error < 1e-6 by default).
inline void expect_gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                             GradcheckOptions options = {}) {
  GradcheckResult result = gradcheck(fn, inputs, options);
  EXPECT_TRUE(result.passed) << result.summary();
  EXPECT_LT(result.worst_relative_error, options.tolerance) << result.summary();
}

// Largest |a - b| over all elements (any dtype, read as f64).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// ---- GPU kernels against the CPU reference ----

// Why CUDA tensors cannot be made in this process ("" when they can): a build without the
// CUDA backend, or one with it on a machine without a usable GPU.
inline std::string cuda_unavailable_reason() {
  static const std::string reason = []() -> std::string {
    if (!has_device_backend(DeviceKind::CUDA)) {
      return "this build has no CUDA backend (configure with -DHAM_CUDA=ON)";
    }
    if (is_emulated_on_cpu(DeviceKind::CUDA)) return "CUDA is emulated on the CPU in this process";
    try {
      Tensor::zeros({1}, DType::F32, Device::cuda());
    } catch (const std::exception& e) {
      return std::string("CUDA backend present but no usable GPU: ") + e.what();
    }
    return "";
  }();
  return reason;
}

// First statement of a GPU test: skips it, saying why, when there is no GPU.
#define HAM_SKIP_UNLESS_CUDA()                                                    \
  do {                                                                            \
    const std::string ham_skip_reason_ = ::ham::testing::cuda_unavailable_reason(); \
    if (!ham_skip_reason_.empty()) GTEST_SKIP() << ham_skip_reason_;              \
  } while (0)

// Statement of a GPU test whose case may be too long for the SIMT emulator
// (test_emulated_gpu runs every GPU thread as a fiber on one CPU core: the paper's 4K-16K
// tokens take 18 s to 22 minutes a case there): past longest_emulated_sequence() tokens it
// skips, saying why, in that binary; on a GPU every length runs.
inline constexpr int64_t kLongestEmulatedSequence = 1024;
// kLongestEmulatedSequence, or HAM_EMULATOR_LONGEST_SEQUENCE where set (a positive
// integer), which runs the long cases on the emulator when there is time for them.
inline int64_t longest_emulated_sequence() {
  const char* text = std::getenv("HAM_EMULATOR_LONGEST_SEQUENCE");
  if (text == nullptr) return kLongestEmulatedSequence;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value <= 0) {
    throw std::invalid_argument(std::string("HAM_EMULATOR_LONGEST_SEQUENCE=") + text +
                                ": not a positive integer");
  }
  return value;
}
#ifdef HAM_TESTS_ON_SIMT_EMULATOR
#define HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(seq_len)                                      \
  do {                                                                                        \
    if ((seq_len) > ::ham::testing::longest_emulated_sequence()) {                            \
      GTEST_SKIP() << "T = " << (seq_len) << " is too long for the SIMT emulator: runs on a GPU" \
                   << " (scripts/gpu_check.sh), or here with HAM_EMULATOR_LONGEST_SEQUENCE";  \
    }                                                                                         \
  } while (0)
#else
#define HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(seq_len) \
  do {                                                   \
  } while (0)
#endif

// The dtypes every GPU kernel is checked in, and the relative RMS error allowed.
inline const std::vector<DType> kGpuDtypes = {DType::F32, DType::BF16};
// The same and f64, for the kernels that take f64 too (docs/ops.md's dtype column).
inline const std::vector<DType> kGpuDtypesAndF64 = {DType::F32, DType::BF16, DType::F64};
inline double gpu_tolerance(DType dtype) {
  return dtype == DType::BF16 ? 1e-2 : dtype == DType::F32 ? 1e-5 : 1e-12;
}

// sqrt(sum (actual - expected)^2 / sum expected^2), both read as f64 on the host. A
// non-finite actual value where the expected one is finite (an element the kernel never
// wrote over its NaN poison) makes it infinite; equal non-finite values count as equal.
inline double relative_rms_error(const Tensor& actual, const Tensor& expected) {
  EXPECT_EQ(actual.shape(), expected.shape());
  if (actual.shape() != expected.shape()) return std::numeric_limits<double>::infinity();
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(e[i])) {
      bool same = (std::isnan(e[i]) && std::isnan(a[i])) || a[i] == e[i];
      if (!same) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    diff += (a[i] - e[i]) * (a[i] - e[i]);
    norm += e[i] * e[i];
  }
  if (norm == 0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

// Expects a GPU result within gpu_tolerance(dtype) of the CPU reference.
inline void expect_matches_reference(const Tensor& gpu, const Tensor& cpu, DType dtype,
                                     const std::string& what) {
  EXPECT_LE(relative_rms_error(gpu, cpu), gpu_tolerance(dtype))
      << what << " (" << dtype_name(dtype) << ", " << gpu.str() << ")";
}

// Normal(mean, scale) values drawn in f64, rounded to `dtype`, placed on `device`.
inline Tensor random_tensor(const Shape& shape, DType dtype, Device device, uint64_t seed,
                            double scale = 1.0, double mean = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(mean, scale);
  std::vector<double> v(size_t(shape_numel(shape)));
  for (double& x : v) x = normal(rng);
  return Tensor::from_vector(v, shape).to(dtype).to(device);
}

// Uniform integers in [lo, hi) as an i32 or i64 tensor on `device`.
inline Tensor random_indices(const Shape& shape, DType dtype, Device device, uint64_t seed,
                             int64_t lo, int64_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> uni(lo, hi - 1);
  std::vector<int64_t> v(size_t(shape_numel(shape)));
  for (int64_t& x : v) x = uni(rng);
  return Tensor::from_vector(v, shape).to(dtype).to(device);
}

// The CPU reference's copy of a (GPU) tensor: on the host, bf16 widened exactly to f32.
inline Tensor cpu_reference(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor host = t.to(Device::cpu());
  return host.dtype() == DType::BF16 ? host.to(DType::F32) : host;
}

// Steps [begin, begin + count) of dim 1 of a [B, T, ...] tensor, as an f64 CPU tensor.
inline Tensor time_slice(const Tensor& x, int64_t begin, int64_t count) {
  const Shape& shape = x.shape();
  const int64_t T = shape[1], width = shape_numel(shape) / (shape[0] * T);
  std::vector<double> all = x.to_vector<double>(), part;
  for (int64_t b = 0; b < shape[0]; ++b) {
    for (int64_t t = begin; t < begin + count; ++t) {
      for (int64_t e = 0; e < width; ++e) part.push_back(all[size_t((b * T + t) * width + e)]);
    }
  }
  Shape sliced = shape;
  sliced[1] = count;
  return Tensor::from_vector(part, sliced);
}

// A NaN-filled tensor: outputs are poisoned so an element a kernel never writes fails.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  return Tensor::full(shape, std::numeric_limits<double>::quiet_NaN(), dtype, device);
}

// `t`'s values in a contiguous view one element into a buffer of its own: for bf16 and f32,
// off every 16-byte boundary, so kernels that read 16 bytes at a time where aligned take
// their element-by-element path.
inline Tensor one_element_in(const Tensor& t) {
  Tensor buffer = Tensor::empty({t.numel() + 1}, t.dtype(), t.device());
  Tensor view = buffer.slice(1, t.numel() + 1).reshape(t.shape());
  view.copy_(t);
  return view;
}

// A kernel tuning setting (a setter that returns the previous value, as the cuda/*.h
// ones do) set to `value` for a scope and restored at its end, failed test or not.
template <class Value>
class ScopedSetting {
 public:
  ScopedSetting(Value (*set)(Value), Value value) : set_(set), previous_(set(value)) {}
  ~ScopedSetting() { set_(previous_); }
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;

 private:
  Value (*set_)(Value);
  Value previous_;
};

}  // namespace ham::testing

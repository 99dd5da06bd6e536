#pragma once
// GPU tests skip, with the reason, where there is no CUDA backend or no usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ham::testing {

// Empty when a CUDA tensor can be made; else why not.
inline std::string cuda_unavailable_reason() {
  if (!has_device_backend(DeviceKind::CUDA)) return "this build has no CUDA backend";
  try {
    Tensor probe = Tensor::empty({1}, DType::F32, Device::cuda());
  } catch (const Error& e) {
    return std::string("no usable GPU: ") + e.what();
  }
  return "";
}

#define HAM_SKIP_WITHOUT_GPU()                                              \
  do {                                                                      \
    std::string ham_reason_ = ::ham::testing::cuda_unavailable_reason();    \
    if (!ham_reason_.empty()) GTEST_SKIP() << ham_reason_;                  \
  } while (0)

// Normal(0, 1) values of `dtype` on the CPU from a fresh seed.
inline Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(size_t(shape_numel(shape)));
  for (float& v : values) v = normal(rng);
  return Tensor::from_vector(values, shape).to(dtype);
}

// ||out - ref|| / ||ref|| over all elements, both read as f64.
inline double relative_rms_error(const Tensor& out, const Tensor& ref) {
  EXPECT_EQ(out.shape(), ref.shape());
  std::vector<double> o = out.to_vector<double>(), r = ref.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    if (std::isnan(o[i])) return INFINITY;
    diff += (o[i] - r[i]) * (o[i] - r[i]);
    norm += r[i] * r[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

}  // namespace ham::testing

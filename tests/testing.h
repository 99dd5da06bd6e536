#pragma once
// Shared test helpers: f64 random inputs and a gradcheck assertion.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "tests/error_testing.h"
#include "autograd/node.h"
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

}  // namespace ham::testing

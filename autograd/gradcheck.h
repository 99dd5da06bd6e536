#pragma once
// Finite-difference gradient check in f64. The function's outputs are contracted with
// fixed random weights w, L = sum_k <w_k, out_k>; autograd's dL/dx is compared with the
// central difference (L(x + eps e_j) - L(x - eps e_j)) / (2 eps) for every element j.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ham {

struct GradcheckOptions {
  double eps = 1e-6;
  double tolerance = 1e-6;     // on the relative error below
  double norm_floor = 1e-3;    // denominator floor, so zero gradients are checked absolutely
  uint64_t seed = 1234;
  int64_t max_elements_per_input = -1;  // check a deterministic sample when positive
};

struct GradcheckInputReport {
  std::string name;
  double relative_error = 0;  // ||analytic - numeric|| / max(||numeric||, norm_floor)
  double max_abs_error = 0;
  int64_t checked_elements = 0;
};

struct GradcheckResult {
  bool passed = true;
  double worst_relative_error = 0;
  std::vector<GradcheckInputReport> inputs;
  std::string summary() const;  // one line per input
};

using GradcheckFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Checks the gradient of every input that requires grad. Inputs must be f64 on CPU.
// `names` (optional) labels inputs in the report.
GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {},
                          const std::vector<std::string>& names = {});

// Same check for tensors a function reads but does not take as arguments (a model's
// parameters): `loss_fn` returns a scalar; gradients come from backward() into grad().
GradcheckResult gradcheck_parameters(const std::function<Tensor()>& loss_fn,
                                     const std::vector<Tensor>& parameters,
                                     const std::vector<std::string>& names,
                                     const GradcheckOptions& options = {});

}  // namespace ham

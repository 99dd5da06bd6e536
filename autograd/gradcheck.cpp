#include "autograd/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace ham {

namespace {

Tensor random_weights(const Tensor& like, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> w(size_t(like.numel()));
  for (double& v : w) v = normal(rng);
  return Tensor::from_vector(w, like.shape());
}

double contract(const std::vector<Tensor>& outputs, const std::vector<Tensor>& weights) {
  double total = 0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!weights[k].defined()) continue;
    const double* o = outputs[k].data<double>();
    const double* w = weights[k].data<double>();
    for (int64_t i = 0; i < outputs[k].numel(); ++i) total += o[i] * w[i];
  }
  return total;
}

std::vector<int64_t> elements_to_check(int64_t n, int64_t limit, std::mt19937_64& rng) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (limit <= 0 || limit >= n) return all;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(size_t(limit));
  std::sort(all.begin(), all.end());
  return all;
}

// Central differences of `loss` w.r.t. the chosen elements of x (perturbed in place),
// compared with `analytic`.
GradcheckInputReport compare(const std::string& name, Tensor& x, const Tensor& analytic,
                             const std::function<double()>& loss, const GradcheckOptions& opt,
                             std::mt19937_64& rng) {
  GradcheckInputReport report;
  report.name = name;
  double* px = x.data<double>();
  std::vector<double> a = analytic.to_vector<double>();
  double diff2 = 0, num2 = 0;
  for (int64_t j : elements_to_check(x.numel(), opt.max_elements_per_input, rng)) {
    double saved = px[j];
    px[j] = saved + opt.eps;
    double plus = loss();
    px[j] = saved - opt.eps;
    double minus = loss();
    px[j] = saved;
    double numeric = (plus - minus) / (2 * opt.eps);
    double d = a[size_t(j)] - numeric;
    diff2 += d * d;
    num2 += numeric * numeric;
    report.max_abs_error = std::max(report.max_abs_error, std::abs(d));
    ++report.checked_elements;
  }
  report.relative_error = std::sqrt(diff2) / std::max(std::sqrt(num2), opt.norm_floor);
  if (!std::isfinite(report.relative_error)) report.relative_error = INFINITY;
  return report;
}

void finish(GradcheckResult& result, const GradcheckOptions& opt) {
  for (const auto& r : result.inputs) {
    result.worst_relative_error = std::max(result.worst_relative_error, r.relative_error);
    if (!(r.relative_error < opt.tolerance)) result.passed = false;
  }
}

void check_f64_cpu(const Tensor& t, const std::string& name) {
  HAM_CHECK(t.dtype() == DType::F64 && t.device().is_cpu(), "gradcheck: ", name, " is ",
            t.str(), "; gradcheck runs in f64 on cpu");
}

}  // namespace

std::string GradcheckResult::summary() const {
  std::ostringstream out;
  out.precision(3);
  for (const auto& r : inputs) {
    out << r.name << ": relative error " << std::scientific << r.relative_error
        << ", max abs error " << r.max_abs_error << " over " << r.checked_elements
        << " elements\n";
  }
  return out.str();
}

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt, const std::vector<std::string>& names) {
  std::mt19937_64 rng(opt.seed);
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !requires_grad(inputs[i])) continue;
    check_f64_cpu(inputs[i], names.size() > i ? names[i] : "input " + std::to_string(i));
    checked.push_back(i);
  }
  HAM_CHECK(!checked.empty(), "gradcheck: no input requires grad");

  std::vector<Tensor> outputs = fn(inputs);
  std::vector<Tensor> weights, roots;
  for (const Tensor& out : outputs) {
    if (out.defined() && requires_grad(out) && out.dtype() == DType::F64) {
      weights.push_back(random_weights(out, rng));
      roots.push_back(out);
    } else {
      weights.push_back(Tensor());
    }
  }
  HAM_CHECK(!roots.empty(), "gradcheck: no f64 output depends on the inputs");
  std::vector<Tensor> root_weights;
  for (const Tensor& w : weights) {
    if (w.defined()) root_weights.push_back(w);
  }
  std::vector<Tensor> wanted;
  for (size_t i : checked) wanted.push_back(inputs[i]);
  std::vector<Tensor> analytic = gradients(roots, wanted, root_weights);

  GradcheckResult result;
  NoGradGuard no_grad;
  for (size_t c = 0; c < checked.size(); ++c) {
    size_t i = checked[c];
    Tensor x = inputs[i];
    auto loss = [&] { return contract(fn(inputs), weights); };
    std::string name = names.size() > i ? names[i] : "input " + std::to_string(i);
    result.inputs.push_back(compare(name, x, analytic[c], loss, opt, rng));
  }
  finish(result, opt);
  return result;
}

GradcheckResult gradcheck_parameters(const std::function<Tensor()>& loss_fn,
                                     const std::vector<Tensor>& parameters,
                                     const std::vector<std::string>& names,
                                     const GradcheckOptions& opt) {
  HAM_CHECK(names.size() == parameters.size(), "gradcheck_parameters: ", parameters.size(),
            " parameters but ", names.size(), " names");
  for (size_t i = 0; i < parameters.size(); ++i) {
    check_f64_cpu(parameters[i], names[i]);
    clear_grad(parameters[i]);
  }
  Tensor loss = loss_fn();
  HAM_CHECK(loss.numel() == 1, "gradcheck_parameters: loss must be a scalar, got ", loss.str());
  backward(loss);
  std::mt19937_64 rng(opt.seed);
  GradcheckResult result;
  NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    Tensor analytic = grad(parameters[i]);
    if (!analytic.defined()) analytic = Tensor::zeros(parameters[i].shape(), DType::F64);
    Tensor x = parameters[i];
    result.inputs.push_back(
        compare(names[i], x, analytic, [&] { return loss_fn().item(); }, opt, rng));
  }
  finish(result, opt);
  return result;
}

}  // namespace ham

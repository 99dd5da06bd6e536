#include "models/threshold.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/node.h"

namespace ham {

Threshold::Threshold(double tau, double scale) : scale_(scale), p_tau_(Tensor::zeros({1})) {
  HAM_CHECK(scale > 0, "Threshold: scale must be positive, got ", scale);
  set_tau(tau);
}

double Threshold::tau() const {
  double p = p_tau_.to_vector<double>()[0];
  return scale_ / (1.0 + std::exp(-p));
}

void Threshold::set_tau(double tau) {
  HAM_CHECK(tau > 0 && tau < scale_, "Threshold: tau must lie in (0, ", scale_, "), got ", tau);
  double ratio = tau / scale_;
  p_tau_.fill_(std::log(ratio / (1.0 - ratio)));
}

ThresholdController::ThresholdController(std::vector<std::pair<std::string, Tensor>> p_taus,
                                         ThresholdLearningOptions options)
    : p_taus_(std::move(p_taus)),
      options_(std::move(options)),
      optimizer_({ParamGroup{"thresholds", p_taus_, /*weight_decay=*/0.0, /*lr_scale=*/1.0}},
                 AdamW::Options{options_.lr, 0.9, 0.999, 1e-8}) {
  HAM_CHECK(options_.targets.size() == p_taus_.size(), "ThresholdController: ",
            options_.targets.size(), " kv targets for ", p_taus_.size(), " thresholds");
}

void ThresholdController::record_forward(
    const std::vector<std::vector<double>>& fractions_per_layer) {
  HAM_CHECK(fractions_per_layer.size() == p_taus_.size(), "ThresholdController: fractions for ",
            fractions_per_layer.size(), " layers, expected ", p_taus_.size());
  std::vector<double> gaps;
  for (size_t layer = 0; layer < p_taus_.size(); ++layer) {
    const std::vector<double>& fractions = fractions_per_layer[layer];
    HAM_CHECK(!fractions.empty(), "ThresholdController: layer ", layer, " saw no sequences");
    double gap = 0;
    for (double f : fractions) gap += f - options_.targets[layer];
    gaps.push_back(gap / double(fractions.size()));
  }
  pending_gaps_.push_back(std::move(gaps));
}

double ThresholdController::synthetic_gradient(double gap, double gain, double clip) {
  return std::clamp(-gain * gap, -clip, clip);
}

bool ThresholdController::after_optimizer_step(int64_t step) {
  std::vector<std::vector<double>> gaps = std::move(pending_gaps_);
  pending_gaps_.clear();
  if (step <= options_.freeze_steps || gaps.empty()) return false;
  for (size_t layer = 0; layer < p_taus_.size(); ++layer) {
    // p_tau.grad += g_synth, once per forward since the last step (gradient accumulation).
    double g = 0;
    for (const std::vector<double>& forward_gaps : gaps) {
      g += synthetic_gradient(all_reduce_mean(forward_gaps[layer]), options_.gain, options_.clip);
    }
    const Tensor& p = p_taus_[layer].second;
    set_grad(p, Tensor::full(p.shape(), g, p.dtype(), p.device()));
  }
  optimizer_.step(options_.lr);
  optimizer_.zero_grad();
  return true;
}

}  // namespace ham

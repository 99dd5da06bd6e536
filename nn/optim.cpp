#include "nn/optim.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <string>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/ops/cast.h"
#include "core/ops/elementwise.h"

namespace ham {

std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& params,
                                     double weight_decay) {
  ParamGroup decay{"decay", {}, weight_decay, 1.0};
  ParamGroup no_decay{"no_decay", {}, 0.0, 1.0};
  for (const auto& p : params) (p.second.dim() >= 2 ? decay : no_decay).params.push_back(p);
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

AdamW::AdamW(std::vector<ParamGroup> groups, Options options)
    : groups_(std::move(groups)), options_(options) {
  for (const ParamGroup& g : groups_) {
    exp_avg_.emplace_back();
    exp_avg_sq_.emplace_back();
    master_.emplace_back();
    for (const auto& [name, p] : g.params) {
      const bool with_master = p.dtype() == DType::BF16;
      const DType moments = with_master ? DType::F32 : p.dtype();
      exp_avg_.back().push_back(Tensor::zeros(p.shape(), moments, p.device()));
      exp_avg_sq_.back().push_back(Tensor::zeros(p.shape(), moments, p.device()));
      master_.back().push_back(with_master ? ops::cast(p, DType::F32) : Tensor());
    }
  }
}

void AdamW::step(double lr, double grad_scale) {
  NoGradGuard no_grad;
  ++step_;
  // Parameters with a gradient, bucketed by what one multi-tensor call must share: the
  // group's lr and weight decay, the dtypes of param, grad and moments, the device, and
  // whether the params are masters whose bf16 parameters the call also writes (`rounded`).
  // Buckets keep the order in which they first appear, parameters their order within.
  struct Bucket {
    double lr, weight_decay;
    DType param_dtype, grad_dtype, moment_dtype;
    Device device;
    bool masters;
    std::vector<Tensor> params, grads, exp_avg, exp_avg_sq, rounded;
  };
  std::vector<Bucket> buckets;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    const double group_lr = lr * g.lr_scale;
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      const Tensor& master = master_[gi][pi];
      const Tensor& param = master.defined() ? master : g.params[pi].second;
      Tensor gr = grad(g.params[pi].second);
      if (!gr.defined()) continue;
      const Tensor& m = exp_avg_[gi][pi];
      const bool has_master = master.defined();
      auto same = [&](const Bucket& b) {
        return b.lr == group_lr && b.weight_decay == g.weight_decay &&
               b.param_dtype == param.dtype() && b.grad_dtype == gr.dtype() &&
               b.moment_dtype == m.dtype() && b.device == param.device() &&
               b.masters == has_master;
      };
      auto it = std::find_if(buckets.begin(), buckets.end(), same);
      if (it == buckets.end()) {
        buckets.push_back({group_lr, g.weight_decay, param.dtype(), gr.dtype(), m.dtype(),
                           param.device(), has_master, {}, {}, {}, {}, {}});
        it = buckets.end() - 1;
      }
      it->params.push_back(param);
      it->grads.push_back(std::move(gr));
      it->exp_avg.push_back(m);
      it->exp_avg_sq.push_back(exp_avg_sq_[gi][pi]);
      if (has_master) it->rounded.push_back(g.params[pi].second);
    }
  }
  // bf16 parameters take their updated masters, rounded, in the same call.
  for (Bucket& b : buckets) {
    const AdamWHyper hyper{b.lr,           options_.beta1, options_.beta2, options_.eps,
                           b.weight_decay, step_,          grad_scale};
    ops::adamw_step_multi(b.params, b.grads, b.exp_avg, b.exp_avg_sq, hyper, b.rounded);
  }
}

void AdamW::zero_grad() {
  for (const ParamGroup& g : groups_) {
    for (const auto& [name, p] : g.params) clear_grad(p);
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const std::string& name = groups_[gi].params[pi].first;
      out.emplace_back("exp_avg." + name, exp_avg_[gi][pi]);
      out.emplace_back("exp_avg_sq." + name, exp_avg_sq_[gi][pi]);
    }
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                       int64_t steps_taken) {
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const std::string& name = groups_[gi].params[pi].first;
      for (auto [prefix, slot] : {std::pair{"exp_avg.", &exp_avg_[gi][pi]},
                                  std::pair{"exp_avg_sq.", &exp_avg_sq_[gi][pi]}}) {
        auto it = by_name.find(prefix + name);
        HAM_CHECK(it != by_name.end(), "AdamW::load_state: missing '", prefix, name, "'");
        HAM_CHECK(it->second.shape() == slot->shape(), "AdamW::load_state: '", prefix, name,
                  "' has shape ", shape_str(it->second.shape()), ", expected ",
                  shape_str(slot->shape()));
        slot->copy_(it->second.to(slot->dtype()).to(slot->device()));
      }
    }
  }
  step_ = steps_taken;
}

std::vector<std::pair<std::string, Tensor>> AdamW::full_precision_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const auto& [name, p] = groups_[gi].params[pi];
      out.emplace_back(name, master_[gi][pi].defined() ? master_[gi][pi] : p);
    }
  }
  return out;
}

void AdamW::load_master_weights(const std::vector<std::pair<std::string, Tensor>>& weights) {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> by_name(weights.begin(), weights.end());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      Tensor& master = master_[gi][pi];
      auto it = by_name.find(groups_[gi].params[pi].first);
      if (!master.defined() || it == by_name.end()) continue;
      HAM_CHECK(it->second.shape() == master.shape(), "AdamW::load_master_weights: '",
                it->first, "' has shape ", shape_str(it->second.shape()), ", expected ",
                shape_str(master.shape()));
      master.copy_(it->second.to(master.device()).to(master.dtype()));
      Tensor param = groups_[gi].params[pi].second;
      ops::cast_into(master, param);
    }
  }
}

double CosineSchedule::lr(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak_lr * double(step + 1) / double(warmup_steps);
  }
  if (step >= total_steps || total_steps <= warmup_steps) return min_lr;
  double progress = double(step - warmup_steps) / double(total_steps - warmup_steps);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

double gradient_norm(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    Tensor g = grad(p);
    if (g.defined()) grads.push_back(g);
  }
  double total = 0;  // summed in the parameters' order (on the CPU, as squared_norm's were)
  for (double squares : ops::squared_norms(grads)) total += squares;
  return std::sqrt(total);
}

double clip_factor(double norm, double max_norm) {
  return std::isfinite(norm) && norm > max_norm && norm > 0 ? max_norm / norm : 1.0;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard no_grad;
  const double norm = gradient_norm(params);
  const double factor = clip_factor(norm, max_norm);
  if (factor != 1.0) {
    for (const Tensor& p : params) {
      Tensor g = grad(p);
      if (g.defined()) ops::scale_(g, factor);
    }
  }
  return norm;
}

}  // namespace ham

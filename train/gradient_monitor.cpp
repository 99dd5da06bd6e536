#include "train/gradient_monitor.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/ops/optim.h"
#include "core/safetensors.h"
#include "models/ham.h"
#include "train/metrics_log.h"

namespace ham {

namespace {

// The layer index of a parameter named "layers.<i>....", or -1.
int64_t layer_of(const std::string& name) {
  constexpr std::string_view prefix = "layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t end = name.find('.', prefix.size());
  try {
    return std::stoll(name.substr(prefix.size(), end - prefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

// A parameter name for error messages: the first inside a layer, else the first.
std::string example_name(const std::vector<std::pair<std::string, Tensor>>& params) {
  for (const auto& [name, p] : params) {
    if (layer_of(name) >= 0) return name;
  }
  return params.empty() ? std::string() : params[0].first;
}

double grad_norm(const Tensor& param) {
  Tensor g = grad(param);
  return g.defined() ? std::sqrt(ops::squared_norm(g)) : 0.0;  // no gradient reached it: 0
}

// Stacks [B, T] tensors of one dtype along the rows.
Tensor stack_rows(const std::vector<Tensor>& parts) {
  if (parts.size() == 1) return parts[0];
  std::vector<double> values;
  int64_t rows = 0;
  for (const Tensor& part : parts) {
    std::vector<double> v = part.to_vector<double>();
    values.insert(values.end(), v.begin(), v.end());
    rows += part.size(0);
  }
  return Tensor::from_vector(values, {rows, parts[0].size(1)}).to(parts[0].dtype());
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view name) {
  // Greedy matching with one backtrack point: the last '*' seen and where it resumed.
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

GradientMonitor::GradientMonitor(LanguageModel& model, GradientMonitorOptions options)
    : model_(model), options_(std::move(options)) {
  const GradientMonitorOptions& o = options_;
  HAM_CHECK(o.norms_every >= 0, "train option 'grad_norms_every' (--grad-norms-every) must be >= 0, got ",
            o.norms_every);
  if (auto* ham_model = dynamic_cast<HAMModel*>(&model)) {
    for (size_t i = 0; i < ham_model->layers.size(); ++i) {
      HAMLayer* mixer = ham_model->layers[i]->mixer.get();
      if (mixer->router) routers_.push_back({int64_t(i), mixer, {}, {}});
    }
  }

  HAM_CHECK(o.dump_patterns.empty() == o.dump_steps.empty(), "train options 'dump_grads' (--dump-grads) "
            "and 'dump_grads_at' (--dump-grads-at) go together: ", o.dump_patterns.size(),
            " patterns but ", o.dump_steps.size(), " steps given");
  if (o.dump_patterns.empty()) return;
  HAM_CHECK(!o.dump_dir.empty(), "train option 'dump_grads' (--dump-grads) needs --out or --log-dir: "
            "gradients are written to <dir>/grads/");
  for (int64_t step : o.dump_steps) {
    HAM_CHECK(step >= 1 && step <= o.total_steps, "train option 'dump_grads_at' (--dump-grads-at): step ",
              step, " is outside the run's steps 1..", o.total_steps);
  }
  std::vector<std::pair<std::string, Tensor>> params = model.named_parameters();
  std::vector<bool> chosen(params.size(), false);
  for (const std::string& pattern : o.dump_patterns) {
    if (pattern == kScoreGradDumpName) {
      HAM_CHECK(!routers_.empty(), "train option 'dump_grads' (--dump-grads): '", pattern,
                "' needs a HAM model with a learned router (router input_shallow or input_deep)");
      dump_score_grads_ = true;
      continue;
    }
    bool matched = false;
    for (size_t i = 0; i < params.size(); ++i) {
      if (glob_match(pattern, params[i].first)) chosen[i] = matched = true;
    }
    HAM_CHECK(matched, "train option 'dump_grads' (--dump-grads): pattern '", pattern,
              "' matches no parameter (names look like '", example_name(params),
              "'; '*' matches any run of characters, '?' one)");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (chosen[i]) dumped_parameters_.push_back(params[i].first);
  }
}

bool GradientMonitor::logs_norms(int64_t step) const {
  return options_.norms_every > 0 && step % options_.norms_every == 0;
}

bool GradientMonitor::dumps(int64_t step) const {
  return std::find(options_.dump_steps.begin(), options_.dump_steps.end(), step) !=
         options_.dump_steps.end();
}

std::string GradientMonitor::dump_path(int64_t step) const {
  return fmt::format("{}/grads/step-{:08d}.safetensors", options_.dump_dir, step);
}

void GradientMonitor::begin_step(int64_t step) {
  collecting_ = !routers_.empty() && (logs_norms(step) || (dump_score_grads_ && dumps(step)));
  for (ScoreGradients& r : routers_) {
    r.mixer->retain_score_grad = collecting_;
    r.grads.clear();
    r.selects.clear();
  }
}

void GradientMonitor::after_micro_batch() {
  if (!collecting_) return;
  for (ScoreGradients& r : routers_) {
    const HAMLayerTrace& trace = r.mixer->last_trace();
    HAM_CHECK(trace.score_in_graph.defined(), "gradient monitor: HAM layer ", r.layer,
              " kept no routing score in the graph (was the forward run without grad mode?)");
    Tensor g = grad(trace.score_in_graph);
    // No gradient reached the score (e.g. no token was selected): dL/de_t = 0.
    if (!g.defined()) g = Tensor::zeros(trace.score_in_graph.shape(), trace.score_in_graph.dtype());
    r.grads.push_back(g.to(Device::cpu()).clone());
    r.selects.push_back(trace.select.to(Device::cpu()));
  }
}

void GradientMonitor::stop_collecting() {
  for (ScoreGradients& r : routers_) {
    r.mixer->retain_score_grad = false;
    r.grads.clear();
    r.selects.clear();
  }
  collecting_ = false;
}

void GradientMonitor::abandon_step() { stop_collecting(); }

void GradientMonitor::end_step(int64_t step, std::ostream& log, MetricsLogger* metrics) {
  NoGradGuard no_grad;
  if (logs_norms(step)) log_norms(step, log, metrics);
  if (dumps(step)) write_dump(step);
  stop_collecting();
}

void GradientMonitor::log_norms(int64_t step, std::ostream& log, MetricsLogger* metrics) const {
  NamedScalars scalars;
  std::map<int64_t, double> layer_sq;  // layer -> sum of squared gradient norms
  std::string others;
  for (const auto& [name, p] : model_.named_parameters()) {
    double norm = grad_norm(p);
    scalars.push_back({"grad_norm/" + name, norm});
    int64_t layer = layer_of(name);
    if (layer >= 0) {
      layer_sq[layer] += norm * norm;
    } else {
      others += fmt::format(" {}:{:.2e}", name, norm);
    }
  }
  std::string line = fmt::format("step {:>5}/{} | grad norm by layer:", step, options_.total_steps);
  for (const auto& [layer, sq] : layer_sq) {
    scalars.push_back({fmt::format("grad_norm/layer_{}", layer), std::sqrt(sq)});
    line += fmt::format(" {}:{:.2e}", layer, std::sqrt(sq));
  }
  log << line << " |" << others << "\n";

  if (!routers_.empty()) {
    std::string router_line = fmt::format("step {:>5}/{} | router by layer:", step, options_.total_steps);
    for (const ScoreGradients& r : routers_) {
      double sq = 0;
      for (const auto& [name, p] : r.mixer->named_parameters()) {
        if (name.rfind("router.", 0) == 0 || name.rfind("eda.", 0) == 0) sq += std::pow(grad_norm(p), 2);
      }
      double sum = 0, sum_abs = 0, max_abs = 0;
      int64_t nonzero = 0, count = 0;
      for (const Tensor& g : r.grads) {
        for (double v : g.to_vector<double>()) {
          sum += v;
          sum_abs += std::abs(v);
          max_abs = std::max(max_abs, std::abs(v));
          nonzero += v != 0;
          ++count;
        }
      }
      double n = double(std::max<int64_t>(count, 1));
      std::string suffix = fmt::format("/layer_{}", r.layer);
      scalars.push_back({"router/grad_norm" + suffix, std::sqrt(sq)});
      scalars.push_back({"router/score_grad/mean" + suffix, sum / n});
      scalars.push_back({"router/score_grad/abs_mean" + suffix, sum_abs / n});
      scalars.push_back({"router/score_grad/abs_max" + suffix, max_abs});
      scalars.push_back({"router/score_grad/nonzero_fraction" + suffix, double(nonzero) / n});
      router_line += fmt::format(" {}: grad norm {:.2e}, dL/de mean {:.2e} |.| {:.2e} max {:.2e} "
                                 "nonzero {:.3f};",
                                 r.layer, std::sqrt(sq), sum / n, sum_abs / n, max_abs,
                                 double(nonzero) / n);
    }
    router_line.pop_back();
    log << router_line << "\n";
  }
  if (metrics) metrics->log(step, scalars);
}

void GradientMonitor::write_dump(int64_t step) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : dumped_parameters_) {
    Tensor p = model_.parameter(name);
    Tensor g = grad(p);
    // A parameter no gradient reached (unused this step) has gradient 0.
    tensors.emplace_back(name, g.defined() ? g.to(Device::cpu()) : Tensor::zeros(p.shape(), p.dtype()));
  }
  if (dump_score_grads_) {
    for (const ScoreGradients& r : routers_) {
      HAM_CHECK(!r.grads.empty(), "gradient monitor: step ", step, " collected no dL/de_t of layer ",
                r.layer);
      std::string prefix = fmt::format("layers.{}.mixer.", r.layer);
      tensors.emplace_back(prefix + "score_grad", stack_rows(r.grads));
      tensors.emplace_back(prefix + "select", stack_rows(r.selects));
    }
  }
  std::string path = dump_path(step);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  HAM_CHECK(!ec, std::filesystem::path(path).parent_path().string(), ": cannot create directory: ",
            ec.message());
  save_safetensors(path, tensors,
                   {{"step", std::to_string(step)},
                    {"content", "gradients of the step's loss (mean over micro-batches), before "
                                "clipping"}});
}

}  // namespace ham

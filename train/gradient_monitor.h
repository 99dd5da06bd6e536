#pragma once
// What the trainer records about gradients beyond the global norm it clips (the train
// options grad_norms_every, dump_grads and dump_grads_at; docs/gradients.md):
//
//   every `norms_every` steps, before clipping:
//     grad_norm/<parameter>     L2 norm of each parameter's gradient
//     grad_norm/layer_<i>       L2 norm over every parameter under layers.<i>.
//     and for HAM layers with a learned router (router != fit_error):
//     router/grad_norm/layer_<i>                  over layers.<i>.mixer.router.* and .eda.*
//     router/score_grad/{mean, abs_mean, abs_max, nonzero_fraction}/layer_<i>
//                                                 of dL/de_t over the step's tokens
//   at the steps in `dump_steps`: the gradients of the parameters `dump_patterns` name to
//     <dump_dir>/grads/step-NNNNNNNN.safetensors (tensors named like the parameters).
//
// dL/de_t is the gradient of the step's loss (mean over micro-batches) w.r.t. the score as
// routed_attention uses it (after EDA). Scores reach the loss only by scaling the values
// of selected tokens, so without EDA it is zero on every unselected token; with EDA a
// layer's score also feeds the next layer's, whose selected tokens then contribute too.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "models/language_model.h"

namespace ham {

class HAMLayer;
class MetricsLogger;

// '*' matches any run of characters (dots included), '?' any one character; anything else
// matches itself, so an exact parameter name is a pattern too.
bool glob_match(std::string_view pattern, std::string_view name);

// The dump_grads name for HAM's routing-score gradients: it writes
// layers.<i>.mixer.score_grad (dL/de_t, [micro-batches x B, T]) and layers.<i>.mixer.select
// (m_t, u8, same shape) for every layer with a learned router.
inline constexpr std::string_view kScoreGradDumpName = "score_grad";

struct GradientMonitorOptions {
  int64_t norms_every = 0;                 // 0: never
  std::vector<std::string> dump_patterns;  // globs over parameter names, or "score_grad"
  std::vector<int64_t> dump_steps;         // 1-based steps (as in checkpoints)
  std::string dump_dir;                    // grads/ is created here
  int64_t total_steps = 0;                 // dump steps must lie in [1, total_steps]
};

class GradientMonitor {
 public:
  // Checks the options against the model, each error one line naming the option: every
  // pattern matches some parameter (or is "score_grad" on a HAM model with a learned
  // router), dump steps lie in [1, total_steps], and a dump directory is given.
  GradientMonitor(LanguageModel& model, GradientMonitorOptions options);

  // Before step `step`'s (1-based) forward passes: keeps dL/de_t when the step needs it.
  void begin_step(int64_t step);
  // After each micro-batch's backward: collects that micro-batch's dL/de_t.
  void after_micro_batch();
  // Once the step's gradients are final, before clipping: logs the norms and router
  // statistics (to `log` and, when given, `metrics`) and writes the dump.
  void end_step(int64_t step, std::ostream& log, MetricsLogger* metrics);
  // For a skipped step (NaN/Inf): drops what was collected.
  void abandon_step();

  // The parameters the dump patterns select, in model order.
  const std::vector<std::string>& dumped_parameters() const { return dumped_parameters_; }
  std::string dump_path(int64_t step) const;

 private:
  struct ScoreGradients {  // one learned-router layer's dL/de_t over the step's micro-batches
    int64_t layer = 0;
    HAMLayer* mixer = nullptr;
    std::vector<Tensor> grads, selects;  // per micro-batch, [B, T] on the CPU
  };
  bool logs_norms(int64_t step) const;
  bool dumps(int64_t step) const;
  void log_norms(int64_t step, std::ostream& log, MetricsLogger* metrics) const;
  void write_dump(int64_t step) const;
  void stop_collecting();

  LanguageModel& model_;
  GradientMonitorOptions options_;
  std::vector<std::string> dumped_parameters_;
  bool dump_score_grads_ = false;
  std::vector<ScoreGradients> routers_;  // HAM layers with a learned router
  bool collecting_ = false;
};

}  // namespace ham

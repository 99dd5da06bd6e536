#pragma once
// Whole-model gradient check (`ham gradcheck`): autograd's gradient of the mean
// next-token loss against central finite differences, per parameter tensor, in f64.
//
//   numeric_j = (L(theta + eps e_j) - L(theta - eps e_j)) / (2 eps)
//   relative error of a tensor = ||analytic - numeric|| / max(||numeric||, norm_floor),
//   norms over the entries checked.
//
// HAM's selection m_t = [e_t >= tau] is a step function: where a probe at +eps or -eps
// selects a different set of tokens than the unperturbed forward, the loss jumps and the
// difference quotient is meaningless. Such entries are skipped and counted, not compared.
// Learned thresholds are not parameters and are not checked.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/language_model.h"

namespace ham {

struct ModelGradcheckOptions {
  int64_t batch_size = 2;
  int64_t seq_len = 16;
  // Entries checked per tensor (0: all). Half are drawn where autograd's gradient is
  // non-zero (so sparse gradients, e.g. embedding rows the batch uses, are exercised),
  // the rest uniformly; the draw is seeded.
  int64_t entries_per_tensor = 4;
  double eps = 1e-5;
  // On the relative error above. The tiny configs' worst is below 1e-6 at eps 1e-5
  // (truncation, O(eps^2), dominates for the embedding; round-off, O(1/eps), below it).
  double tolerance = 1e-5;
  double norm_floor = 1e-3;  // keeps tensors with (near) zero gradient from dividing by ~0
  uint64_t seed = 0;         // the batch's tokens and the entries drawn
};

struct TensorGradcheck {
  std::string name;
  Shape shape;
  double grad_norm = 0;       // ||analytic|| over the whole tensor
  int64_t checked = 0;        // entries compared
  int64_t skipped = 0;        // entries whose probe flipped a HAM selection
  double relative_error = 0;  // NaN when nothing was compared
  double max_abs_error = 0;
  bool passed = true;
};

struct ModelGradcheckReport {
  double loss = 0;  // the unperturbed loss
  double tolerance = 0;
  std::vector<TensorGradcheck> tensors;
  bool passed = true;
  double worst_relative_error = 0;
  std::string worst_tensor;
  int64_t checked = 0, skipped = 0;
  // One row per tensor, then the worst error, the entry counts and "gradcheck: PASS" or
  // "gradcheck: FAIL ..." naming the tensors over the tolerance.
  std::string table() const;
};

// B rows of T uniformly random tokens and targets (seeded); each row holds two documents
// split at T / 2 (doc ids and restarting positions), so document resets are checked too.
TokenBatch gradcheck_batch(const ModelConfig& config, int64_t batch_size, int64_t seq_len,
                           uint64_t seed);

// Checks every parameter of `model`, which must be f64 on the CPU (Module::to). The
// analytic gradient comes from backward() into grad(), so gradient hooks on parameters
// take part (a corrupting hook is caught); the model's grads are cleared afterwards.
ModelGradcheckReport check_model_gradients(const LanguageModel& model, const TokenBatch& batch,
                                           const ModelGradcheckOptions& options);

}  // namespace ham

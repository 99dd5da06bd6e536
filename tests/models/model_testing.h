#pragma once
// Helpers shared by the model-family tests: a deterministic packed batch, the whole-model
// f64 gradcheck, and a gradient comparison.
#include <string>

#include "autograd/engine.h"
#include "models/language_model.h"
#include "tests/testing.h"

namespace ham::testing {

// B rows of T tokens (ids follow a fixed pattern; `curve` adds t^2 so that neighbouring
// tokens differ more); with `packed`, each row holds two documents split at T / 2, with
// restarting positions.
inline TokenBatch packed_batch(int64_t B, int64_t T, int64_t vocab, bool packed,
                               int64_t curve = 0) {
  std::vector<int64_t> ids, targets, docs, pos;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back((3 * b + 5 * t + 1 + curve * t * t) % vocab);
      targets.push_back((7 * b + 2 * t + 3) % vocab);
      int64_t doc = packed && t >= T / 2 ? 1 : 0;
      docs.push_back(doc);
      pos.push_back(doc ? t - T / 2 : t);
    }
  }
  TokenBatch batch{Tensor::from_vector(ids, {B, T}), Tensor::from_vector(targets, {B, T}), {}, {}};
  if (packed) {
    batch.doc_ids = Tensor::from_vector(docs, {B, T});
    batch.positions = Tensor::from_vector(pos, {B, T});
  }
  return batch;
}

// Finite differences against autograd for every parameter of an f64 model.
inline GradcheckResult model_gradcheck(const LanguageModel& model, const TokenBatch& batch,
                                       const GradcheckOptions& options = {}) {
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) {
    params.push_back(p);
    names.push_back(name);
  }
  return gradcheck_parameters([&] { return model.loss(batch); }, params, names, options);
}

// Backpropagates each model's loss on `batch` and expects identical gradients (used to
// check that activation recompute changes nothing).
inline void expect_same_gradients(const LanguageModel& a, const LanguageModel& b,
                                  const TokenBatch& batch, double tolerance = 1e-12) {
  backward(a.loss(batch));
  backward(b.loss(batch));
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(grad(pb[i].second).defined()) << pb[i].first;
    EXPECT_LT(max_abs_diff(grad(pa[i].second), grad(pb[i].second)), tolerance) << pa[i].first;
  }
}

}  // namespace ham::testing

#pragma once
// The building blocks every model family uses.
#include "core/random.h"
#include "nn/module.h"

namespace ham {

// While alive, layers allocate their parameters without filling them: for inspecting a
// model's structure (`ham info` on an 800M config) without paying for random init.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

struct InitOptions {
  double std = 0.02;  // normal(0, std) weights
  DType dtype = DType::F32;
};

// y = x W^T (+ b), W [out, in].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen,
         InitOptions init = {});
  Tensor forward(const Tensor& x) const;
  int64_t in_features, out_features;
  Tensor weight, bias;
};

// Rows of a [vocab, dim] table.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, Generator& gen, InitOptions init = {});
  Tensor forward(const Tensor& ids) const;
  Tensor weight;
};

// y = x / sqrt(mean(x^2) + eps) * weight, over the last dim; weight starts at 1.
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps, bool with_weight = true, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) const;
  double eps;
  Tensor weight;
};

// down(silu(gate(x)) * up(x)), no biases; the gating is one op (nn/swiglu.h).
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t dim, int64_t hidden, Generator& gen, InitOptions init = {},
         double down_std = 0.02);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> gate, up, down;
};

// y = silu(causal_conv1d(x, weight)): a depthwise short conv over time followed by SiLU,
// weight [C, W], no bias, as one op (Conv1dActivation::SiLU: one kernel each way on a GPU,
// and the pre-activation recomputed in the backward, not kept). x [B, T, C]; doc_ids
// [B, T] optional (taps never reach into the previous document).
class ShortConvolution : public Module {
 public:
  ShortConvolution(int64_t channels, int64_t width, Generator& gen);
  Tensor forward(const Tensor& x, const Tensor& doc_ids) const;
  Tensor weight;
};

}  // namespace ham

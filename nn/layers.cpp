#include "nn/layers.h"

#include <cmath>

#include "nn/conv1d.h"
#include "nn/embedding.h"
#include "nn/matmul.h"
#include "nn/norm.h"
#include "nn/swiglu.h"

namespace ham {

namespace {
thread_local bool skip_init = false;

Tensor init_normal(const Shape& shape, Generator& gen, double std, DType dtype) {
  return skip_init ? Tensor::empty(shape, dtype) : normal(shape, gen, 0.0, std, dtype);
}
}  // namespace

SkipInitGuard::SkipInitGuard() : previous_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = previous_; }
bool SkipInitGuard::active() { return skip_init; }

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator& gen, InitOptions init)
    : in_features(in), out_features(out) {
  register_parameter("weight", weight, init_normal({out, in}, gen, init.std, init.dtype));
  if (with_bias) register_parameter("bias", bias, Tensor::zeros({out}, init.dtype));
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight, bias); }

Embedding::Embedding(int64_t vocab, int64_t dim, Generator& gen, InitOptions init) {
  register_parameter("weight", weight, init_normal({vocab, dim}, gen, init.std, init.dtype));
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

RMSNorm::RMSNorm(int64_t dim, double eps_, bool with_weight, DType dtype) : eps(eps_) {
  if (with_weight) register_parameter("weight", weight, Tensor::full({dim}, 1.0, dtype));
}

Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, weight, eps); }

SwiGLU::SwiGLU(int64_t dim, int64_t hidden, Generator& gen, InitOptions init, double down_std) {
  gate = register_module("gate", std::make_shared<Linear>(dim, hidden, false, gen, init));
  up = register_module("up", std::make_shared<Linear>(dim, hidden, false, gen, init));
  InitOptions down_init = init;
  down_init.std = down_std;
  down = register_module("down", std::make_shared<Linear>(hidden, dim, false, gen, down_init));
}

Tensor SwiGLU::forward(const Tensor& x) const {
  return down->forward(swiglu(gate->forward(x), up->forward(x)));
}

ShortConvolution::ShortConvolution(int64_t channels, int64_t width, Generator& gen) {
  // Depthwise conv: fan-in is the width, so U(-1/sqrt(W), 1/sqrt(W)) (PyTorch's Conv1d).
  double bound = 1.0 / std::sqrt(double(width));
  register_parameter("weight", weight,
                     SkipInitGuard::active() ? Tensor::empty({channels, width})
                                             : uniform({channels, width}, gen, -bound, bound));
}

Tensor ShortConvolution::forward(const Tensor& x, const Tensor& doc_ids) const {
  return causal_conv1d(x, weight, Tensor(), doc_ids, Conv1dActivation::SiLU);
}

}  // namespace ham

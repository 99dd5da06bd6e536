#include "models/router.h"

#include <algorithm>
#include <cmath>

#include "autograd/node.h"
#include "nn/cast.h"
#include "nn/elementwise.h"
#include "nn/unary.h"
#include "nn/view.h"

namespace ham {

Tensor aggregate_head_scores(const Tensor& per_head, HeadAggregate aggregate) {
  HAM_CHECK(per_head.dim() == 3, "aggregate_head_scores: expected per-head scores [B, T, H], got ",
            shape_str(per_head.shape()));
  int64_t B = per_head.size(0), T = per_head.size(1), H = per_head.size(2);
  std::vector<double> values = per_head.to_vector<double>();
  std::vector<double> out(size_t(B * T));
  for (int64_t row = 0; row < B * T; ++row) {
    auto first = values.begin() + row * H, last = first + H;
    out[size_t(row)] = aggregate == HeadAggregate::Min ? *std::min_element(first, last)
                                                       : *std::max_element(first, last);
  }
  return Tensor::from_vector(out, {B, T}).to(per_head.dtype()).to(per_head.device());
}

InputRouter::InputRouter(RouterKind kind_, int64_t d_model, int64_t hidden, Generator& gen,
                         double init_std)
    : kind(kind_) {
  HAM_CHECK(kind != RouterKind::FitError,
            "InputRouter: the fit_error router has no weights (it reads the GDN forward)");
  keep_full_precision();  // the paper's routers run in fp32; bf16 inputs are cast up
  InitOptions init{init_std};
  if (kind == RouterKind::InputShallow) {
    proj = register_module("proj", std::make_shared<Linear>(d_model, 1, false, gen, init));
  } else {
    fc1 = register_module("fc1", std::make_shared<Linear>(d_model, hidden, false, gen, init));
    fc2 = register_module("fc2", std::make_shared<Linear>(hidden, hidden, false, gen, init));
    fc3 = register_module("fc3", std::make_shared<Linear>(hidden, 1, false, gen, init));
  }
}

Tensor InputRouter::forward(const Tensor& x) const {
  int64_t B = x.size(0), T = x.size(1);
  const Tensor& first = kind == RouterKind::InputShallow ? proj->weight : fc1->weight;
  Tensor in = cast(x, first.dtype());  // a bf16 activation into the f32 router
  Tensor logit = kind == RouterKind::InputShallow
                     ? proj->forward(in)
                     : fc3->forward(gelu(fc2->forward(gelu(fc1->forward(in)))));
  return reshape(sigmoid(logit), {B, T});
}

int64_t InputRouter::parameter_count(RouterKind kind, int64_t d_model, int64_t hidden) {
  switch (kind) {
    case RouterKind::FitError: return 0;
    case RouterKind::InputShallow: return d_model;
    case RouterKind::InputDeep: return d_model * hidden + hidden * hidden + hidden;
  }
  return 0;
}

DepthAverage::DepthAverage() {
  keep_full_precision();  // mixes the routers' f32 scores
  register_parameter("gamma_logit", gamma_logit, Tensor::zeros({1}));
}

Tensor DepthAverage::forward(const Tensor& score, const Tensor& previous_score) const {
  // 1 - sigmoid(l) = sigmoid(-l): no cancellation when gamma is close to 1.
  return add(mul(sigmoid(gamma_logit), score), mul(sigmoid(neg(gamma_logit)), previous_score));
}

double DepthAverage::gamma() const {
  double logit = gamma_logit.to_vector<double>()[0];
  return 1.0 / (1.0 + std::exp(-logit));
}

}  // namespace ham

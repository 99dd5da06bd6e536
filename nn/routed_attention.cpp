#include "nn/routed_attention.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/routed_attention.h"

namespace ham {

namespace {

// Inputs in order: q, k, v, value_scale (value_scale may be undefined: no edge).
// Saves the compacted selection and the forward's o and lse; P is recomputed from lse.
class RoutedAttentionBackward final : public Node {
 public:
  Tensor q, k, v, value_scale, out, lse;
  CompactSelection selection;
  double scale = 0;

  std::string name() const override { return "RoutedAttentionBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    ops::RoutedAttentionGrads g =
        ops::routed_attention_backward(grads[0], q, k, v, selection, out, lse, value_scale, scale);
    return {g.dq, g.dk, g.dv, g.dvalue_scale};
  }

  void release_saved() override {
    q = k = v = value_scale = out = lse = Tensor();
    selection = CompactSelection();
  }
};

}  // namespace

Tensor routed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& select,
                        const Tensor& value_scale, const Tensor& doc_ids, double scale) {
  ops::check_routed_attention_inputs(q, k, v, select, value_scale, doc_ids, scale);
  CompactSelection selection = ops::compact_selection(select, doc_ids);
  ops::RoutedAttentionOutput r =
      ops::routed_attention_forward(q, k, v, selection, value_scale, scale);
  if (any_requires_grad({q, k, v, value_scale})) {
    auto node = std::make_shared<RoutedAttentionBackward>();
    node->q = q;
    node->k = k;
    node->v = v;
    node->value_scale = value_scale;
    node->out = detach(r.out);  // saving the output itself would make out -> node -> out a cycle
    node->lse = r.lse;
    node->selection = std::move(selection);
    node->scale = scale;
    connect(node, {q, k, v, value_scale}, {&r.out});
  }
  return r.out;
}

}  // namespace ham

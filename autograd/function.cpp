#include "autograd/function.h"

namespace ham {

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && requires_grad(t)) return true;
  }
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && requires_grad(t)) return true;
  }
  return false;
}

void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
             const std::vector<Tensor*>& outputs) {
  node->next_edges.clear();
  for (const Tensor& t : inputs) {
    node->next_edges.push_back(t.defined() ? gradient_edge(t) : Edge{});
  }
  node->outputs.clear();
  node->output_hooks.assign(outputs.size(), {});
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = *outputs[i];
    node->outputs.push_back({out.shape(), out.dtype(), out.device()});
    if (!is_floating(out.dtype())) continue;  // integer outputs carry no gradient
    AutogradMeta& meta = autograd_meta(out);
    meta.grad_fn = node;
    meta.output_nr = int(i);
  }
}

}  // namespace ham

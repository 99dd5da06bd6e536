#include "autograd/node.h"

#include <atomic>
#include <cstdint>
#include <string>

#include "core/ops/elementwise.h"

namespace ham {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node() : sequence_nr(next_sequence_nr++) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>& grads) {
  auto meta = leaf_.lock();
  if (!meta) return {};  // the leaf died: nobody can read its gradient
  Tensor g = grads.at(0);
  for (auto& hook : meta->leaf_hooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = replaced;
  }
  if (!meta->grad.defined()) {
    meta->grad = g.clone();  // own it: optimizers update .grad in place
  } else {
    check_same_shape("AccumulateGrad", meta->grad, g);
    ops::axpy_(1.0, g, meta->grad);
  }
  return {};
}

AutogradMeta& autograd_meta(const Tensor& t) {
  auto& slot = t.autograd_meta();
  if (!slot) slot = std::make_shared<AutogradMeta>();
  return static_cast<AutogradMeta&>(*slot);
}

AutogradMeta* find_autograd_meta(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return static_cast<AutogradMeta*>(t.autograd_meta().get());
}

const Tensor& set_requires_grad(const Tensor& t, bool flag) {
  AutogradMeta& meta = autograd_meta(t);
  HAM_CHECK(!meta.grad_fn, "set_requires_grad: only leaf tensors can be marked (this one comes "
            "from ", meta.grad_fn->name(), "; use detach() first)");
  HAM_CHECK(!flag || is_floating(t.dtype()), "set_requires_grad: ", t.str(),
            " is not floating point, so it cannot have a gradient");
  meta.requires_grad = flag;
  return t;
}

bool requires_grad(const Tensor& t) {
  AutogradMeta* meta = find_autograd_meta(t);
  return meta && (meta->requires_grad || meta->grad_fn);
}

bool is_leaf(const Tensor& t) {
  AutogradMeta* meta = find_autograd_meta(t);
  return !meta || !meta->grad_fn;
}

std::shared_ptr<Node> grad_fn(const Tensor& t) {
  AutogradMeta* meta = find_autograd_meta(t);
  return meta ? meta->grad_fn : nullptr;
}

Tensor grad(const Tensor& t) {
  AutogradMeta* meta = find_autograd_meta(t);
  return meta ? meta->grad : Tensor();
}

void set_grad(const Tensor& t, const Tensor& g) {
  if (g.defined()) check_same_shape("set_grad", t, g);
  autograd_meta(t).grad = g;
}

void clear_grad(const Tensor& t) {
  if (AutogradMeta* meta = find_autograd_meta(t)) meta->grad = Tensor();
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* meta = find_autograd_meta(t);
  if (!meta) return {};
  if (meta->grad_fn) return {meta->grad_fn, meta->output_nr};
  if (!meta->requires_grad) return {};
  if (!meta->accumulator) {
    auto shared = std::static_pointer_cast<AutogradMeta>(t.autograd_meta());
    meta->accumulator = std::make_shared<AccumulateGrad>(shared);
    meta->accumulator->outputs.push_back({t.shape(), t.dtype(), t.device()});
    meta->accumulator->output_hooks.resize(1);
  }
  return {meta->accumulator, 0};
}

void register_hook(const Tensor& t, GradHook hook) {
  AutogradMeta* meta = find_autograd_meta(t);
  HAM_CHECK(meta && (meta->requires_grad || meta->grad_fn),
            "register_hook: tensor ", t.str(), " does not require grad");
  if (meta->grad_fn) {
    meta->grad_fn->output_hooks.at(size_t(meta->output_nr)).push_back(std::move(hook));
  } else {
    meta->leaf_hooks.push_back(std::move(hook));
  }
}

void retain_grad(const Tensor& t) {
  AutogradMeta& meta = autograd_meta(t);
  if (!meta.grad_fn || meta.retains_grad) return;  // leaves keep their grad anyway
  meta.retains_grad = true;
  std::weak_ptr<AutogradMeta> weak = std::static_pointer_cast<AutogradMeta>(t.autograd_meta());
  register_hook(t, [weak](const Tensor& g) {
    if (auto m = weak.lock()) {
      if (!m->grad.defined()) {
        m->grad = g.clone();
      } else {
        ops::axpy_(1.0, g, m->grad);
      }
    }
    return Tensor();
  });
}

Tensor detach(const Tensor& t) {
  Tensor view = t.reshape(t.shape());  // a fresh impl over the same storage, no autograd
  return view;
}

void set_name(const Tensor& t, const std::string& name) { autograd_meta(t).name = name; }

}  // namespace ham

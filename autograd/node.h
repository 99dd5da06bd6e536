#pragma once
// The graph. Every differentiable op that sees an input requiring grad records one Node:
// what it saved from the forward pass, and an Edge to the node that produced each input.
// Vocabulary after PyTorch: Node (grad_fn), Edge, AccumulateGrad (a leaf's sink).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ham {

class Node;

// Points at input `input_nr` of `node`: "send this gradient there".
struct Edge {
  std::shared_ptr<Node> node;
  int input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// Shape/dtype/device of an op's output, so the engine can make zeros for an output
// nobody used.
struct OutputInfo {
  Shape shape;
  DType dtype;
  Device device;
};

// Called with the gradient arriving at a tensor; may return a replacement (or the
// undefined tensor to keep it).
using GradHook = std::function<Tensor(const Tensor& grad)>;

class Node {
 public:
  Node();
  virtual ~Node() = default;

  // Name shown in errors and graph dumps, e.g. "MatmulBackward".
  virtual std::string name() const = 0;
  // grads[i] = dL/d(output i) (the engine supplies zeros for unused outputs).
  // Returns dL/d(input j) for each next_edges[j]; an undefined tensor means "none".
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grads) = 0;
  // Frees tensors saved for backward once they are no longer needed.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  std::vector<OutputInfo> outputs;
  std::vector<std::vector<GradHook>> output_hooks;  // per output, run before apply()
  uint64_t sequence_nr;  // creation order: later nodes run first among the ready ones
  bool saved_released = false;  // set after a backward that did not keep the graph
};

// A leaf's sink: adds the incoming gradient to the leaf's .grad.
class AccumulateGrad;

// Autograd's per-tensor state, hung on core's opaque slot.
struct AutogradMeta : AutogradMetaBase {
  bool requires_grad = false;
  Tensor grad;                       // accumulated gradient of a leaf (or retained)
  std::shared_ptr<Node> grad_fn;     // producer of a non-leaf
  int output_nr = 0;                 // which output of grad_fn
  std::shared_ptr<AccumulateGrad> accumulator;  // leaves only
  std::vector<GradHook> leaf_hooks;  // hooks on a leaf, run before accumulation
  bool retains_grad = false;
  std::string name;                  // optional label used in dumps and errors
};

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<AutogradMeta> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;
  std::shared_ptr<AutogradMeta> leaf() const { return leaf_.lock(); }

 private:
  std::weak_ptr<AutogradMeta> leaf_;
};

// ---- Per-tensor autograd API (free functions: core's Tensor knows nothing of this) ----

// The tensor's autograd state, created on first use.
AutogradMeta& autograd_meta(const Tensor& t);
// nullptr when the tensor never took part in autograd.
AutogradMeta* find_autograd_meta(const Tensor& t);

// Marks a leaf as a parameter/input whose gradient is wanted. Returns t for chaining.
const Tensor& set_requires_grad(const Tensor& t, bool requires_grad = true);
bool requires_grad(const Tensor& t);  // leaf flag or has a grad_fn
bool is_leaf(const Tensor& t);
std::shared_ptr<Node> grad_fn(const Tensor& t);
// The accumulated gradient (undefined before any backward reached it).
Tensor grad(const Tensor& t);
void set_grad(const Tensor& t, const Tensor& g);
void clear_grad(const Tensor& t);
// Where a gradient for `t` must be sent: its grad_fn output, or its leaf accumulator.
Edge gradient_edge(const Tensor& t);

// Hooks see (and may replace) the gradient flowing into a tensor, leaf or intermediate.
void register_hook(const Tensor& t, GradHook hook);
// Keeps the gradient of an intermediate tensor in grad(t) after backward.
void retain_grad(const Tensor& t);
// A new tensor sharing t's storage, cut from the graph.
Tensor detach(const Tensor& t);
// Labels a tensor in graph dumps and gradient reports.
void set_name(const Tensor& t, const std::string& name);

}  // namespace ham

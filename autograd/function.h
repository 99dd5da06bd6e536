#pragma once
// How a differentiable op joins the graph:
//
//   Tensor y = ops::exp(x);                       // compute with core kernels
//   if (any_requires_grad({x})) {
//     auto node = std::make_shared<ExpBackward>();
//     node->y = detach(y);      // save what backward needs; an output is saved
//                               // detached, or y -> node -> y would be a cycle
//     connect(node, {x}, {&y});                     // edges to x, y.grad_fn = node
//   }
//   return y;
#include <initializer_list>
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace ham {

// True when grad mode is on and some input needs a gradient.
bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Points node's edges at the inputs (undefined inputs get no edge) and makes the node
// the grad_fn of each output.
void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
             const std::vector<Tensor*>& outputs);

// Whether the node needs input i's gradient (lets backward skip work).
inline bool needs_input_grad(const Node& node, size_t i) {
  return i < node.next_edges.size() && node.next_edges[i].valid();
}

}  // namespace ham

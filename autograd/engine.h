#pragma once
// Reverse-mode backward. Given roots and their incoming gradients, runs every reachable
// node once, after all nodes that feed it, summing gradients that meet at a tensor.
#include <vector>

#include "autograd/node.h"

namespace ham {

// Accumulates d(roots)/d(leaf) * root_grads into every leaf's grad(). A scalar root may
// omit its gradient (1 is used). With keep_graph=false saved tensors are freed, so a
// second backward through the same graph is an error.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads = {},
              bool keep_graph = false);
void backward(const Tensor& root, const Tensor& root_grad = Tensor(), bool keep_graph = false);

// Returns d(outputs)/d(inputs) contracted with grad_outputs, without touching any
// leaf's grad(). An input the outputs do not depend on gets zeros.
std::vector<Tensor> gradients(const std::vector<Tensor>& outputs,
                              const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& grad_outputs = {},
                              bool keep_graph = false);

}  // namespace ham

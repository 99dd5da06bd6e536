#include "autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/profiler.h"

namespace ham {

namespace {

void accumulate(Tensor& slot, const Tensor& g) {
  if (!g.defined()) return;
  slot = slot.defined() ? ops::add(slot, g) : g;
}

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

// Runs the graph below root_edges. With `captures`, the gradients arriving at those edges
// are stored in `captured` and leaves are not accumulated into.
void run_graph(const std::vector<Edge>& root_edges, const std::vector<Tensor>& root_grads,
               bool keep_graph, const std::vector<Edge>* captures,
               std::vector<Tensor>* captured) {
  NoGradGuard no_grad;  // backward formulas are not themselves recorded
  profiler::Phase phase("backward");  // the ops below, in a profile (core/profiler.h)

  // Count, for each node, how many edges inside the graph point at it.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& e : root_edges) {
    if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges) {
      if (!e.valid()) continue;
      ++dependencies[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  std::unordered_set<Node*> queued;
  for (size_t i = 0; i < root_edges.size(); ++i) {
    Node* node = root_edges[i].node.get();
    auto& buffer = buffers[node];
    buffer.resize(node->outputs.size());
    accumulate(buffer.at(size_t(root_edges[i].input_nr)), root_grads[i]);
    if (dependencies[node] == 0 && queued.insert(node).second) ready.push(node);
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    HAM_CHECK(!node->saved_released, "backward through ", node->name(),
              " a second time: its saved tensors were freed by the first backward "
              "(pass keep_graph=true to it)");
    std::vector<Tensor> grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(node->outputs.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      const OutputInfo& info = node->outputs[i];
      if (!grads[i].defined()) grads[i] = Tensor::zeros(info.shape, info.dtype, info.device);
      for (auto& hook : node->output_hooks[i]) {
        Tensor replaced = hook(grads[i]);
        if (replaced.defined()) {
          HAM_CHECK(replaced.shape() == info.shape, "gradient hook on an output of ",
                    node->name(), " returned shape ", shape_str(replaced.shape()),
                    ", expected ", shape_str(info.shape));
          grads[i] = replaced;
        }
      }
    }
    bool is_leaf_sink = dynamic_cast<AccumulateGrad*>(node) != nullptr;
    if (captures) {
      for (size_t c = 0; c < captures->size(); ++c) {
        const Edge& e = (*captures)[c];
        if (e.node.get() == node) (*captured)[c] = grads.at(size_t(e.input_nr));
      }
      if (is_leaf_sink) continue;
    }
    std::vector<Tensor> input_grads = node->apply(grads);
    if (!keep_graph && !is_leaf_sink) {
      node->release_saved();
      node->saved_released = true;
    }
    HAM_CHECK(input_grads.size() <= node->next_edges.size(), node->name(), " returned ",
              input_grads.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t j = 0; j < node->next_edges.size(); ++j) {
      const Edge& e = node->next_edges[j];
      if (!e.valid()) continue;
      if (j < input_grads.size() && input_grads[j].defined()) {
        const OutputInfo& target = e.node->outputs.at(size_t(e.input_nr));
        HAM_CHECK(input_grads[j].shape() == target.shape, node->name(), " produced a gradient of shape ",
                  shape_str(input_grads[j].shape()), " for input ", j, " of shape ",
                  shape_str(target.shape));
        auto& buffer = buffers[e.node.get()];
        buffer.resize(e.node->outputs.size());
        accumulate(buffer[size_t(e.input_nr)], input_grads[j]);
      }
      if (--dependencies[e.node.get()] == 0 && queued.insert(e.node.get()).second) {
        ready.push(e.node.get());
      }
    }
  }
}

std::vector<Tensor> default_root_grads(const std::vector<Tensor>& roots,
                                       const std::vector<Tensor>& given) {
  HAM_CHECK(given.empty() || given.size() == roots.size(), "backward: ", roots.size(),
            " roots but ", given.size(), " gradients");
  std::vector<Tensor> grads(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!given.empty() && given[i].defined()) {
      check_same_shape("backward (root gradient)", roots[i], given[i]);
      grads[i] = given[i];
    } else {
      HAM_CHECK(roots[i].numel() == 1, "backward: root ", roots[i].str(),
                " is not a scalar, so its gradient must be given");
      grads[i] = Tensor::full(roots[i].shape(), 1.0, roots[i].dtype(), roots[i].device());
    }
  }
  return grads;
}

std::vector<Edge> root_edges_of(const std::vector<Tensor>& roots) {
  std::vector<Edge> edges;
  for (const Tensor& r : roots) {
    Edge e = gradient_edge(r);
    HAM_CHECK(e.valid(), "backward: root ", r.str(),
              " does not require grad (no parameter or input in its graph requires grad)");
    edges.push_back(e);
  }
  return edges;
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads,
              bool keep_graph) {
  run_graph(root_edges_of(roots), default_root_grads(roots, root_grads), keep_graph, nullptr,
            nullptr);
}

void backward(const Tensor& root, const Tensor& root_grad, bool keep_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{root_grad}, keep_graph);
}

std::vector<Tensor> gradients(const std::vector<Tensor>& outputs,
                              const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& grad_outputs, bool keep_graph) {
  std::vector<Edge> captures;
  for (const Tensor& x : inputs) {
    Edge e = gradient_edge(x);
    HAM_CHECK(e.valid(), "gradients: input ", x.str(), " does not require grad");
    captures.push_back(e);
  }
  std::vector<Tensor> captured(inputs.size());
  run_graph(root_edges_of(outputs), default_root_grads(outputs, grad_outputs), keep_graph,
            &captures, &captured);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!captured[i].defined()) {
      captured[i] = Tensor::zeros(inputs[i].shape(), inputs[i].dtype(), inputs[i].device());
    }
  }
  return captured;
}

}  // namespace ham

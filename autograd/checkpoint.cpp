#include "autograd/checkpoint.h"

#include <string>

#include "autograd/engine.h"
#include "autograd/function.h"

namespace ham {

namespace {

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(BlockFn fn, std::vector<Tensor> inputs)
      : fn_(std::move(fn)), inputs_(std::move(inputs)) {}
  std::string name() const override { return "CheckpointBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    EnableGradGuard enable;
    std::vector<Tensor> detached;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Tensor d = detach(inputs_[i]);
      if (needs_input_grad(*this, i)) set_requires_grad(d);
      detached.push_back(d);
    }
    std::vector<Tensor> outputs = fn_(detached);
    HAM_CHECK(outputs.size() == grads.size(), "checkpoint: the block returned ", outputs.size(),
              " outputs on recompute but ", grads.size(), " the first time");
    std::vector<Tensor> roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      check_same_shape("checkpoint recompute", outputs[i], grads[i]);
      if (requires_grad(outputs[i])) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) backward(roots, root_grads);
    std::vector<Tensor> input_grads;
    for (const Tensor& d : detached) input_grads.push_back(grad(d));
    return input_grads;
  }

  void release_saved() override { inputs_.clear(); }

 private:
  BlockFn fn_;
  std::vector<Tensor> inputs_;
};

}  // namespace

std::vector<Tensor> checkpoint(const BlockFn& fn, const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return fn(inputs);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  auto node = std::make_shared<CheckpointBackward>(fn, inputs);
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : outputs) out_ptrs.push_back(&t);
  connect(node, inputs, out_ptrs);
  return outputs;
}

}  // namespace ham

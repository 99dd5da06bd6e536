#include "models/language_model.h"

#include <string>

#include "autograd/function.h"
#include "models/gdn.h"
#include "models/ham.h"
#include "models/transformer.h"
#include "nn/cross_entropy.h"
#include "nn/linear_cross_entropy.h"
#include "nn/view.h"

namespace ham {

Tensor LanguageModel::loss(const TokenBatch& batch) const {
  Tensor logits = forward(batch);
  int64_t vocab = logits.size(-1);
  return cross_entropy(reshape(logits, {-1, vocab}), batch.targets.reshape({-1}));
}

DecoderLM::DecoderLM(const ModelConfig& c) : LanguageModel(c), init_generator_(c.seed) {
  embed = register_module("embed", std::make_shared<Embedding>(c.vocab_size, c.d_model,
                                                               init_generator_,
                                                               InitOptions{c.init_std}));
}

void DecoderLM::add_head() {
  const ModelConfig& c = config_;
  final_norm = register_module("final_norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  lm_head = register_module("lm_head", std::make_shared<Linear>(c.d_model, c.vocab_size, false,
                                                                init_generator_,
                                                                InitOptions{c.init_std}));
}

Tensor DecoderLM::embed_tokens(const TokenBatch& batch, const char* model) const {
  HAM_CHECK(batch.inputs.dim() == 2, model, ": inputs must be [B, T], got ",
            shape_str(batch.inputs.shape()));
  enter_block(BlockHooks::kOuterBlock, {});
  return leave_block(BlockHooks::kOuterBlock, {embed->forward(batch.inputs)})[0];
}

// Final norm and head are the outer block's second visit, in both forward and loss.
Tensor DecoderLM::forward(const TokenBatch& batch) const {
  Tensor in = enter_block(BlockHooks::kOuterBlock, {hidden_states(batch)})[0];
  return leave_block(BlockHooks::kOuterBlock, {lm_head->forward(final_norm->forward(in))})[0];
}

Tensor DecoderLM::loss(const TokenBatch& batch) const {
  Tensor in = enter_block(BlockHooks::kOuterBlock, {hidden_states(batch)})[0];
  Tensor normed = final_norm->forward(in);
  const int64_t d = normed.size(-1);
  Tensor loss = linear_cross_entropy(reshape(normed, {-1, d}), lm_head->weight,
                                     batch.targets.reshape({-1}));
  return leave_block(BlockHooks::kOuterBlock, {loss})[0];
}

namespace {

// Identity on a block's inputs or outputs whose backward tells the hooks where backward
// is: on the outputs it runs before every node of the block (created after them), on the
// inputs after every one (created before them).
class BlockBoundaryBackward final : public Node {
 public:
  enum class Side { Inputs, Outputs };
  BlockBoundaryBackward(std::shared_ptr<BlockHooks> hooks, int64_t block, Side side)
      : hooks_(std::move(hooks)), block_(block), side_(side) {}
  std::string name() const override {
    return std::string(side_ == Side::Inputs ? "BlockInputsBackward" : "BlockOutputsBackward") +
           "(block " + std::to_string(block_) + ")";
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (side_ == Side::Outputs) {
      hooks_->before_backward(block_);
    } else {
      hooks_->after_backward(block_);
    }
    return grads;
  }

 private:
  std::shared_ptr<BlockHooks> hooks_;
  int64_t block_;
  Side side_;
};

// The defined tensors through one BlockBoundaryBackward (when any needs a gradient).
std::vector<Tensor> through_boundary(const std::shared_ptr<BlockHooks>& hooks, int64_t block,
                                     BlockBoundaryBackward::Side side,
                                     const std::vector<Tensor>& tensors) {
  std::vector<Tensor> inputs;
  for (const Tensor& t : tensors) {
    if (t.defined()) inputs.push_back(t);
  }
  if (!any_requires_grad(inputs)) return tensors;
  std::vector<Tensor> outputs;
  for (const Tensor& t : inputs) outputs.push_back(detach(t));
  std::vector<Tensor*> output_slots;
  for (Tensor& t : outputs) output_slots.push_back(&t);
  connect(std::make_shared<BlockBoundaryBackward>(hooks, block, side), inputs, output_slots);
  std::vector<Tensor> result;
  size_t next = 0;
  for (const Tensor& t : tensors) result.push_back(t.defined() ? outputs[next++] : t);
  return result;
}

}  // namespace

std::vector<Tensor> DecoderLM::enter_block(int64_t block, const std::vector<Tensor>& inputs) const {
  if (!block_hooks_) return inputs;
  std::vector<Tensor> marked =
      through_boundary(block_hooks_, block, BlockBoundaryBackward::Side::Inputs, inputs);
  block_hooks_->before_forward(block);
  return marked;
}

std::vector<Tensor> DecoderLM::leave_block(int64_t block, const std::vector<Tensor>& outputs) const {
  if (!block_hooks_) return outputs;
  std::vector<Tensor> marked =
      through_boundary(block_hooks_, block, BlockBoundaryBackward::Side::Outputs, outputs);
  block_hooks_->after_forward(block);
  return marked;
}

std::shared_ptr<LanguageModel> make_model(const ModelConfig& config) {
  switch (config.family) {
    case ModelFamily::Transformer: return std::make_shared<Transformer>(config);
    case ModelFamily::GDN: return std::make_shared<GDNModel>(config);
    case ModelFamily::GDNGSA: return std::make_shared<GDNGSAModel>(config);
    case ModelFamily::HAM: return std::make_shared<HAMModel>(config);
  }
  HAM_FAIL("make_model: unknown family");
}

}  // namespace ham

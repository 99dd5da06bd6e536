#include "models/language_model.h"

#include "models/gdn.h"
#include "models/ham.h"
#include "models/transformer.h"
#include "nn/cross_entropy.h"
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
  return embed->forward(batch.inputs);
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

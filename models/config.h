#pragma once
// Model configuration, read from JSON. Unknown keys and out-of-range values are errors
// that name the file and the key, so a typo never silently falls back to a default.
//
// One flat set of keys serves all four families; each family reads the groups it uses:
//   every family        vocab_size d_model n_layers d_ff norm_eps init_std seed recompute
//   softmax attention   n_heads n_kv_heads head_dim v_head_dim rope_base
//     (Transformer layers, the GSA layers of GDN-GSA, HAM's KV path)
//                       attn_conv_size (Transformer and GSA layers only; HAM's KV path
//                       has its own conv of conv_size)
//   gated delta rule    gdn_heads gdn_head_dim gdn_v_head_dim conv_size gdn_keep_chunk_states
//     (GDN layers, HAM's RNN path)
//   GDN-GSA             gsa_every (every k-th layer, counting from 1, is attention)
//   HAM                 router router_hidden router_aggregate eda tau learn_tau kv_target
//                       tau_freeze_steps tau_gain tau_clip tau_lr
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ham {

enum class ModelFamily { Transformer, GDN, GDNGSA, HAM };
const char* family_name(ModelFamily family);  // "transformer", "gdn", "gdn-gsa", "ham"

// HAM's routing score e_t: the RNN's cosine prediction error, or a learned function of x_t.
enum class RouterKind { FitError, InputShallow, InputDeep };
const char* router_name(RouterKind router);  // "fit_error", "input_shallow", "input_deep"
enum class HeadAggregate { Min, Max };

struct ModelConfig {
  ModelFamily family = ModelFamily::Transformer;
  int64_t vocab_size = 257;
  int64_t d_model = 128;
  int64_t n_layers = 2;
  int64_t d_ff = 384;  // SwiGLU hidden size
  double norm_eps = 1e-6;
  double init_std = 0.02;
  bool recompute = false;  // activation recompute per block
  uint64_t seed = 0;       // initialisation seed

  // Softmax attention.
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;  // grouped-query attention when < n_heads
  int64_t head_dim = 32;
  int64_t v_head_dim = 32;  // defaults to head_dim
  double rope_base = 10000.0;
  // Width of a short conv + SiLU on q, k and v before RoPE in Transformer and GSA layers
  // (as GDN and HAM's KV path have); 0, the default, is plain attention. An ablation: it
  // gives attention the local token mixing recall tasks otherwise need a layer for.
  int64_t attn_conv_size = 0;

  // Gated delta rule.
  int64_t gdn_heads = 2;
  int64_t gdn_head_dim = 64;
  int64_t gdn_v_head_dim = 64;
  int64_t conv_size = 4;
  // The backward reads the forward's chunk states instead of recomputing them, where the
  // backend keeps them (the CUDA bf16 path: about five times v's memory per layer at
  // K = V = 128, held from forward to backward; nn/gated_delta_rule.h). Unset, the forward
  // keeps each chunk's A alone (GatedDeltaRuleKeep::Inverses: v's memory at K = V = 128).
  bool gdn_keep_chunk_states = false;

  // GDN-GSA.
  int64_t gsa_every = 2;

  // HAM.
  RouterKind router = RouterKind::FitError;
  int64_t router_hidden = 256;  // deep input router width
  HeadAggregate router_aggregate = HeadAggregate::Min;
  bool eda = false;              // average scores with the previous layer's (learned gamma)
  double tau = 1.0;              // threshold in score units: select_t = [e_t >= tau]
  bool learn_tau = false;        // Algorithm 2: synthetic gradient toward kv_target
  std::vector<double> kv_target = {0.5};  // one global target, or one per layer
  int64_t tau_freeze_steps = 0;
  double tau_gain = 1.0;         // gamma in Algorithm 2
  double tau_clip = 1.0;         // c in Algorithm 2
  double tau_lr = 2.5e-4;

  // d_QK and d_V of HAM's shared projections (and of a GDN layer).
  int64_t gdn_qk_dim() const { return gdn_heads * gdn_head_dim; }
  int64_t gdn_v_dim() const { return gdn_heads * gdn_v_head_dim; }
  // Threshold scale s: tau = s * sigmoid(p_tau); cosine distance lies in [0, 2].
  double tau_scale() const { return router == RouterKind::FitError ? 2.0 : 1.0; }
  // Whether layer i (0-based) is a softmax-attention layer.
  bool is_attention_layer(int64_t layer) const;
  double kv_target_for_layer(int64_t layer) const;

  // `source` labels errors (a file path or "<built-in>").
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_file(const std::string& path);
  nlohmann::json to_json() const;
  void validate(const std::string& source) const;
};

}  // namespace ham

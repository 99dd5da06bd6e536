#pragma once
// Autoregressive decoding with per-layer state, for every family: a Decoder takes a
// prompt in one or more feed() calls, then one token at a time, and returns the logits of
// the tokens it was fed, equal (up to f32 rounding) to the full forward pass's logits at
// the same positions. The state it keeps per layer:
//
//   short convs      the last conv_size - 1 inputs of each depthwise conv      [B, W-1, C]
//   GDN / HAM RNN    the gated delta rule state S, f32 (f64 for f64 models)    [B, H, K, V]
//   attention        a KV cache of every token (Transformer, GDN-GSA's GSA layers)
//   HAM KV path      a KV cache of only the tokens with e_t >= tau (the tokens the full
//                    forward selects), and for learned routers each cached token's e_t,
//                    which scales its value inside the attention
//
// Each step reuses the model's own modules and ops: projections, convs (run over
// [state, new inputs]), norms, rope at explicit positions, and for the two sequence mixers
// (queries see the cached keys plus the new selected ones at or before them):
//   a feed of up to 16 tokens (a generated one)  gated_delta_rule_decode, the carried state
//                                                 advanced in place; routed_attention_decode
//                                                 over the cache
//   a longer feed (a prompt)                      the chunked gated delta rule from h0 = the
//                                                 state; routed_attention_forward
//
// Limitations: one document per sequence (positions run 0, 1, ... from the first token
// fed; there are no document resets inside a sequence); all B sequences advance together
// (every feed() gives each row the same number of tokens); no autograd (feed() runs
// under NoGradGuard). The Decoder shares the model's modules (it keeps them alive; weights
// changed later are seen) but reads the HAM thresholds only when it is built.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "models/accounting.h"
#include "models/language_model.h"
#include "nn/layers.h"

namespace ham {

// Generation-time routing for HAM (an error for other families).
struct RoutingOverride {
  std::optional<double> tau;            // every HAM layer's tau
  std::map<int64_t, double> layer_tau;  // per layer; wins over `tau`
  // Target KV fraction: each layer's tau is calibrated on the first feed() (the prompt)
  // so that k = round(F * n) of its n scores (all rows pooled) pass: tau is the midpoint
  // between the k-th and (k+1)-th largest score (just above the largest for k = 0, the
  // smallest for k = n; tokens tied at the boundary all pass). Layers are calibrated in
  // order, each on scores produced under the taus already set below it. Later tokens keep
  // that tau, so their fraction is F only approximately. Exclusive with tau / layer_tau.
  std::optional<double> kv_fraction;

  bool empty() const { return !tau && layer_tau.empty() && !kv_fraction; }
};

// One layer's decoding state after the tokens fed so far.
struct LayerCacheStats {
  int64_t layer = 0;
  LayerKind kind = LayerKind::Attention;
  std::vector<int64_t> kv_tokens;  // cached tokens per sequence; empty for GDN layers
  std::optional<double> tau;       // HAM only: the threshold in use
  int64_t kv_bytes = 0;            // keys, values (and value scales) of the cached tokens
  int64_t recurrent_bytes = 0;     // GDN / HAM state S
  int64_t conv_bytes = 0;          // short-conv windows
};

struct CacheBytes {
  int64_t kv = 0, recurrent = 0, conv = 0;
  int64_t total() const { return kv + recurrent + conv; }
};

class Decoder {
 public:
  // Decoding state for `batch` sequences of `model` (any family; on the model's device
  // and dtype). Errors name the override that does not fit the model.
  Decoder(const LanguageModel& model, int64_t batch, const RoutingOverride& routing = {});
  ~Decoder();
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;

  // tokens [B, n] (integer ids, n >= 1) -> logits [B, n, vocab] of those tokens, at
  // positions position() .. position() + n - 1.
  Tensor feed(const Tensor& tokens);
  // The same for host ids: one row per sequence, all rows of one length.
  Tensor feed(const std::vector<std::vector<int64_t>>& tokens);

  int64_t batch() const { return batch_; }
  int64_t position() const { return position_; }  // tokens fed per sequence
  int64_t num_layers() const { return int64_t(layers_.size()); }
  // Cached tokens per sequence of layer `layer` (empty for a GDN layer).
  std::vector<int64_t> kv_cache_tokens(int64_t layer) const;
  std::vector<LayerCacheStats> layer_stats() const;
  CacheBytes cache_bytes() const;  // summed over layers and sequences
  // HAM: the routing scores e_t [B, n] of the last feed at layer `layer` (after EDA), as
  // compared with tau; undefined for other layers.
  Tensor last_scores(int64_t layer) const;

  class LayerState;  // per-layer state (decoding.cpp)

 private:
  std::shared_ptr<Embedding> embed_;
  std::shared_ptr<RMSNorm> final_norm_;
  std::shared_ptr<Linear> lm_head_;
  int64_t vocab_ = 0;
  int64_t batch_ = 0, position_ = 0;
  bool pass_score_ = false;  // EDA: each HAM layer gets the previous layer's score
  std::vector<std::unique_ptr<LayerState>> layers_;
};

}  // namespace ham

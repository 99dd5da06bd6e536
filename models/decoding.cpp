#include "models/decoding.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>

#include "autograd/grad_mode.h"
#include "core/ops/gated_delta_rule.h"
#include "core/ops/gated_delta_rule_decode.h"
#include "core/ops/routed_attention.h"
#include "core/ops/routed_attention_decode.h"
#include "core/ops/shape.h"
#include "models/gdn.h"
#include "models/ham.h"
#include "models/router.h"
#include "models/transformer.h"
#include "nn/cast.h"
#include "nn/elementwise.h"
#include "nn/norm.h"
#include "nn/rope.h"
#include "nn/unary.h"
#include "nn/view.h"

namespace ham {

namespace {

// Time steps [begin, begin + count) of x [B, T, ...] (a copy unless it is all of x).
Tensor time_rows(const Tensor& x, int64_t begin, int64_t count) {
  const int64_t T = x.size(1);
  if (begin == 0 && count == T) return x;
  std::vector<int64_t> sizes;
  if (begin > 0) sizes.push_back(begin);
  sizes.push_back(count);
  if (begin + count < T) sizes.push_back(T - begin - count);
  return ops::split(x, sizes, 1)[begin > 0 ? 1 : 0];
}

int64_t bytes_of(const Tensor& t) { return t.defined() ? int64_t(t.nbytes()) : 0; }

// The last conv_size - 1 inputs of one short conv, per sequence (zeros before the first
// token, which is what the full forward's "x = 0 before t = 0" reads).
class ConvWindow {
 public:
  ConvWindow(std::shared_ptr<const ShortConvolution> conv, int64_t batch, DType dtype,
             Device device)
      : conv_(std::move(conv)), history_(conv_->weight.size(1) - 1) {
    if (history_ > 0) {
      window_ = Tensor::zeros({batch, history_, conv_->weight.size(0)}, dtype, device);
    }
  }

  // x [B, n, C] -> silu(conv(x)) [B, n, C], the conv's taps reaching back into the window.
  Tensor step(const Tensor& x) {
    if (history_ == 0) return conv_->forward(x, Tensor());
    const int64_t n = x.size(1);
    Tensor joined = ops::concat({window_, x}, 1);  // [B, W-1+n, C]
    Tensor y = conv_->forward(joined, Tensor());
    window_ = time_rows(joined, n, history_);
    return time_rows(y, history_, n);
  }

  int64_t bytes() const { return bytes_of(window_); }

 private:
  std::shared_ptr<const ShortConvolution> conv_;
  int64_t history_;
  Tensor window_;  // [B, W-1, C]
};

// Feeds of at most this many tokens (a generated token) run the decode ops; longer ones (a
// prompt) the training kernels.
constexpr int64_t kDecodeFeed = 16;

// The gated delta rule state S [B, H, K, V] carried across feeds, in f32 (f64 for an f64
// model) whatever the activations' dtype, as the chunked kernels keep it inside a sequence.
class DeltaRuleState {
 public:
  DeltaRuleState(int64_t batch, int64_t heads, int64_t key_dim, int64_t value_dim, DType dtype,
                 Device device)
      : dtype_(dtype),
        state_(Tensor::zeros({batch, heads, key_dim, value_dim},
                             ops::gated_delta_rule_state_dtype(dtype), device)) {}

  // One feed: a few tokens (a generated one) advance the state in place with the decode
  // kernel; a longer feed (a prompt) runs the chunked training algorithm from the state, so
  // a prompt fed at position 0 is chunked exactly as in the full forward. want_fit_error
  // false (a GDN layer's): a prompt's fit error is left undefined, not computed (the decode
  // kernel forms it anyway, from the residual it needs).
  ops::GatedDeltaRuleStep step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                               const Tensor& beta, bool want_fit_error) {
    if (q.size(1) <= kDecodeFeed) return ops::gated_delta_rule_decode(state_, q, k, v, g, beta);
    GatedDeltaRuleArgs args{q, k, v, g, beta, state_.to(dtype_), Tensor()};
    args.want_fit_error = want_fit_error;
    GatedDeltaRuleResult r = ops::gated_delta_rule_chunked(args);
    state_ = r.h_final.to(state_.dtype());
    return {r.o, r.fit_error};
  }

  int64_t bytes() const { return bytes_of(state_); }

 private:
  DType dtype_;
  Tensor state_;
};

// Cached tokens of one attention layer: row b holds count[b] tokens in order of position,
// keys [B, cap, Hkv, Dk], values [B, cap, Hkv, Dv] and, for HAM's learned routers, value
// scales [B, cap]. Capacity doubles as tokens arrive; bytes() counts the cached tokens.
class KVCache {
 public:
  KVCache(int64_t batch, int64_t kv_heads, int64_t key_dim, int64_t value_dim, bool value_scaled,
          DType dtype, Device device)
      : batch_(batch), heads_(kv_heads), key_dim_(key_dim), value_dim_(value_dim),
        value_scaled_(value_scaled), dtype_(dtype), device_(device), counts_(size_t(batch), 0) {}

  // Appends token i of row b wherever selected[b * n + i] != 0; k [B, n, Hkv, Dk],
  // v [B, n, Hkv, Dv], scale [B, n] (learned routers) or undefined. Returns, per (b, i),
  // how many cached tokens token i's query sees: those before it and itself if selected.
  std::vector<int64_t> append(const Tensor& k, const Tensor& v, const Tensor& scale,
                              const std::vector<uint8_t>& selected) {
    const int64_t n = k.size(1);
    HAM_CHECK(int64_t(selected.size()) == batch_ * n, "KVCache::append: selection of ",
              selected.size(), " tokens for k ", shape_str(k.shape()));
    HAM_CHECK(scale.defined() == value_scaled_, "KVCache::append: value scales ",
              value_scaled_ ? "missing" : "given", " for a cache ",
              value_scaled_ ? "with" : "without", " them");
    std::vector<int64_t> visible(size_t(batch_ * n));
    int64_t most = n;  // attend() needs room for n queries
    for (int64_t b = 0; b < batch_; ++b) {
      int64_t count = counts_[size_t(b)];
      for (int64_t i = 0; i < n; ++i) count += selected[size_t(b * n + i)] ? 1 : 0;
      most = std::max(most, count);
    }
    reserve(most);
    for (int64_t b = 0; b < batch_; ++b) {
      int64_t& count = counts_[size_t(b)];
      for (int64_t i = 0; i < n;) {
        if (!selected[size_t(b * n + i)]) {
          visible[size_t(b * n + i++)] = count;
          continue;
        }
        int64_t run = i;  // copy a run of selected tokens in one go
        while (run < n && selected[size_t(b * n + run)]) {
          visible[size_t(b * n + run)] = count + (run - i) + 1;
          ++run;
        }
        keys_.select(b).slice(count, count + run - i).copy_(k.select(b).slice(i, run));
        values_.select(b).slice(count, count + run - i).copy_(v.select(b).slice(i, run));
        if (value_scaled_) {
          scales_.select(b).slice(count, count + run - i).copy_(scale.select(b).slice(i, run));
        }
        count += run - i;
        i = run;
      }
    }
    return visible;
  }

  // o[b, i] = softmax attention of q[b, i] [B, n, Hq, Dk] over the cached tokens
  // [0, visible[b * n + i]) of row b, values scaled by their score when value-scaled (no
  // visible token gives o = 0). A few queries (a generated token) take the decode kernels,
  // which read just the visible cached keys; a prompt takes routed_attention's forward.
  Tensor attend(const Tensor& q, const std::vector<int64_t>& visible, double scale) const {
    const int64_t n = q.size(1);
    if (n <= kDecodeFeed) {
      return ops::routed_attention_decode(q, keys_, values_,
                                          Tensor::from_vector(visible, {batch_, n}),
                                          value_scaled_ ? scales_ : Tensor(), scale)
          .out;
    }
    Tensor padded_q = q;  // the kernel wants as many query rows as key rows
    if (n < capacity_) {
      padded_q = Tensor::zeros({batch_, capacity_, q.size(2), q.size(3)}, q.dtype(), q.device());
      for (int64_t b = 0; b < batch_; ++b) padded_q.select(b).slice(0, n).copy_(q.select(b));
    }
    std::vector<int64_t> positions(size_t(batch_ * capacity_), -1), begin(positions.size(), 0),
        end(positions.size(), 0);
    CompactSelection selection;
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t j = 0; j < counts_[size_t(b)]; ++j) positions[size_t(b * capacity_ + j)] = j;
      for (int64_t i = 0; i < n; ++i) end[size_t(b * capacity_ + i)] = visible[size_t(b * n + i)];
      selection.max_key_count = std::max(selection.max_key_count, counts_[size_t(b)]);
    }
    selection.key_positions = Tensor::from_vector(positions, {batch_, capacity_}, device_);
    selection.key_counts = Tensor::from_vector(counts_, {batch_}, device_);
    selection.visible_begin = Tensor::from_vector(begin, {batch_, capacity_}, device_);
    selection.visible_end = Tensor::from_vector(end, {batch_, capacity_}, device_);
    Tensor out = ops::routed_attention_forward(padded_q, keys_, values_, selection,
                                               value_scaled_ ? scales_ : Tensor(), scale)
                     .out;
    return time_rows(out, 0, n);
  }

  const std::vector<int64_t>& counts() const { return counts_; }

  int64_t bytes() const {
    int64_t tokens = 0;
    for (int64_t c : counts_) tokens += c;
    int64_t per_token = heads_ * (key_dim_ + value_dim_) + (value_scaled_ ? 1 : 0);
    return tokens * per_token * int64_t(dtype_size(dtype_));
  }

 private:
  void reserve(int64_t tokens) {
    if (tokens <= capacity_) return;
    int64_t capacity = std::max({tokens, 2 * capacity_, int64_t(16)});
    auto grow = [&](Tensor& t, Shape shape) {
      Tensor bigger = Tensor::empty(shape, dtype_, device_);
      for (int64_t b = 0; b < batch_ && capacity_ > 0; ++b) {
        bigger.select(b).slice(0, capacity_).copy_(t.select(b));
      }
      t = bigger;
    };
    grow(keys_, {batch_, capacity, heads_, key_dim_});
    grow(values_, {batch_, capacity, heads_, value_dim_});
    if (value_scaled_) grow(scales_, {batch_, capacity});
    capacity_ = capacity;
  }

  int64_t batch_, heads_, key_dim_, value_dim_;
  bool value_scaled_;
  DType dtype_;
  Device device_;
  std::vector<int64_t> counts_;
  int64_t capacity_ = 0;
  Tensor keys_, values_, scales_;
};

// [B, n] positions start, start + 1, ... of every row.
Tensor position_ids(int64_t batch, int64_t n, int64_t start, Device device) {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) ids.push_back(start + i);
  }
  return Tensor::from_vector(ids, {batch, n}, device);
}

// Per-layer routing override, validated against the model.
struct LayerOverride {
  std::optional<double> tau;          // fixed for this layer
  std::optional<double> kv_fraction;  // calibrate on the first feed
};

}  // namespace

// ---- Per-layer states -------------------------------------------------------------------

class Decoder::LayerState {
 public:
  virtual ~LayerState() = default;
  struct Output {
    Tensor x;      // the residual stream after the block [B, n, d]
    Tensor score;  // HAM: e_t [B, n] after EDA
  };
  // x: the residual stream of the new tokens [B, n, d]; positions [B, n].
  virtual Output step(const Tensor& x, const Tensor& positions, const Tensor& previous_score) = 0;
  virtual LayerCacheStats stats() const = 0;
  virtual std::vector<int64_t> kv_tokens() const { return {}; }
  virtual Tensor last_scores() const { return Tensor(); }
};

namespace {

// TransformerBlock (Transformer layers, GDN-GSA's GSA layers): a KV cache of every token,
// and the q/k/v conv windows where the attention has convs (attn_conv_size > 0).
class AttentionLayerState final : public Decoder::LayerState {
 public:
  AttentionLayerState(std::shared_ptr<const TransformerBlock> block, const ModelConfig& c,
                      int64_t layer, int64_t batch, DType dtype, Device device)
      : block_(std::move(block)), c_(c), layer_(layer),
        cache_(batch, c.n_kv_heads, c.head_dim, c.v_head_dim, false, dtype, device) {
    const CausalSelfAttention& attn = *block_->attn;
    if (attn.q_conv) {
      for (const auto& conv : {attn.q_conv, attn.k_conv, attn.v_conv}) {
        conv_windows_.emplace_back(conv, batch, dtype, device);
      }
    }
  }

  Output step(const Tensor& x, const Tensor& positions, const Tensor&) override {
    const int64_t B = x.size(0), n = x.size(1);
    const CausalSelfAttention& attn = *block_->attn;
    Tensor h = block_->attn_norm->forward(x);
    Tensor q = attn.q_proj->forward(h), k = attn.k_proj->forward(h), v = attn.v_proj->forward(h);
    if (!conv_windows_.empty()) {
      q = conv_windows_[0].step(q);
      k = conv_windows_[1].step(k);
      v = conv_windows_[2].step(v);
    }
    q = rope(reshape(q, {B, n, c_.n_heads, c_.head_dim}), c_.rope_base, positions);
    k = rope(reshape(k, {B, n, c_.n_kv_heads, c_.head_dim}), c_.rope_base, positions);
    v = reshape(v, {B, n, c_.n_kv_heads, c_.v_head_dim});
    std::vector<int64_t> visible = cache_.append(k, v, Tensor(), std::vector<uint8_t>(size_t(B * n), 1));
    Tensor o = cache_.attend(q, visible, 1.0 / std::sqrt(double(c_.head_dim)));
    Tensor mixed = add(x, attn.o_proj->forward(reshape(o, {B, n, c_.n_heads * c_.v_head_dim})));
    return {add(mixed, block_->mlp->forward(block_->mlp_norm->forward(mixed))), Tensor()};
  }

  LayerCacheStats stats() const override {
    LayerCacheStats s;
    s.layer = layer_;
    s.kind = LayerKind::Attention;
    s.kv_tokens = cache_.counts();
    s.kv_bytes = cache_.bytes();
    for (const ConvWindow& window : conv_windows_) s.conv_bytes += window.bytes();
    return s;
  }
  std::vector<int64_t> kv_tokens() const override { return cache_.counts(); }

 private:
  std::shared_ptr<const TransformerBlock> block_;
  ModelConfig c_;
  int64_t layer_;
  KVCache cache_;
  std::vector<ConvWindow> conv_windows_;  // q, k, v; empty without attention convs
};

// GDNBlock: conv windows and the recurrent state.
class GDNLayerState final : public Decoder::LayerState {
 public:
  GDNLayerState(std::shared_ptr<const GDNBlock> block, const ModelConfig& c, int64_t layer,
                int64_t batch, DType dtype, Device device)
      : block_(std::move(block)), c_(c), layer_(layer),
        q_conv_(block_->mixer->q_conv, batch, dtype, device),
        k_conv_(block_->mixer->k_conv, batch, dtype, device),
        v_conv_(block_->mixer->v_conv, batch, dtype, device),
        state_(batch, c.gdn_heads, c.gdn_head_dim, c.gdn_v_head_dim, dtype, device) {}

  Output step(const Tensor& x, const Tensor&, const Tensor&) override {
    const int64_t B = x.size(0), n = x.size(1);
    const int64_t H = c_.gdn_heads, K = c_.gdn_head_dim, V = c_.gdn_v_head_dim;
    const GatedDeltaNet& m = *block_->mixer;
    Tensor h = block_->mixer_norm->forward(x);
    Tensor q = reshape(q_conv_.step(m.q_proj->forward(h)), {B, n, H, K});
    Tensor k = reshape(k_conv_.step(m.k_proj->forward(h)), {B, n, H, K});
    Tensor v = reshape(v_conv_.step(m.v_proj->forward(h)), {B, n, H, V});
    q = scale(l2_norm(q), 1.0 / std::sqrt(double(K)));
    k = l2_norm(k);
    Tensor beta = sigmoid(m.b_proj->forward(h));
    Tensor g = gdn_log_decay(m.a_proj->forward(h), m.A_log, m.dt_bias);
    Tensor o = state_.step(q, k, v, g, beta, /*want_fit_error=*/false).o;
    Tensor gate = reshape(m.gate_proj->forward(h), {B, n, H, V});
    o = gated_rms_norm(o, gate, m.o_norm->weight, c_.norm_eps);
    Tensor mixed = add(x, m.o_proj->forward(reshape(o, {B, n, H * V})));
    return {add(mixed, block_->mlp->forward(block_->mlp_norm->forward(mixed))), Tensor()};
  }

  LayerCacheStats stats() const override {
    LayerCacheStats s;
    s.layer = layer_;
    s.kind = LayerKind::GDN;
    s.recurrent_bytes = state_.bytes();
    s.conv_bytes = q_conv_.bytes() + k_conv_.bytes() + v_conv_.bytes();
    return s;
  }

 private:
  std::shared_ptr<const GDNBlock> block_;
  ModelConfig c_;
  int64_t layer_;
  ConvWindow q_conv_, k_conv_, v_conv_;
  DeltaRuleState state_;
};

// HAMBlock: both paths' conv windows, the RNN state, and the sparse KV cache.
class HAMLayerState final : public Decoder::LayerState {
 public:
  HAMLayerState(std::shared_ptr<const HAMBlock> block, const ModelConfig& c, int64_t layer,
                int64_t batch, DType dtype, Device device, const LayerOverride& routing)
      : block_(std::move(block)), c_(c), layer_(layer),
        rnn_q_(block_->mixer->rnn->q_conv, batch, dtype, device),
        rnn_k_(block_->mixer->rnn->k_conv, batch, dtype, device),
        rnn_v_(block_->mixer->rnn->v_conv, batch, dtype, device),
        kv_q_(block_->mixer->kv->q_conv, batch, dtype, device),
        kv_k_(block_->mixer->kv->k_conv, batch, dtype, device),
        kv_v_(block_->mixer->kv->v_conv, batch, dtype, device),
        state_(batch, c.gdn_heads, c.gdn_head_dim, c.gdn_v_head_dim, dtype, device),
        cache_(batch, c.n_kv_heads, c.head_dim, c.v_head_dim, block_->mixer->router != nullptr,
               dtype, device),
        tau_(routing.tau.value_or(block_->mixer->threshold.tau())),
        calibrate_fraction_(routing.kv_fraction) {}

  // HAMLayer::forward (models/ham.h) for the new tokens, with carried state.
  Output step(const Tensor& x, const Tensor& positions, const Tensor& previous_score) override {
    const int64_t B = x.size(0), n = x.size(1);
    const int64_t H = c_.gdn_heads, K = c_.gdn_head_dim, V = c_.gdn_v_head_dim;
    const HAMLayer& m = *block_->mixer;
    Tensor h = block_->mixer_norm->forward(x);
    Tensor q = m.q_proj->forward(h), k = m.k_proj->forward(h), v = m.v_proj->forward(h);

    // RNN path.
    Tensor rnn_q = m.rnn->q_norm->forward(rnn_q_.step(q));
    Tensor rnn_k = m.rnn->k_norm->forward(rnn_k_.step(k));
    Tensor rnn_v = m.rnn->v_norm->forward(rnn_v_.step(v));
    rnn_q = scale(l2_norm(reshape(rnn_q, {B, n, H, K})), 1.0 / std::sqrt(double(K)));
    rnn_k = l2_norm(reshape(rnn_k, {B, n, H, K}));
    rnn_v = reshape(rnn_v, {B, n, H, V});
    Tensor log_decay = gdn_log_decay(m.a_proj->forward(h), m.A_log, m.dt_bias);
    Tensor beta = sigmoid(m.b_proj->forward(h));
    const ops::GatedDeltaRuleStep recurrent =
        state_.step(rnn_q, rnn_k, rnn_v, log_decay, beta, /*want_fit_error=*/true);

    // Routing score and selection m_t = [e_t >= tau].
    Tensor score;
    if (m.router) {
      score = m.router->forward(h);
      if (m.eda && previous_score.defined()) score = m.eda->forward(score, previous_score);
    } else {
      score = aggregate_head_scores(recurrent.fit_error, c_.router_aggregate);
    }
    std::vector<double> scores = score.to_vector<double>();
    if (calibrate_fraction_) {
      tau_ = tau_for_fraction(scores, *calibrate_fraction_);
      calibrate_fraction_.reset();
    }
    std::vector<uint8_t> selected(scores.size());
    for (size_t i = 0; i < scores.size(); ++i) selected[i] = scores[i] >= tau_ ? 1 : 0;
    last_scores_ = score;

    // KV path over the cached (selected) tokens; learned scores scale the values.
    Tensor kv_q = m.kv->q_norm->forward(kv_q_.step(q));
    Tensor kv_k = m.kv->k_norm->forward(kv_k_.step(k));
    Tensor kv_v = m.kv->v_norm->forward(kv_v_.step(v));
    kv_q = rope(reshape(kv_q, {B, n, c_.n_heads, c_.head_dim}), c_.rope_base, positions);
    kv_k = rope(reshape(kv_k, {B, n, c_.n_kv_heads, c_.head_dim}), c_.rope_base, positions);
    kv_v = reshape(kv_v, {B, n, c_.n_kv_heads, c_.v_head_dim});
    std::vector<int64_t> visible =
        cache_.append(kv_k, kv_v, m.router ? cast(score, kv_v.dtype()) : Tensor(), selected);
    Tensor kv_out = cache_.attend(kv_q, visible, 1.0 / std::sqrt(double(c_.head_dim)));

    // o = g_RNN * GatedNorm(o_RNN) + g_KV * Norm(o_KV), heads merged before the sum.
    Tensor rnn_gated = mul(gated_rms_norm(recurrent.o, reshape(m.gate_proj->forward(h), {B, n, H, V}),
                                          m.rnn_out_norm->weight, c_.norm_eps),
                           reshape(sigmoid(m.rnn_gate->forward(h)), {B, n, H, 1}));
    Tensor kv_gated = mul(m.kv_out_norm->forward(kv_out),
                          reshape(sigmoid(m.kv_gate->forward(h)), {B, n, c_.n_heads, 1}));
    Tensor mixed = add(reshape(rnn_gated, {B, n, c_.gdn_v_dim()}),
                       reshape(kv_gated, {B, n, c_.gdn_v_dim()}));
    Tensor after_mixer = add(x, m.o_proj->forward(mixed));
    return {add(after_mixer, block_->mlp->forward(block_->mlp_norm->forward(after_mixer))), score};
  }

  LayerCacheStats stats() const override {
    LayerCacheStats s;
    s.layer = layer_;
    s.kind = LayerKind::HAM;
    s.kv_tokens = cache_.counts();
    s.tau = tau_;
    s.kv_bytes = cache_.bytes();
    s.recurrent_bytes = state_.bytes();
    s.conv_bytes = rnn_q_.bytes() + rnn_k_.bytes() + rnn_v_.bytes() + kv_q_.bytes() +
                   kv_k_.bytes() + kv_v_.bytes();
    return s;
  }
  std::vector<int64_t> kv_tokens() const override { return cache_.counts(); }
  Tensor last_scores() const override { return last_scores_; }

 private:
  // tau such that round(fraction * n) of the n scores pass (see RoutingOverride).
  static double tau_for_fraction(std::vector<double> scores, double fraction) {
    std::sort(scores.begin(), scores.end(), std::greater<>());
    const size_t n = scores.size();
    const size_t keep = size_t(std::llround(fraction * double(n)));
    if (keep == 0) return std::nextafter(scores[0], std::numeric_limits<double>::infinity());
    if (keep >= n) return scores[n - 1];
    return 0.5 * (scores[keep - 1] + scores[keep]);
  }

  std::shared_ptr<const HAMBlock> block_;
  ModelConfig c_;
  int64_t layer_;
  ConvWindow rnn_q_, rnn_k_, rnn_v_, kv_q_, kv_k_, kv_v_;
  DeltaRuleState state_;
  KVCache cache_;
  double tau_;
  std::optional<double> calibrate_fraction_;
  Tensor last_scores_;
};

// The override for each HAM layer; errors name what does not fit the model.
std::vector<LayerOverride> layer_overrides(const RoutingOverride& r, const ModelConfig& c) {
  std::vector<LayerOverride> out(size_t(c.n_layers));
  if (r.empty()) return out;
  HAM_CHECK(c.family == ModelFamily::HAM, "Decoder: tau / kv_fraction overrides apply to HAM "
            "models only; this model is '", family_name(c.family), "'");
  HAM_CHECK(!(r.kv_fraction && (r.tau || !r.layer_tau.empty())),
            "Decoder: give either kv_fraction or tau overrides, not both");
  if (r.kv_fraction) {
    double f = *r.kv_fraction;
    HAM_CHECK(std::isfinite(f) && f >= 0 && f <= 1, "Decoder: kv_fraction must lie in [0, 1], got ", f);
    for (LayerOverride& l : out) l.kv_fraction = f;
  }
  if (r.tau) {
    HAM_CHECK(std::isfinite(*r.tau), "Decoder: tau must be finite, got ", *r.tau);
    for (LayerOverride& l : out) l.tau = *r.tau;
  }
  for (const auto& [layer, tau] : r.layer_tau) {
    HAM_CHECK(layer >= 0 && layer < c.n_layers, "Decoder: tau override for layer ", layer,
              ", but the model has layers 0..", c.n_layers - 1);
    HAM_CHECK(std::isfinite(tau), "Decoder: tau for layer ", layer, " must be finite, got ", tau);
    out[size_t(layer)].tau = tau;
  }
  return out;
}

}  // namespace

// ---- Decoder ----------------------------------------------------------------------------

Decoder::Decoder(const LanguageModel& model, int64_t batch, const RoutingOverride& routing)
    : batch_(batch) {
  HAM_CHECK(batch >= 1, "Decoder: batch must be at least 1, got ", batch);
  const auto* lm = dynamic_cast<const DecoderLM*>(&model);
  HAM_CHECK(lm, "Decoder: the model is not one of the four families (no DecoderLM)");
  const ModelConfig& c = model.config();
  std::vector<LayerOverride> per_layer = layer_overrides(routing, c);
  embed_ = lm->embed;
  final_norm_ = lm->final_norm;
  lm_head_ = lm->lm_head;
  vocab_ = c.vocab_size;
  const DType dtype = embed_->weight.dtype();
  const Device device = embed_->weight.device();

  if (const auto* t = dynamic_cast<const Transformer*>(&model)) {
    for (size_t i = 0; i < t->layers.size(); ++i) {
      layers_.push_back(std::make_unique<AttentionLayerState>(t->layers[i], c, int64_t(i), batch,
                                                              dtype, device));
    }
  } else if (const auto* g = dynamic_cast<const GDNModel*>(&model)) {
    for (size_t i = 0; i < g->layers.size(); ++i) {
      layers_.push_back(
          std::make_unique<GDNLayerState>(g->layers[i], c, int64_t(i), batch, dtype, device));
    }
  } else if (const auto* h = dynamic_cast<const GDNGSAModel*>(&model)) {
    for (size_t i = 0; i < h->gdn_layers.size(); ++i) {
      if (h->attention_layers[i]) {
        layers_.push_back(std::make_unique<AttentionLayerState>(h->attention_layers[i], c,
                                                                int64_t(i), batch, dtype, device));
      } else {
        layers_.push_back(std::make_unique<GDNLayerState>(h->gdn_layers[i], c, int64_t(i), batch,
                                                          dtype, device));
      }
    }
  } else if (const auto* m = dynamic_cast<const HAMModel*>(&model)) {
    for (size_t i = 0; i < m->layers.size(); ++i) {
      layers_.push_back(std::make_unique<HAMLayerState>(m->layers[i], c, int64_t(i), batch, dtype,
                                                        device, per_layer[i]));
    }
    pass_score_ = c.eda;
  } else {
    HAM_FAIL("Decoder: no decoding for model family '", family_name(c.family), "'");
  }
}

Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

Tensor Decoder::feed(const Tensor& tokens) {
  HAM_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(0) == batch_ &&
                tokens.size(1) >= 1,
            "Decoder::feed: tokens must be [B, n] with B = ", batch_, " and n >= 1, got ",
            tokens.defined() ? shape_str(tokens.shape()) : "undefined");
  HAM_CHECK(tokens.dtype() == DType::I64 || tokens.dtype() == DType::I32,
            "Decoder::feed: tokens must be i64 or i32, got ", tokens.str());
  const int64_t n = tokens.size(1);
  std::vector<int64_t> ids = tokens.to_vector<int64_t>();
  for (size_t i = 0; i < ids.size(); ++i) {
    HAM_CHECK(ids[i] >= 0 && ids[i] < vocab_, "Decoder::feed: token ", ids[i], " at [",
              int64_t(i) / n, ", ", int64_t(i) % n, "] is outside the vocabulary [0, ", vocab_, ")");
  }
  NoGradGuard no_grad;
  const Device device = embed_->weight.device();
  Tensor positions = position_ids(batch_, n, position_, device);
  Tensor x = embed_->forward(tokens.to(device));
  Tensor score;  // EDA: the previous HAM layer's score
  for (auto& layer : layers_) {
    LayerState::Output out = layer->step(x, positions, pass_score_ ? score : Tensor());
    x = out.x;
    score = out.score;
  }
  position_ += n;
  return lm_head_->forward(final_norm_->forward(x));
}

Tensor Decoder::feed(const std::vector<std::vector<int64_t>>& tokens) {
  HAM_CHECK(int64_t(tokens.size()) == batch_, "Decoder::feed: ", tokens.size(),
            " rows of tokens for a batch of ", batch_);
  std::vector<int64_t> flat;
  for (const auto& row : tokens) {
    HAM_CHECK(row.size() == tokens[0].size(), "Decoder::feed: rows of ", tokens[0].size(), " and ",
              row.size(), " tokens; every row needs the same number");
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return feed(Tensor::from_vector(flat, {batch_, int64_t(tokens[0].size())}));
}

std::vector<int64_t> Decoder::kv_cache_tokens(int64_t layer) const {
  HAM_CHECK(layer >= 0 && layer < num_layers(), "Decoder::kv_cache_tokens: layer ", layer,
            " outside 0..", num_layers() - 1);
  return layers_[size_t(layer)]->kv_tokens();
}

std::vector<LayerCacheStats> Decoder::layer_stats() const {
  std::vector<LayerCacheStats> out;
  for (const auto& layer : layers_) out.push_back(layer->stats());
  return out;
}

CacheBytes Decoder::cache_bytes() const {
  CacheBytes total;
  for (const auto& layer : layers_) {
    LayerCacheStats s = layer->stats();
    total.kv += s.kv_bytes;
    total.recurrent += s.recurrent_bytes;
    total.conv += s.conv_bytes;
  }
  return total;
}

Tensor Decoder::last_scores(int64_t layer) const {
  HAM_CHECK(layer >= 0 && layer < num_layers(), "Decoder::last_scores: layer ", layer,
            " outside 0..", num_layers() - 1);
  return layers_[size_t(layer)]->last_scores();
}

}  // namespace ham

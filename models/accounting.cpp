#include "models/accounting.h"

#include <algorithm>
#include <cstdint>
#include <regex>
#include <string>

#include "models/language_model.h"

namespace ham {

// ---- Grouping parameter names ----------------------------------------------------------

const char* parameter_part_name(ParameterPart part) {
  switch (part) {
    case ParameterPart::Embedding: return "embedding";
    case ParameterPart::LmHead: return "lm_head";
    case ParameterPart::FinalNorm: return "final norm";
    case ParameterPart::MixerNorm: return "pre-norm";
    case ParameterPart::Projections: return "q, k, v projections";
    case ParameterPart::OutputProjection: return "output projection";
    case ParameterPart::RnnScalars: return "RNN scalars (a, b, A_log, dt_bias)";
    case ParameterPart::Convs: return "short convolutions";
    case ParameterPart::Norms: return "norms";
    case ParameterPart::Gates: return "gates";
    case ParameterPart::Router: return "router";
    case ParameterPart::Thresholds: return "thresholds (learned tau)";
    case ParameterPart::Eda: return "EDA gamma";
    case ParameterPart::MixerOther: return "other (in the mixer)";
    case ParameterPart::FfnNorm: return "FFN pre-norm";
    case ParameterPart::Ffn: return "FFN (SwiGLU)";
    case ParameterPart::LayerOther: return "other (in the layer)";
    case ParameterPart::Other: return "other";
  }
  return "unknown";
}

bool is_mixer_part(ParameterPart part) {
  return part >= ParameterPart::MixerNorm && part <= ParameterPart::MixerOther;
}

namespace {

struct NameRule {
  std::regex pattern;
  ParameterPart part;
};

// Model-level names (matched against the whole name).
const std::vector<NameRule>& model_rules() {
  static const std::vector<NameRule> rules = {
      {std::regex(R"(^(embed|embedding|tok_embeddings|wte)\.)"), ParameterPart::Embedding},
      {std::regex(R"(^(lm_head|output)\.)"), ParameterPart::LmHead},
      {std::regex(R"(^(final_norm|norm_f|ln_f)\.)"), ParameterPart::FinalNorm},
  };
  return rules;
}

// Inside "layers.<i>.": the two pre-norms and the FFN; the mixer is refined below.
const std::vector<NameRule>& layer_rules() {
  static const std::vector<NameRule> rules = {
      {std::regex(R"(^(attn_norm|mixer_norm|input_norm|pre_norm)\.)"), ParameterPart::MixerNorm},
      {std::regex(R"(^(mlp_norm|ffn_norm|post_attention_norm)\.)"), ParameterPart::FfnNorm},
      {std::regex(R"(^(mlp|ffn|feed_forward)\.)"), ParameterPart::Ffn},
  };
  return rules;
}
const std::regex& mixer_prefix() {
  static const std::regex prefix(R"(^(attn|mixer|attention|self_attn)\.(.+)$)");
  return prefix;
}

// Inside a mixer, first match wins (thresholds before norms, "gate" before "norm", ...).
const std::vector<NameRule>& mixer_rules() {
  static const std::string start = R"((^|[._]))", end = R"(([._]|$))";
  static const std::vector<NameRule> rules = {
      {std::regex(start + "(p_tau|tau|threshold)" + end), ParameterPart::Thresholds},
      {std::regex(start + "router" + end), ParameterPart::Router},
      {std::regex(start + "(eda|gamma|gamma_logit)" + end), ParameterPart::Eda},
      {std::regex(start + "(a_proj|b_proj|A_log|dt_bias)" + end), ParameterPart::RnnScalars},
      {std::regex("conv"), ParameterPart::Convs},
      {std::regex(start + "(o_proj|out_proj)" + end), ParameterPart::OutputProjection},
      {std::regex(start + "(gate|gate_proj|g_proj|rnn_gate|kv_gate)" + end), ParameterPart::Gates},
      {std::regex("norm"), ParameterPart::Norms},
      {std::regex(start + "(q_proj|k_proj|v_proj|qkv_proj|qkv)" + end), ParameterPart::Projections},
  };
  return rules;
}

std::pair<bool, ParameterPart> first_match(const std::vector<NameRule>& rules, const std::string& s) {
  for (const auto& rule : rules) {
    if (std::regex_search(s, rule.pattern)) return {true, rule.part};
  }
  return {false, ParameterPart::Other};
}

void add_to(PartCount& part, const std::string& name, int64_t count) {
  part.count += count;
  part.names.push_back(name);
}

}  // namespace

ParameterClass classify_parameter(const std::string& name) {
  if (auto [found, part] = first_match(model_rules(), name); found) return {part, -1};
  static const std::regex layer_name(R"(^layers\.(\d+)\.(.+)$)");
  std::smatch m;
  if (!std::regex_match(name, m, layer_name)) return {ParameterPart::Other, -1};
  int64_t layer = std::stoll(m[1].str());
  std::string rest = m[2].str();
  if (auto [found, part] = first_match(layer_rules(), rest); found) return {part, layer};
  std::smatch mixer;
  if (std::regex_match(rest, mixer, mixer_prefix())) {
    auto [found, part] = first_match(mixer_rules(), mixer[2].str());
    return {found ? part : ParameterPart::MixerOther, layer};
  }
  return {ParameterPart::LayerOther, layer};
}

int64_t LayerParameterCount::count(ParameterPart part) const {
  for (const auto& p : parts) {
    if (p.part == part) return p.count;
  }
  return 0;
}

int64_t LayerParameterCount::mixer() const {
  int64_t n = 0;
  for (const auto& p : parts) n += is_mixer_part(p.part) ? p.count : 0;
  return n;
}

int64_t LayerParameterCount::ffn() const {
  return count(ParameterPart::FfnNorm) + count(ParameterPart::Ffn);
}

int64_t LayerParameterCount::total() const {
  int64_t n = 0;
  for (const auto& p : parts) n += p.count;
  return n;
}

ParameterBreakdown count_parameters(const std::vector<std::pair<std::string, Tensor>>& named) {
  ParameterBreakdown b;
  b.other.part = ParameterPart::Other;
  for (const auto& [name, tensor] : named) {
    int64_t n = tensor.numel();
    b.total += n;
    ParameterClass where = classify_parameter(name);
    if (where.layer < 0) {
      switch (where.part) {
        case ParameterPart::Embedding: b.embedding += n; break;
        case ParameterPart::LmHead: b.lm_head += n; break;
        case ParameterPart::FinalNorm: b.final_norm += n; break;
        default: add_to(b.other, name, n); break;
      }
      continue;
    }
    while (int64_t(b.layers.size()) <= where.layer) {
      b.layers.push_back(LayerParameterCount{int64_t(b.layers.size()), {}});
    }
    auto& parts = b.layers[size_t(where.layer)].parts;
    auto it = std::find_if(parts.begin(), parts.end(),
                           [&](const PartCount& p) { return p.part == where.part; });
    if (it == parts.end()) {
      // Keep ParameterPart order so every layer prints its groups in the same order.
      auto pos = std::find_if(parts.begin(), parts.end(),
                              [&](const PartCount& p) { return p.part > where.part; });
      it = parts.insert(pos, PartCount{where.part, 0, {}});
    }
    add_to(*it, name, n);
  }
  return b;
}

ParameterBreakdown count_parameters(const LanguageModel& model) {
  auto named = model.named_parameters();
  for (const auto& [name, value] : model.training_state()) {
    if (classify_parameter(name).part == ParameterPart::Thresholds) named.emplace_back(name, value);
  }
  return count_parameters(named);
}

// ---- The appendix tables ---------------------------------------------------------------

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::Attention: return "attention";
    case LayerKind::GDN: return "GDN";
    case LayerKind::HAM: return "HAM";
  }
  return "unknown";
}

LayerKind layer_kind(const ModelConfig& c, int64_t layer) {
  switch (c.family) {
    case ModelFamily::Transformer: return LayerKind::Attention;
    case ModelFamily::GDN: return LayerKind::GDN;
    case ModelFamily::GDNGSA: return c.is_attention_layer(layer) ? LayerKind::Attention : LayerKind::GDN;
    case ModelFamily::HAM: return LayerKind::HAM;
  }
  return LayerKind::Attention;
}

namespace {

// The dimensions the tables are written in, read from the config.
struct AttentionDims {
  int64_t d, q, k, v, o, heads;  // d_hidden; widths of W_Q, W_K, W_V outputs; W_O input
};
AttentionDims attention_dims(const ModelConfig& c) {
  // The paper's Transformer has d_Q = d_O = d_hidden and d_K = d_V = d_KV; with grouped
  // heads K and V shrink to n_kv_heads heads.
  return {c.d_model, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
          c.n_kv_heads * c.v_head_dim, c.n_heads * c.v_head_dim, c.n_heads};
}

struct RecurrentDims {
  int64_t d, qk, v, heads, v_head, conv;  // d_hidden, d_QK, d_V, h_RNN, d_RNN-V-head, d_conv
};
RecurrentDims recurrent_dims(const ModelConfig& c) {
  return {c.d_model, c.gdn_qk_dim(), c.gdn_v_dim(), c.gdn_heads, c.gdn_v_head_dim, c.conv_size};
}

bool has_learned_router(const ModelConfig& c) { return c.router != RouterKind::FitError; }

std::vector<ParameterRow> attention_parameter_rows(const ModelConfig& c) {
  auto a = attention_dims(c);
  std::vector<ParameterRow> rows = {{"Pre-norm", a.d},
                                    {"W_Q", a.d * a.q},
                                    {"W_K", a.d * a.k},
                                    {"W_V", a.d * a.v},
                                    {"W_O", a.o * a.d}};
  // Not in the paper's Transformer: the attn_conv_size ablation's q/k/v convs.
  if (c.attn_conv_size > 0) rows.push_back({"W_Q^conv, W_K^conv, W_V^conv", (a.q + a.k + a.v) * c.attn_conv_size});
  return rows;
}

std::vector<ParameterRow> gdn_parameter_rows(const ModelConfig& c) {
  auto r = recurrent_dims(c);
  return {{"Pre-norm", r.d},
          {"W_Q, W_K", 2 * r.d * r.qk},
          {"W_V", r.d * r.v},
          {"a, b projections", 2 * r.d * r.heads},
          {"A_log", r.heads},
          {"dt bias", r.heads},
          {"W_Q^conv, W_K^conv", 2 * r.qk * r.conv},
          {"W_V^conv", r.v * r.conv},
          {"Gate projection", r.d * r.v},
          {"Output norm", r.v_head},
          {"W_O", r.v * r.d}};
}

std::vector<ParameterRow> ham_parameter_rows(const ModelConfig& c, int64_t layer) {
  auto r = recurrent_dims(c);
  int64_t kv_heads = c.n_heads, kv_v_head = c.v_head_dim;
  std::vector<ParameterRow> rows = {
      {"Pre-norm", r.d},
      {"W_Q, W_K (shared)", 2 * r.d * r.qk},
      {"W_V (shared)", r.d * r.v},
      {"RNN RMS norms", 2 * r.qk + r.v},
      {"KV RMS norms", 2 * r.qk + r.v},
      {"a, b projections", 2 * r.d * r.heads},
      {"A_log", r.heads},
      {"dt bias", r.heads},
      {"W_RNN-Q^conv, W_RNN-K^conv", 2 * r.qk * r.conv},
      {"W_RNN-V^conv", r.v * r.conv},
      {"W_KV-Q^conv, W_K^conv", 2 * r.qk * r.conv},
      {"W_V^conv", r.v * r.conv},
  };
  if (c.learn_tau) rows.push_back({"tau_l (learnable threshold)", 1});
  if (c.router == RouterKind::InputShallow) rows.push_back({"W_router (learnable router)", r.d});
  if (c.router == RouterKind::InputDeep) {
    // Not in the table: the 3-layer MLP d -> h -> h -> 1 without biases (models/router.h).
    int64_t h = c.router_hidden;
    rows.push_back({"deep router MLP d h + h^2 + h", r.d * h + h * h + h, true});
  }
  if (has_learned_router(c) && c.eda && layer > 0) {
    rows.push_back({"EDA gamma_l", 1, true});  // not in the table; layer 0 has no previous score
  }
  rows.insert(rows.end(), {{"RNN norm", r.v_head},
                           {"RNN norm gate", r.d * r.v},
                           {"KV norm", kv_v_head},
                           {"Per-head RNN gate", r.d * r.heads},
                           {"Per-head KV gate", r.d * kv_heads},
                           {"Output projection", r.v * r.d}});
  return rows;
}

double sum_rows(const std::vector<FlopsRow>& rows) {
  double s = 0;
  for (const auto& row : rows) s += row.per_token;
  return s;
}

int64_t sum_counts(const std::vector<ParameterRow>& rows) {
  int64_t s = 0;
  for (const auto& row : rows) s += row.count;
  return s;
}

}  // namespace

std::vector<ParameterRow> mixer_parameter_rows(const ModelConfig& c, int64_t layer) {
  switch (layer_kind(c, layer)) {
    case LayerKind::Attention: return attention_parameter_rows(c);
    case LayerKind::GDN: return gdn_parameter_rows(c);
    case LayerKind::HAM: return ham_parameter_rows(c, layer);
  }
  return {};
}

int64_t mixer_parameter_count(const ModelConfig& c, int64_t layer) {
  return sum_counts(mixer_parameter_rows(c, layer));
}

std::vector<ParameterRow> ffn_parameter_rows(const ModelConfig& c) {
  int64_t d = c.d_model, d_int = c.d_ff;
  return {{"Pre-norm", d},
          {"Gate projection (W_gate)", d * d_int},
          {"Up projection (W_up)", d * d_int},
          {"Down projection (W_down)", d_int * d}};
}

int64_t ffn_parameter_count(const ModelConfig& c) { return sum_counts(ffn_parameter_rows(c)); }

std::vector<ParameterRow> model_parameter_rows(const ModelConfig& c) {
  int64_t d = c.d_model, V = c.vocab_size;
  return {{"Embedding", V * d}, {"Output head (untied)", V * d}, {"Final norm", d}};
}

int64_t formula_parameter_count(const ModelConfig& c) {
  int64_t n = sum_counts(model_parameter_rows(c));
  int64_t ffn = ffn_parameter_count(c);
  for (int64_t layer = 0; layer < c.n_layers; ++layer) n += mixer_parameter_count(c, layer) + ffn;
  return n;
}

// ---- FLOPs: each table's entries for T tokens, divided by T --------------------------

namespace {

std::vector<FlopsRow> attention_flops_rows(const ModelConfig& c, SequenceShape s) {
  auto a = attention_dims(c);
  double d = double(a.d), T = s.seq_len;  // causal attention over every token
  std::vector<FlopsRow> rows = {{"Pre-norm", 4 * d},
                                {"W_Q", 2 * d * double(a.q)},
                                {"W_K", 2 * d * double(a.k)},
                                {"W_V", 2 * d * double(a.v)},
                                {"RoPE on Q", 6 * double(a.q)},
                                {"RoPE on K", 6 * double(a.k)},
                                {"QK^T (causal)", T * double(a.q)},             // T^2 d_hidden
                                {"Softmax (causal)", 2 * T * double(a.heads)},  // 2 T^2 h
                                {"Attn V (causal)", T * double(a.o)},           // T^2 d_hidden
                                {"W_O", 2 * double(a.o) * d}};
  if (c.attn_conv_size > 0) {
    // As the GDN table counts its convs: per channel 2 per tap and 3 for the SiLU.
    rows.push_back({"Q, K, V conv", double(a.q + a.k + a.v) * (2 * double(c.attn_conv_size) + 3)});
  }
  return rows;
}

// tab:flops_rnn's rows (shared by tab:flops_gdn's "RNN scalars" and "Chunked delta rule").
std::vector<FlopsRow> rnn_flops_rows(const RecurrentDims& r) {
  double d = double(r.d), h = double(r.heads), qk = double(r.qk), v = double(r.v);
  double vh = double(r.v_head), C = double(kFlopsChunkSize);
  return {{"beta (from b proj)", 3 * d * h},
          {"g (from a proj & A_log)", 5 * d * h},
          {"g cumsum", h},
          {"Compute A", C * (2 * qk + 3.5 * h)},        // (T/C) C^2 (2 d_QK + 3.5 h)
          {"Invert A", h * C * C / 2},                  // (T/C) h C^3 / 2
          {"Recompute w, u", 2 * C * (qk + v)},         // 2 (T/C) C^2 (d_QK + d_V)
          {"Gated delta rule", 4 * qk * vh},
          {"Output", 2 * (qk * vh + C * (qk + v))}};
}

std::vector<FlopsRow> gdn_flops_rows(const ModelConfig& c) {
  auto r = recurrent_dims(c);
  double d = double(r.d), qk = double(r.qk), v = double(r.v), conv = double(r.conv);
  std::vector<FlopsRow> rows = {{"Pre-norm", 4 * d},
                                {"W_Q, W_K", 4 * d * qk},
                                {"W_V", 2 * d * v},
                                {"Q, K, V norms", 4 * (2 * qk + v)},
                                {"Q, K, V conv", (2 * qk + v) * (2 * conv + 3)}};
  auto rnn = rnn_flops_rows(r);
  rows.insert(rows.end(), rnn.begin(), rnn.end());
  rows.insert(rows.end(), {{"Pre-gate norm", 4 * d},
                           {"Gate projection", 2 * d * v},
                           {"SiLU activation", 3 * v},
                           {"Fused norm + gate", 5 * v},
                           {"Output projection", 2 * v * d},
                           {"Final norm", 4 * d}});
  return rows;
}

std::vector<FlopsRow> ham_flops_rows(const ModelConfig& c, SequenceShape s) {
  auto r = recurrent_dims(c);
  double d = double(r.d), qk = double(r.qk), v = double(r.v), conv = double(r.conv);
  double kv_heads = double(c.n_heads), T_kv = s.kv_len;
  std::vector<FlopsRow> rows = {{"Pre-norm", 4 * d},
                                {"W_Q, W_K (shared)", 4 * d * qk},
                                {"W_V (shared)", 2 * d * v},
                                {"RNN Q, K, V norms", 4 * (2 * qk + v)},
                                {"KV Q, K, V norms", 4 * (2 * qk + v)},
                                {"RNN Q, K, V conv", (2 * qk + v) * (2 * conv + 3)},
                                {"KV Q, K, V conv", (2 * qk + v) * (2 * conv + 3)}};
  switch (c.router) {
    case RouterKind::FitError: rows.push_back({"KV token selection via RNN state", 12 * d}); break;
    case RouterKind::InputShallow: rows.push_back({"KV token selection via input", 2 * d}); break;
    case RouterKind::InputDeep: {
      // Not in the table: the deep router's three matmuls (activations not counted, as the
      // table counts none for the shallow router's sigmoid).
      double h = double(c.router_hidden);
      rows.push_back({"KV token selection via deep router 2 (d h + h^2 + h)",
                      2 * (d * h + h * h + h), true});
      break;
    }
  }
  auto rnn = rnn_flops_rows(r);
  rows.insert(rows.end(), rnn.begin(), rnn.end());
  rows.insert(rows.end(), {{"RoPE on Q, K", 4 * qk},
                           {"QK^T (causal)", T_kv * qk},
                           {"Softmax (causal)", 2 * T_kv * kv_heads},
                           {"Attn V (causal)", T_kv * v},
                           {"RNN norm", 4 * double(r.v_head)},
                           {"RNN norm gate", 2 * d * v + v},
                           {"KV norm", 4 * double(c.v_head_dim)},
                           {"Per-head RNN gate", 2 * d * double(r.heads) + v},
                           {"Per-head KV gate", 2 * d * kv_heads + v},
                           {"Output projection", 2 * v * d}});
  return rows;
}

}  // namespace

std::vector<FlopsRow> mixer_flops_rows(const ModelConfig& c, int64_t layer, SequenceShape shape) {
  switch (layer_kind(c, layer)) {
    case LayerKind::Attention: return attention_flops_rows(c, shape);
    case LayerKind::GDN: return gdn_flops_rows(c);
    case LayerKind::HAM: return ham_flops_rows(c, shape);
  }
  return {};
}

double mixer_flops_per_token(const ModelConfig& c, int64_t layer, SequenceShape shape) {
  return sum_rows(mixer_flops_rows(c, layer, shape));
}

std::vector<FlopsRow> ffn_flops_rows(const ModelConfig& c) {
  double d = double(c.d_model), d_int = double(c.d_ff);
  return {{"Gate projection (W_gate)", 2 * d * d_int},
          {"Up projection (W_up)", 2 * d * d_int},
          {"SiLU activation", 3 * d_int},
          {"Gate * Up", d_int},
          {"Down projection (W_down)", 2 * d_int * d}};
}

double ffn_flops_per_token(const ModelConfig& c) { return sum_rows(ffn_flops_rows(c)); }

std::vector<FlopsRow> model_flops_rows(const ModelConfig& c) {
  double d = double(c.d_model), V = double(c.vocab_size);
  return {{"Embedding and output head (4 T V d)", 4 * V * d}, {"Final norm", 4 * d}};
}

double forward_flops_per_token(const ModelConfig& c, SequenceShape shape) {
  double f = sum_rows(model_flops_rows(c));
  double ffn = ffn_flops_per_token(c);
  for (int64_t layer = 0; layer < c.n_layers; ++layer) f += mixer_flops_per_token(c, layer, shape) + ffn;
  return f;
}

ForwardMemory forward_memory_bytes(const ModelConfig& c, SequenceShape shape) {
  constexpr double kBf16Bytes = 2;
  ForwardMemory m;
  m.weights = kBf16Bytes * double(formula_parameter_count(c));
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    LayerKind kind = layer_kind(c, layer);
    if (kind != LayerKind::Attention) {
      // The GDN state: h_RNN heads of [K x V] = d_QK d_RNN-V-head numbers.
      m.rnn_state += kBf16Bytes * double(c.gdn_qk_dim()) * double(c.gdn_v_head_dim);
    }
    if (kind == LayerKind::HAM) {
      m.kv_cache += kBf16Bytes * shape.kv_len * double(c.gdn_qk_dim() + c.gdn_v_dim());
    } else if (kind == LayerKind::Attention) {
      auto a = attention_dims(c);
      m.kv_cache += kBf16Bytes * shape.seq_len * double(a.k + a.v);
    }
  }
  return m;
}

double training_flops(double forward_flops_per_token, double tokens) {
  return 3.0 * forward_flops_per_token * tokens;
}

// ---- The paper's closed forms ---------------------------------------------------------

namespace {

// Empty when the config has the relations of tab:arch_relations, else the first that fails.
std::string recurrent_relations_fail(const ModelConfig& c) {
  int64_t d = c.d_model;
  if (7 * c.gdn_qk_dim() != 5 * d) return "d_QK = gdn_heads x gdn_head_dim must be 5/7 d_model";
  if (14 * c.gdn_v_dim() != 15 * d) return "d_V = gdn_heads x gdn_v_head_dim must be 15/14 d_model";
  if (c.gdn_head_dim != 256) return "gdn_head_dim must be 256";
  if (c.gdn_v_head_dim != 384) return "gdn_v_head_dim must be 384";
  if (7 * c.d_ff != 10 * d) return "d_ff must be 10/7 d_model";
  if (c.conv_size != 4) return "conv_size must be 4";
  return "";
}

std::string full_attention_relations_fail(const ModelConfig& c) {
  if (c.attn_conv_size != 0) return "the paper's attention has no q/k/v convs (attn_conv_size 0)";
  if (c.n_heads * c.head_dim != c.d_model) return "n_heads x head_dim must equal d_model";
  if (c.n_kv_heads != c.n_heads) return "n_kv_heads must equal n_heads";
  if (c.head_dim != 128) return "head_dim must be 128";
  if (c.v_head_dim != c.head_dim) return "v_head_dim must equal head_dim";
  return "";
}

std::string closed_form_fails(const ModelConfig& c) {
  std::string why;
  int64_t d = c.d_model, L = c.n_layers;
  switch (c.family) {
    case ModelFamily::Transformer:
      why = full_attention_relations_fail(c);
      if (why.empty() && 3 * c.d_ff != 4 * d) why = "d_ff must be 4/3 d_model";
      // Aspect ratio rho_TF = 1920 / 23: L = d / rho.
      if (why.empty() && 1920 * L != 23 * d) why = "n_layers must be d_model x 23 / 1920";
      break;
    case ModelFamily::GDN:
    case ModelFamily::GDNGSA:
    case ModelFamily::HAM:
      why = recurrent_relations_fail(c);
      if (why.empty() && c.family == ModelFamily::GDNGSA) {
        why = full_attention_relations_fail(c);
        if (why.empty() && c.n_layers % c.gsa_every != 0) why = "gsa_every must divide n_layers";
      }
      if (why.empty() && c.family == ModelFamily::HAM) {
        if (c.head_dim != 128) why = "head_dim must be 128";
        else if (c.v_head_dim != 192) why = "v_head_dim must be 192";
        else if (c.router != RouterKind::FitError) why = "the closed forms assume the cosine (fit_error) router";
        else if (c.learn_tau) why = "the closed forms assume a fixed tau";
      }
      // Aspect ratio rho = 1792 / 24: L = d / rho.
      if (why.empty() && 1792 * L != 24 * d) why = "n_layers must be d_model x 24 / 1792";
      break;
  }
  // The polynomials carry V = 32,000 in their constants (64001 = 2V + 1, 128004 = 4V + 4).
  if (why.empty() && c.vocab_size != 32000) why = "vocab_size must be 32000";
  return why;
}

}  // namespace

PaperClosedForm paper_closed_form(const ModelConfig& c, SequenceShape shape) {
  PaperClosedForm p;
  p.reason = closed_form_fails(c);
  if (!p.reason.empty()) return p;
  p.applies = true;
  // The tables' polynomials verbatim; FLOPs are divided by T (per token).
  const double d = double(c.d_model), d2 = d * d, d3 = d2 * d;
  const double T = shape.seq_len, T_kv = shape.kv_len, k = double(c.gsa_every);
  switch (c.family) {
    case ModelFamily::HAM:
      p.parameters = 48075.0 / 401408 * d3 + 72591.0 / 200704 * d2 + 448061.0 / 7 * d;
      p.flops_per_token = 375.0 / 1568 * d3 + 99417.0 / 3136 * d2 + 28713903.0 / 224 * d +
                          T_kv * (75.0 / 3136 * d2 + 15.0 / 56 * d);
      p.memory_bytes = 48075.0 / 200704 * d3 + 809871.0 / 100352 * d2 + 75.0 / 1568 * T_kv * d2 +
                       896122.0 / 7 * d;
      break;
    case ModelFamily::GDN:
      p.parameters = 375.0 / 3136 * d3 + 33.0 / 112 * d2 + 7168703.0 / 112 * d;
      p.flops_per_token = 12015.0 / 50176 * d3 + 4689327.0 / 401408 * d2 + 128004 * d;
      p.memory_bytes = 375.0 / 1568 * d3 + 3111.0 / 392 * d2 + 7168703.0 / 56 * d;
      break;
    case ModelFamily::Transformer:
      p.parameters = 23.0 / 240 * d3 + 23.0 / 960 * d2 + 64001 * d;
      p.flops_per_token = 23.0 / 120 * d3 + (23.0 / 90 + 989.0 / 40960 * T) * d2 + 128004 * d;
      p.memory_bytes = 23.0 / 120 * d3 + 23.0 / 480 * (1 + T) * d2 + 128002 * d;
      break;
    case ModelFamily::GDNGSA:
      p.parameters = (375 * k - 27) / (3136 * k) * d3 + (33 * k - 30) / (112 * k) * d2 +
                     (7168703 * k - 591) / (112 * k) * d;
      p.flops_per_token = (12015 * k - 879) / (50176 * k) * d3 +
                          (10836 * T + 4689327 * k - 4572591) / (401408 * k) * d2 + 128004 * d;
      p.memory_bytes = (375 * k - 27) / (1568 * k) * d3 +
                       (12444 * k - 12360 + 75 * T) / (1568 * k) * d2 +
                       (7168703 * k - 591) / (56 * k) * d;
      break;
  }
  return p;
}

}  // namespace ham

#pragma once
// Model accounting: a built model's parameters counted and grouped by component, next to
// the paper's appendix formulas for the same config (parameters per layer, forward FLOPs
// and memory as functions of T and T_KV, training FLOPs). `ham info` prints both.
//
// Two kinds of formula live here:
//   * table rows: every row of the appendix tables (tab:params_ham, _gdn, _transformer,
//     _ffn; tab:flops_rnn, _kv, _ham, _transformer, _gdn, _ffn; the forward-memory
//     definitions) evaluated from the config's own dimensions, so they hold for any
//     config. Their sums are the tables' "Layer Total" rows.
//   * the paper's closed forms: the polynomials in d of tab:params_scaling,
//     tab:flops_scaling and tab:memory_scaling, which assume tab:arch_relations and the
//     800M aspect ratios (L = d / rho). The training-FLOPs table uses these.
// They agree except where the paper's own simplifications depart from its rows:
//   * GDN FLOPs, two slips that add up: (1) tab:flops_gdn's Simplified row
//     T d (2085/224 d + 1560037/1792) is below the table's own Layer Total by 9717/7 d per
//     token (the d^2 terms agree); (2) tab:flops_scaling's GDN polynomial is below its own
//     first line (L [Simplified + FFN] + 4 V d + 4 d, L = 3d/224) by 3/56 d^2, i.e. 4 d per
//     layer. Per GDN layer and token the rows exceed the polynomial by 9745/7 d (2,494,720
//     at d = 1792). The training-FLOPs table (0.2467 GDN, 0.3429 GDN-GSA) follows the
//     polynomial; the rows give 0.2557 and 0.3474.
//   * GDN-GSA memory: the polynomial sizes the GSA layers' KV cache with HAM's widths
//     d_QK + d_V = 25/14 d, while its GSA layers have d_QK = d_V = d (as its parameter and
//     FLOPs formulas say): the rows give 2 (L/k) T (3/14 d) more bytes.
//   * HAM layer FLOPs: the Simplified row keeps h_RNN = 5, h_KV = 10 and the head dims as
//     constants; the polynomials hold at the paper's d = 1792 only (as do all of them,
//     through rho).
// At the paper's configs the rows and the polynomials agree exactly for every parameter
// count, for HAM and Transformer FLOPs, and for HAM, GDN and Transformer memory.
// Rows the appendix does not have (input_deep router, EDA's gamma) are marked
// `extension` and follow models/router.h.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/config.h"

namespace ham {

class LanguageModel;

// ---- Parameters counted from a built model -------------------------------------------

// Where a parameter belongs: model-level parts, a layer's two pre-norms and FFN, and the
// mixer's finer groups (the sections of the appendix tables).
enum class ParameterPart {
  Embedding,
  LmHead,
  FinalNorm,
  MixerNorm,         // the layer's pre-norm before the mixer
  Projections,       // q, k, v projections
  OutputProjection,  // o projection
  RnnScalars,        // a, b projections, A_log, dt_bias
  Convs,             // short convolutions
  Norms,             // q/k/v RMS norms and output norms inside the mixer
  Gates,             // output gate projection, per-head RNN/KV gates
  Router,            // learned router weights
  Thresholds,        // learned tau (p_tau)
  Eda,               // EDA's gamma
  MixerOther,        // inside a mixer, matched by no finer rule
  FfnNorm,           // the layer's pre-norm before the FFN
  Ffn,               // SwiGLU weights
  LayerOther,        // inside a layer, outside any known sub-module
  Other,             // matched by no rule at all
};
const char* parameter_part_name(ParameterPart part);
// Whether the part belongs to the mixer's Layer Total (MixerNorm .. MixerOther).
bool is_mixer_part(ParameterPart part);

// The rule table's verdict for one dotted name. layer is -1 outside "layers.<i>.".
struct ParameterClass {
  ParameterPart part = ParameterPart::Other;
  int64_t layer = -1;
};
ParameterClass classify_parameter(const std::string& name);

struct PartCount {
  ParameterPart part = ParameterPart::Other;
  int64_t count = 0;
  std::vector<std::string> names;
};

struct LayerParameterCount {
  int64_t layer = 0;
  std::vector<PartCount> parts;  // ParameterPart order, parts with parameters only
  int64_t mixer() const;         // pre-norm + mixer: the appendix "Layer Total"
  int64_t ffn() const;           // FFN pre-norm + FFN: the appendix "FFN Total"
  int64_t total() const;
  int64_t count(ParameterPart part) const;
};

struct ParameterBreakdown {
  int64_t total = 0;
  int64_t embedding = 0, lm_head = 0, final_norm = 0;
  std::vector<LayerParameterCount> layers;  // indexed by layer
  PartCount other;                          // names no rule placed (shown, never dropped)
};

// Groups (name, tensor) pairs by the rule table; counts are numel.
ParameterBreakdown count_parameters(const std::vector<std::pair<std::string, Tensor>>& named);
// A model's parameters plus its learned thresholds: HAM keeps p_tau outside the module
// parameters (models/threshold.h) but the paper's table counts it; it is reached through
// training_state(), whose "...p_tau" entries are added as Thresholds.
ParameterBreakdown count_parameters(const LanguageModel& model);

// ---- The appendix tables, row by row ---------------------------------------------------

// The sequence mixer of a layer: softmax attention (Transformer, GDN-GSA's GSA layers),
// Gated DeltaNet, or HAM.
enum class LayerKind { Attention, GDN, HAM };
const char* layer_kind_name(LayerKind kind);  // "attention", "GDN", "HAM"
LayerKind layer_kind(const ModelConfig& c, int64_t layer);

struct ParameterRow {
  std::string source;  // the table's "Source of weights" cell
  int64_t count = 0;
  bool extension = false;  // not a row of the appendix (see the top of this file)
};

// tab:params_transformer / _gdn / _ham for layer `layer` (pre-norm included): the rows sum
// to the table's Layer Total (plus extension rows).
std::vector<ParameterRow> mixer_parameter_rows(const ModelConfig& c, int64_t layer);
int64_t mixer_parameter_count(const ModelConfig& c, int64_t layer);
// tab:params_ffn: d + 3 d d_int.
std::vector<ParameterRow> ffn_parameter_rows(const ModelConfig& c);
int64_t ffn_parameter_count(const ModelConfig& c);
// Untied embedding and output head and the final norm: (2V + 1) d.
std::vector<ParameterRow> model_parameter_rows(const ModelConfig& c);
// The whole model: sum over layers of (Layer Total + FFN Total) + (2V + 1) d.
int64_t formula_parameter_count(const ModelConfig& c);

// Sequence length T and the HAM layers' KV cache length T_KV (= rho T). Attention layers
// (Transformer, GSA) always attend over all T tokens.
struct SequenceShape {
  double seq_len = 16384;
  double kv_len = 8192;
  static SequenceShape with_kv_fraction(double seq_len, double kv_fraction) {
    return {seq_len, kv_fraction * seq_len};
  }
};

// Chunk size C of the chunked delta rule in tab:flops_rnn / tab:flops_gdn.
inline constexpr int64_t kFlopsChunkSize = 64;

struct FlopsRow {
  std::string operation;   // the table's "Operation" cell
  double per_token = 0;    // the table's entry for T tokens, divided by T
  bool extension = false;  // not a row of the appendix
};

// tab:flops_transformer / tab:flops_gdn / tab:flops_ham (with tab:flops_rnn and
// tab:flops_kv inlined) for layer `layer`, per token of a T-token forward pass.
std::vector<FlopsRow> mixer_flops_rows(const ModelConfig& c, int64_t layer, SequenceShape shape);
double mixer_flops_per_token(const ModelConfig& c, int64_t layer, SequenceShape shape);
// tab:flops_ffn: d_int (6 d + 4) per token (the FFN pre-norm is not in the table).
std::vector<FlopsRow> ffn_flops_rows(const ModelConfig& c);
double ffn_flops_per_token(const ModelConfig& c);
// The model-level terms of the appendix's totals: 4 V d (embedding and output head) and
// 4 d (final norm) per token.
std::vector<FlopsRow> model_flops_rows(const ModelConfig& c);
// F(T) / T summed over every row of every layer.
double forward_flops_per_token(const ModelConfig& c, SequenceShape shape);

// The appendix's forward memory in bf16 (2 bytes per number): the weights 2 P, each RNN
// layer's state 2 d_QK d_RNN-V-head, each KV cache 2 T_KV (d_K + d_V). Convolution states
// and activations are not counted (as in the appendix).
struct ForwardMemory {
  double weights = 0, rnn_state = 0, kv_cache = 0;
  double total() const { return weights + rnn_state + kv_cache; }
};
ForwardMemory forward_memory_bytes(const ModelConfig& c, SequenceShape shape);

// ---- Training FLOPs -------------------------------------------------------------------

// The appendix's heuristic: training FLOPs ~= 3 x forward FLOPs, over `tokens` tokens.
double training_flops(double forward_flops_per_token, double tokens);
// The paper's runs: T = 16384 per rank per step, 32 ranks, 95,367 steps (~50B tokens).
inline constexpr double kPaperSeqLen = 16384;
inline constexpr double kPaperTrainingTokens = 32.0 * 16384.0 * 95367.0;

// ---- The paper's closed forms in d ----------------------------------------------------

// tab:params_scaling, tab:flops_scaling (divided by T) and tab:memory_scaling, verbatim.
// They hold only for configs on the paper's family: tab:arch_relations, n_layers = d / rho
// (rho = 1792/24, or 1920/23 for the Transformer), V = 32,000, HAM with the cosine router
// and a fixed tau, gsa_every dividing n_layers. Otherwise `applies` is false and `reason`
// names the first relation that fails.
struct PaperClosedForm {
  bool applies = false;
  std::string reason;
  double parameters = 0;
  double flops_per_token = 0;
  double memory_bytes = 0;
};
PaperClosedForm paper_closed_form(const ModelConfig& c, SequenceShape shape);

}  // namespace ham

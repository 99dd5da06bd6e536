#pragma once
// What a model's HAM and GDN layers do along a sequence (the paper's "Analysis of the
// internals of HAM"), read from each layer's trace of a forward pass:
//
//   HAM layers:  routing score e_t, selection m_t = [e_t >= tau] and the KV-cache size
//                T_KV(t) = sum_{i <= t} m_i;
//   HAM and GDN: per RNN head h the fit error e_t^(h) = 1 - cos(S_{t-1} k_t, v_t) and the
//                gate alpha_t = exp(g_t) of S_t = alpha_t S_{t-1}(I - beta k k^T) + beta v k^T,
//                with the resets alpha_t < 0.05 where S_t is effectively wiped.
//
// A GDN layer has no router; its "score" is what HAM's fit-error router would compute,
// min_h e_t^(h), and it selects nothing. Averages over many sequences give, per layer, the
// mean score and mean T_KV(t) against position, every head's reset rate, and, for marked
// needle tokens, the mean score on the needle against the haystack.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "models/language_model.h"
#include "train/synthetic.h"

namespace ham {

inline constexpr double kResetThreshold = 0.05;  // alpha_t below this counts as a reset

enum class AnalyzedLayerKind { HAM, GDN };
std::string_view analyzed_layer_kind_name(AnalyzedLayerKind kind);  // "ham", "gdn"

// One sequence to analyze, with optional marks.
struct AnalysisInput {
  std::vector<int64_t> tokens;
  std::vector<TokenSpan> needle;    // tokens whose score is compared (a NIAH needle) ...
  std::vector<TokenSpan> haystack;  // ... with these (empty: every token outside `needle`)
  std::vector<TokenSpan> query;     // where the needle is asked for; drawn in plots only
};

// One layer along one sequence of T tokens.
struct LayerSequenceTrace {
  int64_t layer = 0;  // depth in the model
  AnalyzedLayerKind kind = AnalyzedLayerKind::HAM;
  double tau = std::numeric_limits<double>::quiet_NaN();  // HAM's threshold; NaN for GDN
  std::vector<double> score;                    // [T] e_t (GDN: min_h fit error)
  std::vector<uint8_t> selected;                // [T] m_t; empty for GDN
  std::vector<int64_t> kv_size;                 // [T] T_KV(t); empty for GDN
  std::vector<std::vector<double>> fit_error;   // [heads][T]
  std::vector<std::vector<double>> alpha;       // [heads][T] exp(g_t)
  std::vector<std::vector<int64_t>> resets;     // [heads] positions t with alpha_t < threshold
  int64_t heads() const { return int64_t(alpha.size()); }
};

struct SequenceAnalysis {
  AnalysisInput input;
  std::vector<LayerSequenceTrace> layers;  // the model's HAM / GDN layers, by depth
};

// T_KV(t) = m_0 + ... + m_t.
std::vector<int64_t> kv_cache_growth(const std::vector<uint8_t>& selected);
// alpha_t = exp(g_t), elementwise.
std::vector<double> gate_from_log_decay(const std::vector<double>& log_decay);
// The positions t with alpha[t] < threshold, in order.
std::vector<int64_t> reset_positions(const std::vector<double>& alpha,
                                     double threshold = kResetThreshold);

// Row `row` of a layer's trace tensors: score and select [B, T] (undefined for GDN: the
// score becomes min over heads of the fit error and nothing is selected), fit_error and
// log_decay [B, T, h]. Errors name the tensor and its shape.
LayerSequenceTrace layer_sequence_trace(int64_t layer, AnalyzedLayerKind kind, double tau,
                                        const Tensor& score, const Tensor& select,
                                        const Tensor& fit_error, const Tensor& log_decay,
                                        int64_t row, double reset_threshold = kResetThreshold);

// The traces of the model's last forward pass, row `row`: every HAM layer of a HAM model,
// every GDN layer of a GDN or GDN-GSA model. An error names the family when it has none.
std::vector<LayerSequenceTrace> last_forward_traces(const LanguageModel& model, int64_t row,
                                                    double reset_threshold = kResetThreshold);

// Runs `model` without gradients on each input alone (batch 1, positions 0 .. T - 1) and
// reads its traces. Errors name the input at fault: empty, a token outside the vocabulary,
// a span outside the sequence.
std::vector<SequenceAnalysis> analyze_sequences(const LanguageModel& model,
                                                const std::vector<AnalysisInput>& inputs,
                                                double reset_threshold = kResetThreshold);

// Mean score on needle tokens against haystack tokens; NaN means and ratio where a side
// has no tokens.
struct ScoreContrast {
  int64_t needle_tokens = 0, haystack_tokens = 0;
  double needle_sum = 0, haystack_sum = 0;
  double needle_mean() const;
  double haystack_mean() const;
  double ratio() const;  // needle_mean / haystack_mean
  void add(const ScoreContrast& other);
};
// Needle tokens: inside a `needle` span; haystack: inside a `haystack` span (every token
// when there is none) and outside every needle span. Spans must lie inside the score.
ScoreContrast score_contrast(const std::vector<double>& score, const std::vector<TokenSpan>& needle,
                             const std::vector<TokenSpan>& haystack);

// One layer averaged over sequences.
struct LayerSummary {
  int64_t layer = 0;
  AnalyzedLayerKind kind = AnalyzedLayerKind::HAM;
  double tau = std::numeric_limits<double>::quiet_NaN();
  int64_t sequences = 0, tokens = 0;
  double kv_fraction = std::numeric_limits<double>::quiet_NaN();  // selected / tokens (HAM)
  double mean_score = 0;
  ScoreContrast needle;  // summed over the sequences with a needle
  // The same over m_t (HAM): the fractions of needle and haystack tokens sent to the KV cache.
  ScoreContrast needle_selection;
  std::vector<int64_t> resets;          // [heads] over all sequences
  std::vector<double> reset_rate;       // [heads] resets / tokens
  std::vector<double> mean_alpha;       // [heads]
  std::vector<double> mean_fit_error;   // [heads]
  // Against position t, over the sequences that reach t:
  std::vector<int64_t> sequences_at;               // [T_max]
  std::vector<double> mean_score_at, std_score_at;  // [T_max]
  std::vector<double> mean_kv_at;                   // [T_max] mean T_KV(t) (HAM)
  std::vector<std::vector<double>> mean_alpha_at;   // [heads][T_max]
  // Against the offset from each needle's first token, offsets
  // -needle_window_before .. needle_window_after - 1 (empty without needles):
  std::vector<double> needle_aligned_score;
  std::vector<int64_t> needle_aligned_count;
};

struct SummaryOptions {
  int64_t needle_window_before = 64;
  int64_t needle_window_after = 128;
};

// Per layer, over every sequence (which must come from one model: the same layers).
std::vector<LayerSummary> summarize_layers(const std::vector<SequenceAnalysis>& sequences,
                                           const SummaryOptions& options = {});

}  // namespace ham

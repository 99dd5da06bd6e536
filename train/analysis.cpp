#include "train/analysis.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "models/gdn.h"
#include "models/ham.h"

namespace ham {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void check_spans(const std::vector<TokenSpan>& spans, int64_t length, const char* what,
                 size_t input) {
  for (size_t i = 0; i < spans.size(); ++i) {
    const TokenSpan& s = spans[i];
    HAM_CHECK(s.begin >= 0 && s.begin <= s.end && s.end <= length, "analyze: input ", input,
              ": ", what, " span ", i, " [", s.begin, ", ", s.end,
              ") does not lie inside its ", length, " tokens");
  }
}

bool in_any(const std::vector<TokenSpan>& spans, int64_t t) {
  for (const TokenSpan& s : spans) {
    if (s.contains(t)) return true;
  }
  return false;
}

}  // namespace

std::string_view analyzed_layer_kind_name(AnalyzedLayerKind kind) {
  return kind == AnalyzedLayerKind::HAM ? "ham" : "gdn";
}

std::vector<int64_t> kv_cache_growth(const std::vector<uint8_t>& selected) {
  std::vector<int64_t> out(selected.size());
  int64_t total = 0;
  for (size_t t = 0; t < selected.size(); ++t) out[t] = total += selected[t] ? 1 : 0;
  return out;
}

std::vector<double> gate_from_log_decay(const std::vector<double>& log_decay) {
  std::vector<double> out(log_decay.size());
  for (size_t t = 0; t < log_decay.size(); ++t) out[t] = std::exp(log_decay[t]);
  return out;
}

std::vector<int64_t> reset_positions(const std::vector<double>& alpha, double threshold) {
  std::vector<int64_t> out;
  for (size_t t = 0; t < alpha.size(); ++t) {
    if (alpha[t] < threshold) out.push_back(int64_t(t));
  }
  return out;
}

LayerSequenceTrace layer_sequence_trace(int64_t layer, AnalyzedLayerKind kind, double tau,
                                        const Tensor& score, const Tensor& select,
                                        const Tensor& fit_error, const Tensor& log_decay,
                                        int64_t row, double reset_threshold) {
  const std::string where = "layer " + std::to_string(layer) + " trace";
  HAM_CHECK(fit_error.defined() && fit_error.dim() == 3, where,
            ": fit_error must be [B, T, heads], got ",
            fit_error.defined() ? shape_str(fit_error.shape()) : std::string("nothing"));
  HAM_CHECK(log_decay.defined() && log_decay.shape() == fit_error.shape(), where,
            ": log_decay must have fit_error's shape ", shape_str(fit_error.shape()), ", got ",
            log_decay.defined() ? shape_str(log_decay.shape()) : std::string("nothing"));
  const int64_t B = fit_error.size(0), T = fit_error.size(1), H = fit_error.size(2);
  HAM_CHECK(row >= 0 && row < B, where, ": row ", row, " is outside the batch of ", B);
  LayerSequenceTrace out;
  out.layer = layer;
  out.kind = kind;
  out.tau = kind == AnalyzedLayerKind::HAM ? tau : kNaN;

  std::vector<double> errors = fit_error.to_vector<double>(), decay = log_decay.to_vector<double>();
  out.fit_error.assign(size_t(H), std::vector<double>(size_t(T)));
  out.alpha.assign(size_t(H), std::vector<double>(size_t(T)));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      size_t i = size_t((row * T + t) * H + h);
      out.fit_error[size_t(h)][size_t(t)] = errors[i];
      out.alpha[size_t(h)][size_t(t)] = std::exp(decay[i]);
    }
  }
  for (const auto& alpha : out.alpha) out.resets.push_back(reset_positions(alpha, reset_threshold));

  if (kind == AnalyzedLayerKind::HAM) {
    const Shape expected{B, T};
    HAM_CHECK(score.defined() && score.shape() == expected, where, ": score must be ",
              shape_str(expected), ", got ",
              score.defined() ? shape_str(score.shape()) : std::string("nothing"));
    HAM_CHECK(select.defined() && select.shape() == expected, where, ": select must be ",
              shape_str(expected), ", got ",
              select.defined() ? shape_str(select.shape()) : std::string("nothing"));
    std::vector<double> scores = score.to_vector<double>();
    std::vector<double> selection = select.to_vector<double>();
    out.score.assign(scores.begin() + row * T, scores.begin() + (row + 1) * T);
    for (int64_t t = 0; t < T; ++t) out.selected.push_back(selection[size_t(row * T + t)] != 0 ? 1 : 0);
    out.kv_size = kv_cache_growth(out.selected);
  } else {
    // What HAM's fit-error router would see: e_t = min_h e_t^(h).
    out.score.assign(size_t(T), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      double lowest = out.fit_error[0][size_t(t)];
      for (int64_t h = 1; h < H; ++h) lowest = std::min(lowest, out.fit_error[size_t(h)][size_t(t)]);
      out.score[size_t(t)] = lowest;
    }
  }
  return out;
}

namespace {

// fn(layer, mixer) for each GDN mixer of a GDN or GDN-GSA model (none for the others).
template <class Fn>
void for_each_gdn_mixer(const LanguageModel& model, Fn&& fn) {
  if (const auto* gdn_model = dynamic_cast<const GDNModel*>(&model)) {
    for (size_t i = 0; i < gdn_model->layers.size(); ++i) {
      fn(int64_t(i), *gdn_model->layers[i]->mixer);
    }
  } else if (const auto* hybrid = dynamic_cast<const GDNGSAModel*>(&model)) {
    for (size_t i = 0; i < hybrid->gdn_layers.size(); ++i) {
      if (hybrid->gdn_layers[i]) fn(int64_t(i), *hybrid->gdn_layers[i]->mixer);
    }
  }
}

}  // namespace

std::vector<LayerSequenceTrace> last_forward_traces(const LanguageModel& model, int64_t row,
                                                    double reset_threshold) {
  std::vector<LayerSequenceTrace> out;
  if (const auto* ham_model = dynamic_cast<const HAMModel*>(&model)) {
    for (size_t i = 0; i < ham_model->layers.size(); ++i) {
      const HAMLayer& mixer = *ham_model->layers[i]->mixer;
      const HAMLayerTrace& trace = mixer.last_trace();
      out.push_back(layer_sequence_trace(int64_t(i), AnalyzedLayerKind::HAM, mixer.threshold.tau(),
                                         trace.score, trace.select, trace.fit_error,
                                         trace.log_decay, row, reset_threshold));
    }
  }
  for_each_gdn_mixer(model, [&](int64_t layer, const GatedDeltaNet& mixer) {
    const GatedDeltaNet::Trace& trace = mixer.last_trace();
    HAM_CHECK(trace.fit_error.defined(), "analyze: GDN layer ", layer,
              " did not trace its fit error in the last forward (GatedDeltaNet::trace_fit_error "
              "was off)");
    out.push_back(layer_sequence_trace(layer, AnalyzedLayerKind::GDN, kNaN, Tensor(), Tensor(),
                                       trace.fit_error, trace.log_decay, row, reset_threshold));
  });
  HAM_CHECK(!out.empty(), "analyze: the ", family_name(model.config().family),
            " model has no HAM or GDN layers to analyze");
  return out;
}

std::vector<SequenceAnalysis> analyze_sequences(const LanguageModel& model,
                                                const std::vector<AnalysisInput>& inputs,
                                                double reset_threshold) {
  HAM_CHECK(!inputs.empty(), "analyze: no sequences to analyze");
  const int64_t vocab = model.config().vocab_size;
  std::vector<SequenceAnalysis> out;
  NoGradGuard no_grad;
  // The GDN layers' fit error for their traces, for these forwards only.
  std::vector<std::pair<const GatedDeltaNet*, bool>> tracing;
  for_each_gdn_mixer(model, [&](int64_t, const GatedDeltaNet& mixer) {
    tracing.emplace_back(&mixer, mixer.traces_fit_error());
    mixer.trace_fit_error(true);
  });
  struct Restore {
    std::vector<std::pair<const GatedDeltaNet*, bool>>& tracing;
    ~Restore() {
      for (const auto& [mixer, was] : tracing) mixer->trace_fit_error(was);
    }
  } restore{tracing};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const AnalysisInput& input = inputs[i];
    const int64_t T = int64_t(input.tokens.size());
    HAM_CHECK(T > 0, "analyze: input ", i, " has no tokens");
    for (int64_t t = 0; t < T; ++t) {
      int64_t id = input.tokens[size_t(t)];
      HAM_CHECK(id >= 0 && id < vocab, "analyze: input ", i, " token ", t, " is ", id,
                ", outside the model's vocabulary [0, ", vocab, ")");
    }
    check_spans(input.needle, T, "needle", i);
    check_spans(input.haystack, T, "haystack", i);
    check_spans(input.query, T, "query", i);
    TokenBatch batch{Tensor::from_vector(input.tokens, {1, T}), Tensor(), Tensor(), Tensor()};
    model.forward(batch);
    out.push_back({input, last_forward_traces(model, 0, reset_threshold)});
  }
  return out;
}

double ScoreContrast::needle_mean() const {
  return needle_tokens > 0 ? needle_sum / double(needle_tokens) : kNaN;
}
double ScoreContrast::haystack_mean() const {
  return haystack_tokens > 0 ? haystack_sum / double(haystack_tokens) : kNaN;
}
double ScoreContrast::ratio() const { return needle_mean() / haystack_mean(); }
void ScoreContrast::add(const ScoreContrast& other) {
  needle_tokens += other.needle_tokens;
  haystack_tokens += other.haystack_tokens;
  needle_sum += other.needle_sum;
  haystack_sum += other.haystack_sum;
}

ScoreContrast score_contrast(const std::vector<double>& score, const std::vector<TokenSpan>& needle,
                             const std::vector<TokenSpan>& haystack) {
  const int64_t T = int64_t(score.size());
  for (const auto* spans : {&needle, &haystack}) {
    for (const TokenSpan& s : *spans) {
      HAM_CHECK(s.begin >= 0 && s.begin <= s.end && s.end <= T, "score_contrast: ",
                spans == &needle ? "needle" : "haystack", " span [", s.begin, ", ", s.end,
                ") does not lie inside the ", T, " scores");
    }
  }
  ScoreContrast c;
  for (int64_t t = 0; t < T; ++t) {
    double e = score[size_t(t)];
    if (in_any(needle, t)) {
      ++c.needle_tokens;
      c.needle_sum += e;
    } else if (haystack.empty() || in_any(haystack, t)) {
      ++c.haystack_tokens;
      c.haystack_sum += e;
    }
  }
  return c;
}

std::vector<LayerSummary> summarize_layers(const std::vector<SequenceAnalysis>& sequences,
                                           const SummaryOptions& options) {
  HAM_CHECK(!sequences.empty(), "summarize_layers: no sequences");
  HAM_CHECK(options.needle_window_before >= 0 && options.needle_window_after >= 0,
            "summarize_layers: needle windows must be >= 0, got ", options.needle_window_before,
            " and ", options.needle_window_after);
  const size_t n_layers = sequences[0].layers.size();
  int64_t longest = 0;
  bool any_needle = false;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const SequenceAnalysis& seq = sequences[s];
    HAM_CHECK(seq.layers.size() == n_layers, "summarize_layers: sequence ", s, " has ",
              seq.layers.size(), " analyzed layers but sequence 0 has ", n_layers);
    for (size_t l = 0; l < n_layers; ++l) {
      const LayerSequenceTrace& a = seq.layers[l];
      const LayerSequenceTrace& first = sequences[0].layers[l];
      HAM_CHECK(a.layer == first.layer && a.kind == first.kind && a.heads() == first.heads(),
                "summarize_layers: sequence ", s, " layer entry ", l,
                " differs from sequence 0's (layer, kind or heads): not the same model");
      HAM_CHECK(a.score.size() == seq.input.tokens.size(), "summarize_layers: sequence ", s,
                " layer ", a.layer, " has ", a.score.size(), " scores for ",
                seq.input.tokens.size(), " tokens");
    }
    longest = std::max<int64_t>(longest, int64_t(seq.input.tokens.size()));
    any_needle = any_needle || !seq.input.needle.empty();
  }

  const int64_t window = options.needle_window_before + options.needle_window_after;
  std::vector<LayerSummary> out;
  for (size_t l = 0; l < n_layers; ++l) {
    const LayerSequenceTrace& first = sequences[0].layers[l];
    const size_t H = size_t(first.heads());
    LayerSummary sum;
    sum.layer = first.layer;
    sum.kind = first.kind;
    sum.tau = first.tau;
    sum.sequences = int64_t(sequences.size());
    sum.resets.assign(H, 0);
    sum.mean_alpha.assign(H, 0.0);
    sum.mean_fit_error.assign(H, 0.0);
    sum.sequences_at.assign(size_t(longest), 0);
    sum.mean_score_at.assign(size_t(longest), 0.0);
    sum.std_score_at.assign(size_t(longest), 0.0);
    sum.mean_kv_at.assign(size_t(longest), 0.0);
    sum.mean_alpha_at.assign(H, std::vector<double>(size_t(longest), 0.0));
    if (any_needle) {
      sum.needle_aligned_score.assign(size_t(window), 0.0);
      sum.needle_aligned_count.assign(size_t(window), 0);
    }
    double score_total = 0;
    int64_t selected_total = 0;
    for (const SequenceAnalysis& seq : sequences) {
      const LayerSequenceTrace& a = seq.layers[l];
      const size_t T = a.score.size();
      sum.tokens += int64_t(T);
      for (size_t t = 0; t < T; ++t) {
        double e = a.score[t];
        score_total += e;
        sum.sequences_at[t] += 1;
        sum.mean_score_at[t] += e;
        if (!a.kv_size.empty()) sum.mean_kv_at[t] += double(a.kv_size[t]);
        for (size_t h = 0; h < H; ++h) {
          sum.mean_alpha[h] += a.alpha[h][t];
          sum.mean_fit_error[h] += a.fit_error[h][t];
          sum.mean_alpha_at[h][t] += a.alpha[h][t];
        }
      }
      if (!a.kv_size.empty()) selected_total += a.kv_size.back();
      for (size_t h = 0; h < H; ++h) sum.resets[h] += int64_t(a.resets[h].size());
      if (!seq.input.needle.empty()) {
        sum.needle.add(score_contrast(a.score, seq.input.needle, seq.input.haystack));
        if (!a.selected.empty()) {
          std::vector<double> selected(a.selected.begin(), a.selected.end());
          sum.needle_selection.add(score_contrast(selected, seq.input.needle, seq.input.haystack));
        }
        for (const TokenSpan& span : seq.input.needle) {
          for (int64_t o = 0; o < window; ++o) {
            int64_t t = span.begin - options.needle_window_before + o;
            if (t < 0 || t >= int64_t(T)) continue;
            sum.needle_aligned_score[size_t(o)] += a.score[size_t(t)];
            sum.needle_aligned_count[size_t(o)] += 1;
          }
        }
      }
    }
    const double tokens = double(std::max<int64_t>(sum.tokens, 1));
    sum.mean_score = score_total / tokens;
    if (first.kind == AnalyzedLayerKind::HAM) sum.kv_fraction = double(selected_total) / tokens;
    for (size_t h = 0; h < H; ++h) {
      sum.reset_rate.push_back(double(sum.resets[h]) / tokens);
      sum.mean_alpha[h] /= tokens;
      sum.mean_fit_error[h] /= tokens;
    }
    for (size_t t = 0; t < size_t(longest); ++t) {
      double n = double(sum.sequences_at[t]);
      sum.mean_score_at[t] /= n;
      sum.mean_kv_at[t] = first.kind == AnalyzedLayerKind::HAM ? sum.mean_kv_at[t] / n : kNaN;
      for (size_t h = 0; h < H; ++h) sum.mean_alpha_at[h][t] /= n;
    }
    // Standard deviation about the mean, in a second pass (no cancellation).
    for (const SequenceAnalysis& seq : sequences) {
      const std::vector<double>& score = seq.layers[l].score;
      for (size_t t = 0; t < score.size(); ++t) {
        double d = score[t] - sum.mean_score_at[t];
        sum.std_score_at[t] += d * d;
      }
    }
    for (size_t t = 0; t < size_t(longest); ++t) {
      sum.std_score_at[t] = std::sqrt(sum.std_score_at[t] / double(sum.sequences_at[t]));
    }
    for (size_t o = 0; o < sum.needle_aligned_score.size(); ++o) {
      int64_t n = sum.needle_aligned_count[o];
      sum.needle_aligned_score[o] = n > 0 ? sum.needle_aligned_score[o] / double(n) : kNaN;
    }
    out.push_back(std::move(sum));
  }
  return out;
}

}  // namespace ham

// ham analyze: what a trained model's HAM (or GDN) layers do along sequences, as in the
// paper's "Analysis of the internals of HAM": routing score e_t, KV-cache growth T_KV(t),
// per-head fit error and gate alpha_t = exp(g_t) with resets, per sequence and averaged,
// and for NIAH prompts the score on the needle against the haystack. Writes CSVs and PNG
// plots (gnuplot) into --out and prints a per-layer summary. See docs/analysis.md.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
#include "train/analysis.h"
#include "train/cli/commands.h"
#include "train/plot.h"
#include "train/synthetic.h"
#include "train/text_data.h"
#include "train/tokenizer.h"
#include "train/trained_model.h"

namespace ham::cli {

namespace {

namespace fs = std::filesystem;

struct AnalyzeArgs {
  std::string model_dir, out_dir;
  std::string text, text_file, niah;
  std::string tokenizer;  // "": the model's own
  int64_t length = 0;   // NIAH: prompt tokens (default 1024); text: truncate to this many
  int64_t samples = 0;  // NIAH: prompts (default 8); text file: first documents (0: all)
  double depth = -1;    // NIAH needle depth in [0, 1]; negative: random per prompt
  uint64_t seed = 0;
  int64_t detail = 3;   // sequences that get their own CSVs and plots
  double reset_threshold = kResetThreshold;
  int threads = 0;
};

// Colours for the heads / layers of a plot, in order (then gnuplot's own).
const std::vector<std::string> kPalette = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                           "#9467bd", "#8c564b", "#e377c2", "#17becf"};
std::string palette(size_t i) { return i < kPalette.size() ? kPalette[i] : ""; }

struct Inputs {
  std::vector<AnalysisInput> sequences;
  std::string description;
};

Inputs build_inputs(const AnalyzeArgs& args, const Tokenizer& tokenizer) {
  int sources = int(!args.text.empty()) + int(!args.text_file.empty()) + int(!args.niah.empty());
  HAM_CHECK(sources == 1, "analyze: give exactly one of --text, --text-file and --niah (got ",
            sources, ")");
  HAM_CHECK(args.length >= 0, "--length must be >= 0, got ", args.length);
  HAM_CHECK(args.samples >= 0, "--samples must be >= 0, got ", args.samples);
  Inputs out;
  auto truncated = [&](std::vector<int64_t> tokens) {
    if (args.length > 0 && int64_t(tokens.size()) > args.length) tokens.resize(size_t(args.length));
    return tokens;
  };
  if (!args.niah.empty()) {
    NiahKind kind = niah_kind_from_name(args.niah);
    int64_t length = args.length > 0 ? args.length : 1024;
    int64_t samples = args.samples > 0 ? args.samples : 8;
    TextEncoder encode = [&tokenizer](std::string_view text) { return tokenizer.encode(text); };
    TokenCounter counter = [&tokenizer](std::string_view text) {
      return int64_t(tokenizer.encode(text).size());
    };
    for (int64_t i = 0; i < samples; ++i) {
      NiahConfig config = NiahConfig::preset(kind, length, args.seed + uint64_t(i));
      config.depth = args.depth;
      NiahExample example;
      try {
        example = make_niah_example(config, counter);
      } catch (const Error& e) {
        HAM_FAIL("--niah ", args.niah, " --length ", length, ": ", e.what());
      }
      NiahTokenSpans spans = niah_token_spans(example, encode);
      AnalysisInput input;
      input.tokens = encode(example.prompt);
      input.needle = spans.needles;
      input.haystack = {spans.context};
      input.query = {spans.question};
      out.sequences.push_back(std::move(input));
    }
    out.description = fmt::format("{} {} NIAH prompts of up to {} tokens (seeds {}..{})", samples,
                                  niah_kind_name(kind), length, args.seed,
                                  args.seed + uint64_t(samples) - 1);
  } else if (!args.text.empty()) {
    out.sequences.push_back({truncated(tokenizer.encode(args.text)), {}, {}, {}});
    out.description = "the --text sequence";
  } else {
    std::vector<std::string> documents = split_documents(read_file(args.text_file, "the --text-file"));
    HAM_CHECK(!documents.empty(), "--text-file ", args.text_file, ": holds no text");
    size_t count = args.samples > 0 ? std::min(documents.size(), size_t(args.samples)) : documents.size();
    for (size_t i = 0; i < count; ++i) {
      std::vector<int64_t> tokens = truncated(tokenizer.encode(documents[i]));
      if (!tokens.empty()) out.sequences.push_back({std::move(tokens), {}, {}, {}});
    }
    out.description = fmt::format("{} document{} of {}", out.sequences.size(),
                                  out.sequences.size() == 1 ? "" : "s", args.text_file);
  }
  return out;
}

// ---- CSV ----------------------------------------------------------------------------------

// A token's text as a quoted CSV field; control and non-ASCII bytes as \n, \t, \xHH.
std::string token_text_field(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"') {
      out += "\"\"";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string csv_number(double value) {
  if (std::isnan(value)) return "";
  return fmt::format("{:.6g}", value);
}

std::string spans_field(const std::vector<TokenSpan>& spans) {
  std::string out;
  for (const TokenSpan& s : spans) out += fmt::format("{}{}-{}", out.empty() ? "" : ";", s.begin, s.end);
  return out;
}

std::string region_of(const AnalysisInput& input, int64_t t) {
  auto in = [t](const std::vector<TokenSpan>& spans) {
    for (const TokenSpan& s : spans) {
      if (s.contains(t)) return true;
    }
    return false;
  };
  if (in(input.needle)) return "needle";
  if (in(input.query)) return "query";
  if (in(input.haystack)) return "haystack";
  bool marked = !input.needle.empty() || !input.haystack.empty() || !input.query.empty();
  return marked ? "other" : "text";
}

class CsvFile {
 public:
  explicit CsvFile(std::string path) : path_(std::move(path)), out_(path_) {
    HAM_CHECK(out_, path_, ": cannot write");
  }
  std::ofstream& out() { return out_; }
  void close() {
    out_.close();
    HAM_CHECK(!out_.fail(), path_, ": writing failed");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

void write_sequence_csv(const std::string& path, const SequenceAnalysis& seq,
                        const LayerSequenceTrace& layer, const Tokenizer& tokenizer) {
  CsvFile csv(path);
  std::ofstream& out = csv.out();
  const bool ham = layer.kind == AnalyzedLayerKind::HAM;
  out << "t,token,text,region,score";
  if (ham) out << ",selected,T_KV";
  for (int64_t h = 0; h < layer.heads(); ++h) out << ",fit_error_h" << h;
  for (int64_t h = 0; h < layer.heads(); ++h) out << ",alpha_h" << h;
  for (int64_t h = 0; h < layer.heads(); ++h) out << ",reset_h" << h;
  out << "\n";
  for (size_t t = 0; t < layer.score.size(); ++t) {
    int64_t id = seq.input.tokens[t];
    out << t << ',' << id << ',' << token_text_field(tokenizer.decode({id})) << ','
        << region_of(seq.input, int64_t(t)) << ',' << csv_number(layer.score[t]);
    if (ham) out << ',' << int(layer.selected[t]) << ',' << layer.kv_size[t];
    for (const auto& e : layer.fit_error) out << ',' << csv_number(e[t]);
    for (const auto& a : layer.alpha) out << ',' << csv_number(a[t]);
    for (const auto& r : layer.resets) {
      out << ',' << (std::binary_search(r.begin(), r.end(), int64_t(t)) ? 1 : 0);
    }
    out << "\n";
  }
  csv.close();
}

// ---- Plots --------------------------------------------------------------------------------

std::vector<double> positions(size_t n) {
  std::vector<double> x(n);
  for (size_t t = 0; t < n; ++t) x[t] = double(t);
  return x;
}

std::vector<double> as_doubles(const std::vector<int64_t>& values) {
  return std::vector<double>(values.begin(), values.end());
}

std::string layer_title(const LayerSequenceTrace& layer) {
  if (layer.kind == AnalyzedLayerKind::HAM) {
    return fmt::format("layer {} (HAM, tau = {:.4g})", layer.layer, layer.tau);
  }
  return fmt::format("layer {} (GDN)", layer.layer);
}

std::string score_name(AnalyzedLayerKind kind) {
  return kind == AnalyzedLayerKind::HAM ? "routing score e_t" : "min-head fit error";
}

// The needle (red) and the question (blue) as shaded bands; half-token margins so that a
// one-token span is visible.
std::vector<PlotSpan> marked_spans(const AnalysisInput& input) {
  std::vector<PlotSpan> spans;
  for (const TokenSpan& s : input.needle) {
    spans.push_back({double(s.begin) - 0.5, double(s.end) - 0.5, "needle", "#f6b7b7"});
  }
  for (const TokenSpan& s : input.query) {
    spans.push_back({double(s.begin) - 0.5, double(s.end) - 0.5, "question", "#b7d3f6"});
  }
  return spans;
}

PlotSeries constant_line(const std::string& label, double value, size_t length,
                         const std::string& color) {
  PlotSeries s = make_series(label, {0.0, double(std::max<size_t>(length, 1) - 1)}, {value, value});
  s.color = color;
  s.dashed = true;
  s.width = 1.0;
  return s;
}

// Routing score along the sequence, one panel per layer (the paper's toy NIAH figure).
PlotFigure sequence_score_figure(const SequenceAnalysis& seq, size_t index) {
  PlotFigure fig;
  fig.title = fmt::format("sequence {}: routing score along the sequence ({} tokens)", index,
                          seq.input.tokens.size());
  for (const LayerSequenceTrace& layer : seq.layers) {
    PlotPanel panel;
    panel.title = layer_title(layer);
    panel.x_label = "token position t";
    panel.y_label = score_name(layer.kind);
    PlotSeries score = make_series(score_name(layer.kind), positions(layer.score.size()), layer.score);
    score.color = "black";
    score.width = 1.2;
    panel.series.push_back(score);
    if (layer.kind == AnalyzedLayerKind::HAM) {
      panel.series.push_back(constant_line("tau", layer.tau, layer.score.size(), "#d62728"));
    }
    panel.spans = marked_spans(seq.input);
    fig.panels.push_back(panel);
  }
  return fig;
}

// Gates alpha_t per head with the resets (alpha_t < threshold) as vertical lines, and the
// score, one panel per layer (the paper's routing-and-gating figure).
PlotFigure sequence_gate_figure(const SequenceAnalysis& seq, size_t index, double threshold) {
  PlotFigure fig;
  fig.title = fmt::format("sequence {}: gate alpha_t = exp(g_t) per RNN head; vertical lines: "
                          "resets (alpha_t < {})", index, threshold);
  for (const LayerSequenceTrace& layer : seq.layers) {
    PlotPanel panel;
    panel.title = layer_title(layer);
    panel.x_label = "token position t";
    panel.y_label = "alpha_t, score";
    PlotSeries score = make_series(score_name(layer.kind), positions(layer.score.size()), layer.score);
    score.color = "black";
    score.width = 1.0;
    panel.series.push_back(score);
    for (int64_t h = 0; h < layer.heads(); ++h) {
      PlotSeries alpha = make_series(fmt::format("alpha head {}", h), positions(layer.alpha[size_t(h)].size()),
                       layer.alpha[size_t(h)]);
      alpha.color = palette(size_t(h));
      alpha.width = 1.2;
      panel.series.push_back(alpha);
      const auto& resets = layer.resets[size_t(h)];
      if (!resets.empty()) {
        PlotSeries marks = make_series(fmt::format("resets head {} ({})", h, resets.size()), as_doubles(resets),
                         std::vector<double>(resets.size(), 1.0), PlotStyle::Impulses);
        marks.color = palette(size_t(h));
        marks.width = 1.0;
        marks.dashed = true;
        panel.series.push_back(marks);
      }
    }
    panel.spans = marked_spans(seq.input);
    panel.y_min = 0.0;
    fig.panels.push_back(panel);
  }
  return fig;
}

// T_KV(t) of every HAM layer against the full cache t + 1.
std::optional<PlotFigure> kv_growth_figure(const std::string& title,
                                           const std::vector<std::string>& labels,
                                           const std::vector<std::vector<double>>& kv) {
  if (kv.empty()) return std::nullopt;
  PlotFigure fig;
  fig.title = title;
  PlotPanel panel;
  panel.title = "KV-cache size T_KV(t) = number of selected tokens up to t";
  panel.x_label = "token position t";
  panel.y_label = "T_KV(t)";
  size_t longest = 0;
  for (size_t i = 0; i < kv.size(); ++i) {
    PlotSeries s = make_series(labels[i], positions(kv[i].size()), kv[i]);
    s.color = palette(i);
    panel.series.push_back(s);
    longest = std::max(longest, kv[i].size());
  }
  std::vector<double> full(longest);
  for (size_t t = 0; t < longest; ++t) full[t] = double(t + 1);
  PlotSeries all = make_series("every token (attention)", positions(longest), full);
  all.color = "gray";
  all.dashed = true;
  all.width = 1.0;
  panel.series.push_back(all);
  fig.panels.push_back(panel);
  return fig;
}

PlotFigure mean_score_figure(const std::vector<LayerSummary>& summaries, int64_t sequences) {
  PlotFigure fig;
  fig.title = fmt::format("score against position, mean over {} sequence{} (dashed: mean +- std)",
                          sequences, sequences == 1 ? "" : "s");
  for (const LayerSummary& s : summaries) {
    PlotPanel panel;
    panel.title = s.kind == AnalyzedLayerKind::HAM
                      ? fmt::format("layer {} (HAM, tau = {:.4g})", s.layer, s.tau)
                      : fmt::format("layer {} (GDN)", s.layer);
    panel.x_label = "token position t";
    panel.y_label = "mean " + score_name(s.kind);
    std::vector<double> x = positions(s.mean_score_at.size()), low, high;
    for (size_t t = 0; t < x.size(); ++t) {
      low.push_back(s.mean_score_at[t] - s.std_score_at[t]);
      high.push_back(s.mean_score_at[t] + s.std_score_at[t]);
    }
    PlotSeries mean = make_series("mean", x, s.mean_score_at);
    mean.color = "black";
    PlotSeries band_low = make_series("mean +- std", x, low), band_high = make_series("", x, high);
    for (PlotSeries* b : {&band_low, &band_high}) {
      b->color = "gray";
      b->dashed = true;
      b->width = 0.8;
    }
    panel.series = {mean, band_low, band_high};
    if (s.kind == AnalyzedLayerKind::HAM) {
      panel.series.push_back(constant_line("tau", s.tau, x.size(), "#d62728"));
    }
    fig.panels.push_back(panel);
  }
  return fig;
}

PlotFigure mean_alpha_figure(const std::vector<LayerSummary>& summaries, int64_t sequences,
                             double threshold) {
  PlotFigure fig;
  fig.title = fmt::format("gate alpha_t per RNN head, mean over {} sequence{}", sequences,
                          sequences == 1 ? "" : "s");
  for (const LayerSummary& s : summaries) {
    PlotPanel panel;
    panel.title = fmt::format("layer {} ({})", s.layer, s.kind == AnalyzedLayerKind::HAM ? "HAM" : "GDN");
    panel.x_label = "token position t";
    panel.y_label = "mean alpha_t";
    for (size_t h = 0; h < s.mean_alpha_at.size(); ++h) {
      PlotSeries a = make_series(fmt::format("head {} (reset rate {:.3g}%)", h, 100.0 * s.reset_rate[h]),
                   positions(s.mean_alpha_at[h].size()), s.mean_alpha_at[h]);
      a.color = palette(h);
      panel.series.push_back(a);
    }
    panel.series.push_back(constant_line(fmt::format("reset threshold {}", threshold), threshold,
                                         s.mean_score_at.size(), "gray"));
    panel.y_min = 0.0;
    fig.panels.push_back(panel);
  }
  return fig;
}

PlotFigure needle_aligned_figure(const std::vector<LayerSummary>& summaries,
                                 const SummaryOptions& window, double mean_needle_length) {
  PlotFigure fig;
  fig.title = "score around the needle, mean over needles (0 = the needle's first token)";
  for (const LayerSummary& s : summaries) {
    PlotPanel panel;
    panel.title = fmt::format("layer {} ({}): needle / haystack = {:.3g}", s.layer,
                              s.kind == AnalyzedLayerKind::HAM ? "HAM" : "GDN", s.needle.ratio());
    panel.x_label = "tokens from the needle's start";
    panel.y_label = "mean " + score_name(s.kind);
    std::vector<double> x;
    for (size_t o = 0; o < s.needle_aligned_score.size(); ++o) {
      x.push_back(double(int64_t(o) - window.needle_window_before));
    }
    PlotSeries score = make_series("mean score", x, s.needle_aligned_score);
    score.color = "black";
    panel.series.push_back(score);
    if (!std::isnan(s.needle.haystack_mean())) {
      panel.series.push_back(constant_line("haystack mean", s.needle.haystack_mean(), 2, "gray"));
      panel.series.back().x = {x.front(), x.back()};
    }
    panel.spans.push_back({-0.5, mean_needle_length - 0.5, "needle (mean length)", "#f6b7b7"});
    fig.panels.push_back(panel);
  }
  return fig;
}

// ---- Report -------------------------------------------------------------------------------

std::string format_ratio(double value) { return std::isnan(value) ? "-" : fmt::format("{:.3f}", value); }

void print_summary(const std::vector<LayerSummary>& summaries, double threshold, bool has_needle) {
  std::cout << fmt::format("{:>5}  {:<4}  {:>7}  {:>11}  {:>10}", "layer", "kind", "tau",
                           "kv_fraction", "mean_score");
  if (has_needle) {
    std::cout << fmt::format("  {:>12}  {:>14}  {:>15}  {:>9}  {:>11}", "needle_score",
                             "haystack_score", "needle/haystack", "needle_kv", "haystack_kv");
  }
  std::cout << fmt::format("  resets (alpha < {}) per head\n", threshold);
  for (const LayerSummary& s : summaries) {
    std::cout << fmt::format("{:>5}  {:<4}  {:>7}  {:>11}  {:>10.4f}", s.layer,
                             analyzed_layer_kind_name(s.kind),
                             std::isnan(s.tau) ? "-" : fmt::format("{:.4g}", s.tau),
                             std::isnan(s.kv_fraction) ? "-" : fmt::format("{:.4f}", s.kv_fraction),
                             s.mean_score);
    if (has_needle) {
      std::cout << fmt::format("  {:>12}  {:>14}  {:>15}  {:>9}  {:>11}",
                               format_ratio(s.needle.needle_mean()),
                               format_ratio(s.needle.haystack_mean()), format_ratio(s.needle.ratio()),
                               format_ratio(s.needle_selection.needle_mean()),
                               format_ratio(s.needle_selection.haystack_mean()));
    }
    std::cout << " ";
    for (size_t h = 0; h < s.resets.size(); ++h) {
      std::cout << fmt::format(" h{} {} ({:.2f}%)", h, s.resets[h], 100.0 * s.reset_rate[h]);
    }
    std::cout << "\n";
  }
  if (has_needle) {
    std::cout << "needle/haystack score ratio by layer:";
    for (const LayerSummary& s : summaries) {
      std::cout << fmt::format(" {}={}", s.layer, format_ratio(s.needle.ratio()));
    }
    std::cout << "  (mean score on the needle sentence's tokens / on the rest of the haystack)\n";
    std::cout << "needle_kv, haystack_kv: fraction of those tokens selected into the KV cache\n";
  }
}

int run_analyze(const AnalyzeArgs& args) {
  use_threads(args.threads);
  HAM_CHECK(args.detail >= 0, "--detail must be >= 0, got ", args.detail);
  HAM_CHECK(std::isfinite(args.reset_threshold) && args.reset_threshold > 0 && args.reset_threshold < 1,
            "--reset-threshold must lie in (0, 1), got ", args.reset_threshold);
  HAM_CHECK(args.depth <= 1, "--depth must be in [0, 1] (or negative for random), got ", args.depth);
  // Fail before loading anything when plots cannot be drawn.
  HAM_CHECK(!find_gnuplot().empty(),
            "analyze: gnuplot is not installed (not found on PATH); run scripts/install_deps.sh");
  prepare_output_directory(args.out_dir, "--out");

  TrainedModel trained = load_trained_model(args.model_dir);
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(args.tokenizer.empty() ? trained.tokenizer : args.tokenizer);
  const LanguageModel& model = *trained.model;
  HAM_CHECK(model.config().vocab_size >= tokenizer->vocab_size(), "analyze: the model's vocab_size (",
            model.config().vocab_size, ") is smaller than the tokenizer's vocabulary (",
            tokenizer->vocab_size(), ", ", tokenizer->name(), ")");
  Inputs inputs = build_inputs(args, *tokenizer);
  HAM_CHECK(!inputs.sequences.empty(), "analyze: no sequences to analyze (", inputs.description, ")");

  std::cout << fmt::format("analyze: {} model from {}{}; {}; tokenizer {}\n",
                           family_name(model.config().family), trained.source,
                           trained.step >= 0 ? fmt::format(" (step {})", trained.step) : "",
                           inputs.description, tokenizer->name());
  std::vector<SequenceAnalysis> sequences =
      analyze_sequences(model, inputs.sequences, args.reset_threshold);
  SummaryOptions summary_options;
  std::vector<LayerSummary> summaries = summarize_layers(sequences, summary_options);
  bool has_needle = false;
  double needle_length_sum = 0;
  int64_t needles = 0;
  for (const auto& seq : sequences) {
    for (const TokenSpan& s : seq.input.needle) {
      has_needle = true;
      needle_length_sum += double(s.size());
      ++needles;
    }
  }

  const fs::path dir(args.out_dir);
  std::vector<std::string> written, plots;
  auto path = [&](const std::string& name) { return (dir / name).string(); };
  // Plots go to plots/, each PNG with its data (.csv) and gnuplot script (.gp).
  auto plot = [&](const PlotFigure& figure, const std::string& name) {
    PlotFiles files = write_plot(figure, (dir / "plots" / name).string());
    plots.push_back("plots/" + name);
    return files;
  };

  // Per layer summary and per head statistics.
  {
    CsvFile csv(path("summary.csv"));
    csv.out() << "layer,kind,tau,sequences,tokens,kv_fraction,mean_score,needle_tokens,"
                 "needle_score,haystack_tokens,haystack_score,needle_haystack_ratio,"
                 "needle_selected_fraction,haystack_selected_fraction,resets\n";
    for (const LayerSummary& s : summaries) {
      int64_t resets = 0;
      for (int64_t r : s.resets) resets += r;
      csv.out() << s.layer << ',' << analyzed_layer_kind_name(s.kind) << ',' << csv_number(s.tau)
                << ',' << s.sequences << ',' << s.tokens << ',' << csv_number(s.kv_fraction) << ','
                << csv_number(s.mean_score) << ',' << s.needle.needle_tokens << ','
                << csv_number(s.needle.needle_mean()) << ',' << s.needle.haystack_tokens << ','
                << csv_number(s.needle.haystack_mean()) << ',' << csv_number(s.needle.ratio()) << ','
                << csv_number(s.needle_selection.needle_mean()) << ','
                << csv_number(s.needle_selection.haystack_mean()) << ',' << resets << "\n";
    }
    csv.close();
    written.push_back("summary.csv");
  }
  {
    CsvFile csv(path("heads.csv"));
    csv.out() << "layer,head,resets,reset_rate,mean_alpha,mean_fit_error\n";
    for (const LayerSummary& s : summaries) {
      for (size_t h = 0; h < s.resets.size(); ++h) {
        csv.out() << s.layer << ',' << h << ',' << s.resets[h] << ',' << csv_number(s.reset_rate[h])
                  << ',' << csv_number(s.mean_alpha[h]) << ',' << csv_number(s.mean_fit_error[h]) << "\n";
      }
    }
    csv.close();
    written.push_back("heads.csv");
  }
  {
    CsvFile csv(path("sequences.csv"));
    csv.out() << "sequence,tokens,needle_spans,haystack_spans,query_spans\n";
    for (size_t i = 0; i < sequences.size(); ++i) {
      const AnalysisInput& in = sequences[i].input;
      csv.out() << i << ',' << in.tokens.size() << ',' << spans_field(in.needle) << ','
                << spans_field(in.haystack) << ',' << spans_field(in.query) << "\n";
    }
    csv.close();
    written.push_back("sequences.csv");
  }
  for (const LayerSummary& s : summaries) {
    std::string name = fmt::format("by_position_layer{}.csv", s.layer);
    CsvFile csv(path(name));
    csv.out() << "t,sequences,mean_score,std_score,mean_T_KV";
    for (size_t h = 0; h < s.mean_alpha_at.size(); ++h) csv.out() << ",mean_alpha_h" << h;
    csv.out() << "\n";
    for (size_t t = 0; t < s.mean_score_at.size(); ++t) {
      csv.out() << t << ',' << s.sequences_at[t] << ',' << csv_number(s.mean_score_at[t]) << ','
                << csv_number(s.std_score_at[t]) << ',' << csv_number(s.mean_kv_at[t]);
      for (const auto& a : s.mean_alpha_at) csv.out() << ',' << csv_number(a[t]);
      csv.out() << "\n";
    }
    csv.close();
    written.push_back(name);
    if (has_needle) {
      std::string aligned = fmt::format("needle_aligned_layer{}.csv", s.layer);
      CsvFile a(path(aligned));
      a.out() << "offset,needles,mean_score\n";
      for (size_t o = 0; o < s.needle_aligned_score.size(); ++o) {
        a.out() << int64_t(o) - summary_options.needle_window_before << ','
                << s.needle_aligned_count[o] << ',' << csv_number(s.needle_aligned_score[o]) << "\n";
      }
      a.close();
      written.push_back(aligned);
    }
  }

  // The first --detail sequences in full.
  size_t detailed = std::min(sequences.size(), size_t(args.detail));
  for (size_t i = 0; i < detailed; ++i) {
    const SequenceAnalysis& seq = sequences[i];
    std::string prefix = fmt::format("seq{:03d}", i);
    std::vector<std::string> labels;
    std::vector<std::vector<double>> kv;
    for (const LayerSequenceTrace& layer : seq.layers) {
      std::string name = fmt::format("{}_layer{}.csv", prefix, layer.layer);
      write_sequence_csv(path(name), seq, layer, *tokenizer);
      written.push_back(name);
      if (layer.kind == AnalyzedLayerKind::HAM) {
        labels.push_back(fmt::format("layer {} ({} of {} tokens)", layer.layer, layer.kv_size.back(),
                                     layer.kv_size.size()));
        kv.push_back(as_doubles(layer.kv_size));
      }
    }
    plot(sequence_score_figure(seq, i), prefix + "_score.png");
    plot(sequence_gate_figure(seq, i, args.reset_threshold), prefix + "_gates.png");
    if (auto fig = kv_growth_figure(fmt::format("sequence {}: KV-cache growth", i), labels, kv)) {
      plot(*fig, prefix + "_kv.png");
    }
  }

  // Averages over every sequence.
  const int64_t n = int64_t(sequences.size());
  plot(mean_score_figure(summaries, n), "mean_score.png");
  plot(mean_alpha_figure(summaries, n, args.reset_threshold), "mean_alpha.png");
  {
    std::vector<std::string> labels;
    std::vector<std::vector<double>> kv;
    for (const LayerSummary& s : summaries) {
      if (s.kind != AnalyzedLayerKind::HAM) continue;
      labels.push_back(fmt::format("layer {} (kv fraction {:.3f})", s.layer, s.kv_fraction));
      kv.push_back(s.mean_kv_at);
    }
    if (auto fig = kv_growth_figure(fmt::format("KV-cache growth, mean over {} sequence{}", n,
                                                n == 1 ? "" : "s"),
                                    labels, kv)) {
      plot(*fig, "mean_kv.png");
    }
  }
  if (has_needle) {
    plot(needle_aligned_figure(summaries, summary_options, needle_length_sum / double(needles)),
         "needle_aligned_score.png");
  }

  print_summary(summaries, args.reset_threshold, has_needle);
  std::cout << fmt::format("wrote {} CSV files and {} plots (plots/*.png, each with its .csv "
                           "data and .gp script) to {}\n",
                           written.size(), plots.size(), args.out_dir);
  std::cout << "plots:";
  for (const auto& p : plots) std::cout << " " << p;
  std::cout << "\n";
  return 0;
}

}  // namespace

Command add_analyze_command(CLI::App& root) {
  auto args = std::make_shared<AnalyzeArgs>();
  CLI::App* cmd = root.add_subcommand(
      "analyze", "Routing scores, KV-cache growth, gates and resets of a trained HAM or GDN model, as CSVs and PNG plots");
  cmd->add_option("model", args->model_dir, "Trained model: a --export directory, a checkpoint, or a training output directory (newest checkpoint)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--out", args->out_dir, "Directory for the CSVs and plots")->required();
  cmd->add_option("--text", args->text, "Analyze this text");
  cmd->add_option("--text-file", args->text_file, "Analyze the documents of this file (separated by lines '<|endoftext|>')")
      ->check(CLI::ExistingFile);
  cmd->add_option("--niah", args->niah, "Analyze RULER NIAH prompts of this task (single_1: the noise haystack), with the needle marked");
  cmd->add_option("--length", args->length, "NIAH: prompt length in tokens (default 1024); text: keep at most this many tokens");
  cmd->add_option("--samples", args->samples, "NIAH: number of prompts (default 8); text file: first documents (default all)");
  cmd->add_option("--depth", args->depth, "NIAH: needle depth in [0, 1] (default: random per prompt)");
  cmd->add_option("--seed", args->seed, "NIAH: seed of the first prompt (prompt i uses seed + i)")->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer, "'bytes' or a tokenizer.json (default: the tokenizer.json saved with the model, else bytes)");
  cmd->add_option("--detail", args->detail, "Sequences that get per-token CSVs and their own plots")->capture_default_str();
  cmd->add_option("--reset-threshold", args->reset_threshold, "alpha_t below this counts as a state reset")
      ->capture_default_str();
  add_threads_option(cmd, &args->threads);
  return {cmd, [args] { return run_analyze(*args); }};
}

}  // namespace ham::cli

// ham info: a model's parameters counted by component next to the paper's appendix
// formulas, and the appendix's forward FLOPs and memory per token and training FLOPs.
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/accounting.h"
#include "models/language_model.h"
#include "nn/layers.h"
#include "train/cli/commands.h"

namespace ham::cli {

namespace {

struct InfoArgs {
  std::string config_path;
  bool list = false;    // every parameter with its shape and group
  bool rows = false;    // the appendix rows behind each formula
  bool json = false;
  bool strict = false;  // exit 1 when a counted number differs from its formula
  double seq_len = kPaperSeqLen;
  double kv_fraction = 0.5;
  double tokens = 50e9;
};

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string with_commas(double x) { return with_commas(int64_t(std::llround(x))); }

std::string bytes_str(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.3f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.3f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.3f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

// "0-23", or "1, 3, 5" when not contiguous.
std::string layer_list(const std::vector<int64_t>& layers) {
  bool contiguous = layers.back() - layers.front() + 1 == int64_t(layers.size());
  if (contiguous) {
    return layers.size() == 1 ? std::to_string(layers[0])
                              : fmt::format("{}-{}", layers.front(), layers.back());
  }
  std::string s;
  for (int64_t i : layers) s += (s.empty() ? "" : ", ") + std::to_string(i);
  return s;
}

// Layers with the same kind, the same counted groups and the same formulas print once.
struct LayerGroup {
  LayerKind kind;
  std::vector<int64_t> layers;
  const LayerParameterCount* counted = nullptr;  // null when the model was not built
  int64_t mixer_formula = 0, ffn_formula = 0;
};

std::string group_key(const LayerGroup& g) {
  std::string key = fmt::format("{}|{}|{}", int(g.kind), g.mixer_formula, g.ffn_formula);
  if (g.counted) {
    for (const auto& p : g.counted->parts) key += fmt::format("|{}:{}", int(p.part), p.count);
  }
  return key;
}

std::vector<LayerGroup> group_layers(const ModelConfig& c, const ParameterBreakdown* counted) {
  std::vector<LayerGroup> groups;
  std::map<std::string, size_t> index;
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    LayerGroup g{layer_kind(c, layer), {layer}, nullptr, mixer_parameter_count(c, layer),
                 ffn_parameter_count(c)};
    if (counted && layer < int64_t(counted->layers.size())) g.counted = &counted->layers[size_t(layer)];
    std::string key = group_key(g);
    auto it = index.find(key);
    if (it == index.end()) {
      index[key] = groups.size();
      groups.push_back(g);
    } else {
      groups[it->second].layers.push_back(layer);
    }
  }
  return groups;
}

// Counts the comparisons that failed.
struct Verdicts {
  int mismatches = 0;
  std::string mark(int64_t counted, int64_t formula) {
    if (counted == formula) return "✓";
    ++mismatches;
    return fmt::format("✗ MISMATCH: counted - appendix = {:+}", counted - formula);
  }
};

struct Report {
  ModelConfig config;
  std::string model_error;  // why the model could not be built, if it could not
  std::shared_ptr<LanguageModel> model;
  std::optional<ParameterBreakdown> counted;
  SequenceShape shape;
  PaperClosedForm closed_form;
  double flops_per_token = 0;
  ForwardMemory memory;
};

// Returns the number of counted numbers that differ from their formula.
int print_text(const InfoArgs& args, const Report& r) {
  const ModelConfig& c = r.config;
  std::cout << fmt::format("{}: {}, {} layers, d_model {}, vocab {}\n",
                           args.config_path.empty() ? "<built-in config>" : args.config_path,
                           family_name(c.family), c.n_layers, c.d_model, c.vocab_size);
  if (r.counted) {
    int64_t thresholds = 0;
    for (const auto& layer : r.counted->layers) thresholds += layer.count(ParameterPart::Thresholds);
    std::cout << fmt::format("{} model: {} parameters", family_name(c.family), r.counted->total);
    if (thresholds > 0) {
      std::cout << fmt::format(" ({} module parameters + {} learned thresholds)",
                               r.counted->total - thresholds, thresholds);
    }
    std::cout << "\n";
  } else {
    std::cout << fmt::format("model not built ({}): appendix formulas only\n", r.model_error);
  }
  if (args.list && r.model) {
    for (const auto& [name, p] : r.model->named_parameters()) {
      std::cout << fmt::format("  {:<48} {:<16} {}\n", name, shape_str(p.shape()),
                               parameter_part_name(classify_parameter(name).part));
    }
  }

  Verdicts verdicts;
  auto line = [&](int indent, const std::string& label, std::optional<int64_t> counted,
                  std::optional<int64_t> formula) {
    std::string left = std::string(size_t(indent), ' ') + label;
    std::string counted_str = counted ? with_commas(*counted) : "-";
    std::string formula_str = formula ? with_commas(*formula) : "";
    std::string mark = counted && formula ? "  " + verdicts.mark(*counted, *formula) : "";
    std::cout << fmt::format("{:<44} {:>15} {:>15}{}\n", left, counted_str, formula_str, mark);
  };
  // An appendix row: its value in the appendix column, nothing counted.
  auto print_parameter_rows = [](const std::vector<ParameterRow>& rows) {
    for (const auto& row : rows) {
      std::string label = "      | " + row.source + (row.extension ? " (not in the appendix)" : "");
      std::cout << fmt::format("{:<44} {:>15} {:>15}\n", label, "", with_commas(row.count));
    }
  };
  auto counted_or = [&](int64_t n) { return r.counted ? std::optional<int64_t>(n) : std::nullopt; };

  std::cout << fmt::format("\n{:<44} {:>15} {:>15}\n", "Parameters", "counted", "appendix");
  auto model_rows = model_parameter_rows(c);
  line(2, "embedding", counted_or(r.counted ? r.counted->embedding : 0), model_rows[0].count);
  line(2, "lm_head", counted_or(r.counted ? r.counted->lm_head : 0), model_rows[1].count);
  line(2, "final norm", counted_or(r.counted ? r.counted->final_norm : 0), model_rows[2].count);
  for (const auto& g : group_layers(c, r.counted ? &*r.counted : nullptr)) {
    std::cout << fmt::format("  {} layer{} {} ({}), each:\n", layer_kind_name(g.kind),
                             g.layers.size() > 1 ? "s" : "", layer_list(g.layers), g.layers.size());
    line(4, "mixer (Layer Total)", counted_or(g.counted ? g.counted->mixer() : 0), g.mixer_formula);
    if (g.counted) {
      for (const auto& p : g.counted->parts) {
        if (is_mixer_part(p.part)) line(6, parameter_part_name(p.part), p.count, std::nullopt);
      }
    }
    if (args.rows) print_parameter_rows(mixer_parameter_rows(c, g.layers[0]));
    line(4, "FFN (FFN Total)", counted_or(g.counted ? g.counted->ffn() : 0), g.ffn_formula);
    if (g.counted) {
      for (const auto& p : g.counted->parts) {
        if (!is_mixer_part(p.part)) line(6, parameter_part_name(p.part), p.count, std::nullopt);
      }
    }
    if (args.rows) print_parameter_rows(ffn_parameter_rows(c));
  }
  if (r.counted && r.counted->other.count > 0) {
    line(2, "other (no rule matched)", r.counted->other.count, std::nullopt);
    for (const auto& name : r.counted->other.names) std::cout << "      " << name << "\n";
  }
  int64_t formula_total = formula_parameter_count(c);
  line(2, "total", counted_or(r.counted ? r.counted->total : 0), formula_total);
  if (r.closed_form.applies) {
    // The paper's polynomial against its rows (not a check of the model).
    int64_t gap = formula_total - std::llround(r.closed_form.parameters);
    std::cout << fmt::format("  {:<58} {:>15}  {}\n", "paper closed form (tab:params_scaling)",
                             with_commas(r.closed_form.parameters),
                             gap == 0 ? "✓" : fmt::format("(rows {:+})", gap));
  } else {
    std::cout << fmt::format("  paper closed forms: n/a ({})\n", r.closed_form.reason);
  }

  const SequenceShape& s = r.shape;
  std::cout << fmt::format("\nForward pass at T = {}", with_commas(s.seq_len));
  if (c.family == ModelFamily::HAM) {
    std::cout << fmt::format(", T_KV = {} (rho = {})", with_commas(s.kv_len), args.kv_fraction);
  }
  std::cout << ":\n";
  std::cout << fmt::format("  {:<42} {:>15}  ({:.4g} GFLOPs)\n", "FLOPs per token (appendix rows)",
                           with_commas(r.flops_per_token), r.flops_per_token / 1e9);
  if (r.closed_form.applies) {
    double gap = r.flops_per_token - r.closed_form.flops_per_token;
    std::cout << fmt::format("  {:<42} {:>15}{}\n", "FLOPs per token (paper closed form in d)",
                             with_commas(r.closed_form.flops_per_token),
                             std::abs(gap) < 0.5 ? "" : fmt::format(
                                 "  (rows {}{}: the paper's simplification, see models/accounting.h)",
                                 gap > 0 ? "+" : "", with_commas(gap)));
  }
  if (args.rows) {
    std::map<LayerKind, int64_t> first_layer;
    for (int64_t layer = c.n_layers - 1; layer >= 0; --layer) first_layer[layer_kind(c, layer)] = layer;
    for (const auto& [kind, layer] : first_layer) {
      std::cout << fmt::format("    {} layer, per token:\n", layer_kind_name(kind));
      for (const auto& row : mixer_flops_rows(c, layer, s)) {
        std::cout << fmt::format("      | {:<48} {:>15}{}\n", row.operation, with_commas(row.per_token),
                                 row.extension ? "  (not in the appendix)" : "");
      }
    }
    std::cout << "    FFN, per token:\n";
    for (const auto& row : ffn_flops_rows(c)) {
      std::cout << fmt::format("      | {:<48} {:>15}\n", row.operation, with_commas(row.per_token));
    }
    for (const auto& row : model_flops_rows(c)) {
      std::cout << fmt::format("    | {:<50} {:>15}\n", row.operation, with_commas(row.per_token));
    }
  }
  const ForwardMemory& m = r.memory;
  std::cout << fmt::format("  {:<42} {:>15}  = weights {} + RNN state {} + KV cache {}\n",
                           "memory, bf16 (appendix)", bytes_str(m.total()), bytes_str(m.weights),
                           bytes_str(m.rnn_state), bytes_str(m.kv_cache));
  if (r.closed_form.applies) {
    double gap = m.total() - r.closed_form.memory_bytes;
    std::cout << fmt::format("  {:<42} {:>15}{}\n", "memory, bf16 (paper closed form in d)",
                             bytes_str(r.closed_form.memory_bytes),
                             std::abs(gap) < 0.5 ? "" : fmt::format(
                                 "  (rows {}{} B: the paper's simplification, see models/accounting.h)",
                                 gap > 0 ? "+" : "", with_commas(gap)));
  }

  std::cout << fmt::format("\nTraining FLOPs (3 x forward x {} tokens):\n", with_commas(args.tokens));
  auto training_line = [&](const char* label, double flops_per_token) {
    double flops = training_flops(flops_per_token, args.tokens);
    std::cout << fmt::format("  {:<42} {:>15.4f} zFLOPs  ({:.4e} FLOPs)\n", label, flops / 1e21, flops);
  };
  training_line("appendix rows", r.flops_per_token);
  if (r.closed_form.applies) {
    training_line("paper closed form (tab:training_flops)", r.closed_form.flops_per_token);
  }
  if (verdicts.mismatches > 0) {
    std::cout.flush();
    std::cerr << fmt::format("ham info: {} MISMATCH{} between the built model and the appendix formulas\n",
                             verdicts.mismatches, verdicts.mismatches > 1 ? "ES" : "");
  }
  return verdicts.mismatches;
}

nlohmann::json counted_and_formula(std::optional<int64_t> counted, int64_t formula) {
  nlohmann::json j = {{"appendix", formula}};
  j["counted"] = counted ? nlohmann::json(*counted) : nlohmann::json(nullptr);
  if (counted) j["match"] = *counted == formula;
  return j;
}

template <class Rows>
nlohmann::json rows_json(const Rows& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& row : rows) {
    if constexpr (std::is_same_v<typename Rows::value_type, FlopsRow>) {
      out.push_back({{"operation", row.operation}, {"per_token", row.per_token},
                     {"extension", row.extension}});
    } else {
      out.push_back({{"source", row.source}, {"count", row.count}, {"extension", row.extension}});
    }
  }
  return out;
}

// The same report as one JSON object; returns the number of mismatches.
int print_json(const InfoArgs& args, const Report& r) {
  const ModelConfig& c = r.config;
  const auto* counted = r.counted ? &*r.counted : nullptr;
  auto opt = [&](int64_t n) { return counted ? std::optional<int64_t>(n) : std::nullopt; };
  auto model_rows = model_parameter_rows(c);
  nlohmann::json params;
  params["embedding"] = counted_and_formula(opt(counted ? counted->embedding : 0), model_rows[0].count);
  params["lm_head"] = counted_and_formula(opt(counted ? counted->lm_head : 0), model_rows[1].count);
  params["final_norm"] = counted_and_formula(opt(counted ? counted->final_norm : 0), model_rows[2].count);
  params["total"] = counted_and_formula(opt(counted ? counted->total : 0), formula_parameter_count(c));
  int mismatches = 0;
  for (const char* key : {"embedding", "lm_head", "final_norm", "total"}) {
    mismatches += params[key].value("match", true) ? 0 : 1;
  }
  nlohmann::json layers = nlohmann::json::array();
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    const LayerParameterCount* lc =
        counted && layer < int64_t(counted->layers.size()) ? &counted->layers[size_t(layer)] : nullptr;
    nlohmann::json j = {{"layer", layer}, {"kind", layer_kind_name(layer_kind(c, layer))}};
    j["mixer"] = counted_and_formula(lc ? std::optional<int64_t>(lc->mixer()) : std::nullopt,
                                     mixer_parameter_count(c, layer));
    j["ffn"] = counted_and_formula(lc ? std::optional<int64_t>(lc->ffn()) : std::nullopt,
                                   ffn_parameter_count(c));
    mismatches += (j["mixer"].value("match", true) ? 0 : 1) + (j["ffn"].value("match", true) ? 0 : 1);
    if (lc) {
      nlohmann::json parts = nlohmann::json::object();
      for (const auto& p : lc->parts) {
        parts[parameter_part_name(p.part)] = {{"count", p.count}, {"names", p.names}};
      }
      j["parts"] = parts;
    }
    j["appendix_rows"] = rows_json(mixer_parameter_rows(c, layer));
    j["flops_rows"] = rows_json(mixer_flops_rows(c, layer, r.shape));
    layers.push_back(j);
  }
  params["layers"] = layers;
  params["ffn_rows"] = rows_json(ffn_parameter_rows(c));
  params["model_rows"] = rows_json(model_rows);
  if (counted) {
    params["other"] = {{"count", counted->other.count}, {"names", counted->other.names}};
  }

  nlohmann::json out;
  out["config"] = args.config_path;
  out["family"] = family_name(c.family);
  out["model"] = r.model_error.empty() ? nlohmann::json("built") : nlohmann::json(r.model_error);
  out["parameters"] = params;
  out["forward"] = {
      {"seq_len", r.shape.seq_len},
      {"kv_len", r.shape.kv_len},
      {"kv_fraction", args.kv_fraction},
      {"flops_per_token", r.flops_per_token},
      {"ffn_flops_rows", rows_json(ffn_flops_rows(c))},
      {"model_flops_rows", rows_json(model_flops_rows(c))},
      {"memory_bytes",
       {{"weights", r.memory.weights}, {"rnn_state", r.memory.rnn_state},
        {"kv_cache", r.memory.kv_cache}, {"total", r.memory.total()}}}};
  out["training"] = {{"tokens", args.tokens},
                     {"flops", training_flops(r.flops_per_token, args.tokens)}};
  nlohmann::json closed = {{"applies", r.closed_form.applies}};
  if (r.closed_form.applies) {
    closed["parameters"] = r.closed_form.parameters;
    closed["flops_per_token"] = r.closed_form.flops_per_token;
    closed["memory_bytes"] = r.closed_form.memory_bytes;
    closed["training_flops"] = training_flops(r.closed_form.flops_per_token, args.tokens);
  } else {
    closed["reason"] = r.closed_form.reason;
  }
  out["paper_closed_form"] = closed;
  out["mismatches"] = mismatches;
  std::cout << out.dump(2) << "\n";
  return mismatches;
}

int run_info(const InfoArgs& args) {
  HAM_CHECK(args.seq_len >= 1, "ham info: --seq-len must be at least 1, got ", args.seq_len);
  HAM_CHECK(args.kv_fraction >= 0 && args.kv_fraction <= 1,
            "ham info: --kv-fraction must lie in [0, 1], got ", args.kv_fraction);
  HAM_CHECK(args.tokens > 0, "ham info: --tokens must be positive, got ", args.tokens);
  Report r;
  r.config = args.config_path.empty() ? ModelConfig{} : ModelConfig::from_file(args.config_path);
  {
    SkipInitGuard structure_only;  // shapes only: no time spent filling 800M weights
    try {
      r.model = make_model(r.config);
      r.counted = count_parameters(*r.model);
    } catch (const std::exception& e) {
      r.model_error = e.what();  // a family not built yet still gets its formulas
    }
  }
  r.shape = SequenceShape::with_kv_fraction(args.seq_len, args.kv_fraction);
  r.flops_per_token = forward_flops_per_token(r.config, r.shape);
  r.memory = forward_memory_bytes(r.config, r.shape);
  r.closed_form = paper_closed_form(r.config, r.shape);
  int mismatches = args.json ? print_json(args, r) : print_text(args, r);
  return args.strict && mismatches > 0 ? 1 : 0;
}

}  // namespace

Command add_info_command(CLI::App& root) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* cmd = root.add_subcommand(
      "info", "Parameters by component next to the paper's appendix formulas; forward FLOPs, "
              "memory and training FLOPs");
  cmd->add_option("config", args->config_path, "Model config JSON (default: the tiny built-in Transformer)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--list", args->list, "List every parameter with its shape and group");
  cmd->add_flag("--rows", args->rows, "Show the appendix table rows behind each formula");
  cmd->add_flag("--json", args->json, "Print the report as JSON");
  cmd->add_flag("--strict", args->strict,
                "Exit with status 1 when a counted number differs from its appendix formula");
  cmd->add_option("--seq-len", args->seq_len, "Sequence length T")->capture_default_str();
  cmd->add_option("--kv-fraction", args->kv_fraction,
                  "HAM's KV cache fraction rho: T_KV = rho T")
      ->capture_default_str();
  cmd->add_option("--tokens", args->tokens,
                  "Training tokens (the paper: 32 x 16384 x 95367 ~ 5e10)")
      ->capture_default_str();
  return {cmd, [args] { return run_info(*args); }};
}

}  // namespace ham::cli

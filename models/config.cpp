#include "models/config.h"

#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ham {

const char* family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::Transformer: return "transformer";
    case ModelFamily::GDN: return "gdn";
    case ModelFamily::GDNGSA: return "gdn-gsa";
    case ModelFamily::HAM: return "ham";
  }
  return "unknown";
}

const char* router_name(RouterKind router) {
  switch (router) {
    case RouterKind::FitError: return "fit_error";
    case RouterKind::InputShallow: return "input_shallow";
    case RouterKind::InputDeep: return "input_deep";
  }
  return "unknown";
}

namespace {

template <class T>
void read_key(const nlohmann::json& j, const std::string& source, const char* key, T& out) {
  if (!j.contains(key)) return;
  const auto& v = j.at(key);
  if constexpr (std::is_same_v<T, bool>) {
    HAM_CHECK(v.is_boolean(), source, ": key '", key, "' must be true or false, got ", v.dump());
  } else if constexpr (std::is_integral_v<T>) {
    HAM_CHECK(v.is_number_integer(), source, ": key '", key, "' must be an integer, got ", v.dump());
    if constexpr (std::is_unsigned_v<T>) {
      HAM_CHECK(v.get<int64_t>() >= 0, source, ": key '", key, "' must be >= 0, got ", v.dump());
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    HAM_CHECK(v.is_number(), source, ": key '", key, "' must be a number, got ", v.dump());
  }
  out = v.get<T>();
}

// Reads a string key that must be one of `choices`.
template <class E>
void read_choice(const nlohmann::json& j, const std::string& source, const char* key,
                 const std::map<std::string, E>& choices, E& out) {
  if (!j.contains(key)) return;
  std::string names;
  for (const auto& [name, value] : choices) names += (names.empty() ? "" : ", ") + name;
  HAM_CHECK(j[key].is_string(), source, ": key '", key, "' must be a string (one of ", names, ")");
  auto it = choices.find(j[key].get<std::string>());
  HAM_CHECK(it != choices.end(), source, ": key '", key, "': unknown value '",
            j[key].get<std::string>(), "' (expected one of ", names, ")");
  out = it->second;
}

}  // namespace

bool ModelConfig::is_attention_layer(int64_t layer) const {
  switch (family) {
    case ModelFamily::Transformer: return true;
    case ModelFamily::GDNGSA: return (layer + 1) % gsa_every == 0;
    default: return false;
  }
}

double ModelConfig::kv_target_for_layer(int64_t layer) const {
  return kv_target.size() == 1 ? kv_target[0] : kv_target.at(size_t(layer));
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source) {
  HAM_CHECK(j.is_object(), source, ": model config must be a JSON object");
  static const std::set<std::string> known = {
      "family", "vocab_size", "d_model", "n_layers", "d_ff", "norm_eps", "init_std", "recompute",
      "seed", "n_heads", "n_kv_heads", "head_dim", "v_head_dim", "rope_base", "attn_conv_size", "gdn_heads",
      "gdn_head_dim", "gdn_v_head_dim", "conv_size", "gdn_keep_chunk_states", "gsa_every",
      "router", "router_hidden", "router_aggregate", "eda", "tau", "learn_tau", "kv_target",
      "tau_freeze_steps", "tau_gain", "tau_clip", "tau_lr"};
  for (const auto& item : j.items()) {
    HAM_CHECK(known.count(item.key()), source, ": unknown key '", item.key(), "' in model config");
  }
  ModelConfig c;
  read_choice(j, source, "family",
              std::map<std::string, ModelFamily>{{"transformer", ModelFamily::Transformer},
                                                 {"gdn", ModelFamily::GDN},
                                                 {"gdn-gsa", ModelFamily::GDNGSA},
                                                 {"ham", ModelFamily::HAM}},
              c.family);
  read_key(j, source, "vocab_size", c.vocab_size);
  read_key(j, source, "d_model", c.d_model);
  read_key(j, source, "n_layers", c.n_layers);
  read_key(j, source, "d_ff", c.d_ff);
  read_key(j, source, "norm_eps", c.norm_eps);
  read_key(j, source, "init_std", c.init_std);
  read_key(j, source, "recompute", c.recompute);
  read_key(j, source, "seed", c.seed);
  read_key(j, source, "n_heads", c.n_heads);
  c.n_kv_heads = c.n_heads;
  read_key(j, source, "n_kv_heads", c.n_kv_heads);
  read_key(j, source, "head_dim", c.head_dim);
  c.v_head_dim = c.head_dim;
  read_key(j, source, "v_head_dim", c.v_head_dim);
  read_key(j, source, "rope_base", c.rope_base);
  read_key(j, source, "attn_conv_size", c.attn_conv_size);
  read_key(j, source, "gdn_heads", c.gdn_heads);
  read_key(j, source, "gdn_head_dim", c.gdn_head_dim);
  c.gdn_v_head_dim = c.gdn_head_dim;
  read_key(j, source, "gdn_v_head_dim", c.gdn_v_head_dim);
  read_key(j, source, "conv_size", c.conv_size);
  read_key(j, source, "gdn_keep_chunk_states", c.gdn_keep_chunk_states);
  read_key(j, source, "gsa_every", c.gsa_every);
  read_choice(j, source, "router",
              std::map<std::string, RouterKind>{{"fit_error", RouterKind::FitError},
                                                {"input_shallow", RouterKind::InputShallow},
                                                {"input_deep", RouterKind::InputDeep}},
              c.router);
  read_key(j, source, "router_hidden", c.router_hidden);
  read_choice(j, source, "router_aggregate",
              std::map<std::string, HeadAggregate>{{"min", HeadAggregate::Min},
                                                   {"max", HeadAggregate::Max}},
              c.router_aggregate);
  read_key(j, source, "eda", c.eda);
  read_key(j, source, "tau", c.tau);
  read_key(j, source, "learn_tau", c.learn_tau);
  if (j.contains("kv_target")) {
    const auto& v = j["kv_target"];
    if (v.is_number()) {
      c.kv_target = {v.get<double>()};
    } else {
      HAM_CHECK(v.is_array() && !v.empty(), source,
                ": key 'kv_target' must be a number or a non-empty array of numbers (one per layer)");
      c.kv_target.clear();
      for (const auto& x : v) {
        HAM_CHECK(x.is_number(), source, ": key 'kv_target' holds a non-number ", x.dump());
        c.kv_target.push_back(x.get<double>());
      }
    }
  }
  read_key(j, source, "tau_freeze_steps", c.tau_freeze_steps);
  read_key(j, source, "tau_gain", c.tau_gain);
  read_key(j, source, "tau_clip", c.tau_clip);
  read_key(j, source, "tau_lr", c.tau_lr);
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  HAM_CHECK(in, path, ": cannot open model config");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    HAM_FAIL(path, ": invalid JSON: ", e.what());
  }
  return from_json(j, path);
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = {{"family", family_name(family)}, {"vocab_size", vocab_size},
                      {"d_model", d_model},           {"n_layers", n_layers},
                      {"d_ff", d_ff},                 {"norm_eps", norm_eps},
                      {"init_std", init_std},         {"recompute", recompute},
                      {"seed", seed}};
  bool attention = family != ModelFamily::GDN;
  bool recurrent = family != ModelFamily::Transformer;
  if (attention) {
    j.update({{"n_heads", n_heads}, {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim},
              {"v_head_dim", v_head_dim}, {"rope_base", rope_base}});
    // Written only when set, so configs and checkpoints from before the key read back equal.
    if (attn_conv_size != 0) j["attn_conv_size"] = attn_conv_size;
  }
  if (recurrent) {
    j.update({{"gdn_heads", gdn_heads}, {"gdn_head_dim", gdn_head_dim},
              {"gdn_v_head_dim", gdn_v_head_dim}, {"conv_size", conv_size},
              {"gdn_keep_chunk_states", gdn_keep_chunk_states}});
  }
  if (family == ModelFamily::GDNGSA) j["gsa_every"] = gsa_every;
  if (family == ModelFamily::HAM) {
    j.update({{"router", router_name(router)}, {"router_hidden", router_hidden},
              {"router_aggregate", router_aggregate == HeadAggregate::Min ? "min" : "max"},
              {"eda", eda}, {"tau", tau}, {"learn_tau", learn_tau},
              {"tau_freeze_steps", tau_freeze_steps}, {"tau_gain", tau_gain},
              {"tau_clip", tau_clip}, {"tau_lr", tau_lr}});
    j["kv_target"] = kv_target.size() == 1 ? nlohmann::json(kv_target[0]) : nlohmann::json(kv_target);
  }
  return j;
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](const char* key, int64_t v) {
    HAM_CHECK(v > 0, source, ": key '", key, "' must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("d_ff", d_ff);
  HAM_CHECK(norm_eps > 0.0, source, ": key 'norm_eps' must be positive, got ", norm_eps);
  HAM_CHECK(init_std > 0.0, source, ": key 'init_std' must be positive, got ", init_std);
  if (family != ModelFamily::GDN) {
    positive("n_heads", n_heads);
    positive("n_kv_heads", n_kv_heads);
    positive("head_dim", head_dim);
    positive("v_head_dim", v_head_dim);
    HAM_CHECK(n_heads % n_kv_heads == 0, source, ": key 'n_kv_heads' (", n_kv_heads,
              ") must divide n_heads (", n_heads, ")");
    HAM_CHECK(head_dim % 2 == 0, source, ": key 'head_dim' must be even for RoPE, got ", head_dim);
    HAM_CHECK(rope_base > 1.0, source, ": key 'rope_base' must be > 1, got ", rope_base);
  }
  HAM_CHECK(attn_conv_size >= 0, source, ": key 'attn_conv_size' must be >= 0, got ", attn_conv_size);
  HAM_CHECK(attn_conv_size == 0 || family == ModelFamily::Transformer ||
                family == ModelFamily::GDNGSA,
            source, ": key 'attn_conv_size' applies to transformer and gdn-gsa attention layers, not to family '",
            family_name(family), "'", family == ModelFamily::HAM ? " (HAM's KV path has its conv of conv_size)" : "");
  if (family != ModelFamily::Transformer) {
    positive("gdn_heads", gdn_heads);
    positive("gdn_head_dim", gdn_head_dim);
    positive("gdn_v_head_dim", gdn_v_head_dim);
    positive("conv_size", conv_size);
  }
  if (family == ModelFamily::GDNGSA) {
    HAM_CHECK(gsa_every >= 1, source, ": key 'gsa_every' must be >= 1, got ", gsa_every);
  }
  if (family == ModelFamily::HAM) {
    // The q/k/v projections are shared by both paths, so their widths must agree.
    HAM_CHECK(n_heads * head_dim == gdn_qk_dim(), source, ": keys 'n_heads' x 'head_dim' (",
              n_heads * head_dim, ") must equal 'gdn_heads' x 'gdn_head_dim' (", gdn_qk_dim(),
              "): HAM shares its q/k projections between the RNN and KV paths");
    HAM_CHECK(n_heads * v_head_dim == gdn_v_dim(), source, ": keys 'n_heads' x 'v_head_dim' (",
              n_heads * v_head_dim, ") must equal 'gdn_heads' x 'gdn_v_head_dim' (", gdn_v_dim(),
              "): HAM shares its v projection between the RNN and KV paths");
    HAM_CHECK(n_kv_heads == n_heads, source, ": key 'n_kv_heads' must equal 'n_heads' for HAM");
    positive("router_hidden", router_hidden);
    HAM_CHECK(!eda || router != RouterKind::FitError, source,
              ": key 'eda' needs a learned router (router input_shallow or input_deep): the "
              "layer-mixing gamma learns only through the router's value scaling");
    HAM_CHECK(tau > 0.0 && tau < tau_scale(), source, ": key 'tau' must lie in (0, ", tau_scale(),
              ") for router '", router_name(router), "', got ", tau);
    HAM_CHECK(kv_target.size() == 1 || int64_t(kv_target.size()) == n_layers, source,
              ": key 'kv_target' must hold one value or one per layer (", n_layers, "), got ",
              kv_target.size());
    for (double t : kv_target) {
      HAM_CHECK(t > 0.0 && t <= 1.0, source, ": key 'kv_target' values must lie in (0, 1], got ", t);
    }
    HAM_CHECK(tau_freeze_steps >= 0, source, ": key 'tau_freeze_steps' must be >= 0");
    HAM_CHECK(tau_gain > 0.0, source, ": key 'tau_gain' must be positive, got ", tau_gain);
    HAM_CHECK(tau_clip > 0.0, source, ": key 'tau_clip' must be positive, got ", tau_clip);
    HAM_CHECK(tau_lr > 0.0, source, ": key 'tau_lr' must be positive, got ", tau_lr);
  }
}

}  // namespace ham

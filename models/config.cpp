#include "models/config.h"

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ham {

const char* family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::Transformer: return "transformer";
  }
  return "unknown";
}

namespace {

template <class T>
void read_key(const nlohmann::json& j, const std::string& source, const char* key, T& out) {
  if (!j.contains(key)) return;
  const auto& v = j.at(key);
  try {
    if constexpr (std::is_same_v<T, bool>) {
      HAM_CHECK(v.is_boolean(), source, ": key '", key, "' must be true or false");
    } else if constexpr (std::is_integral_v<T>) {
      HAM_CHECK(v.is_number_integer(), source, ": key '", key, "' must be an integer, got ",
                v.dump());
    } else if constexpr (std::is_floating_point_v<T>) {
      HAM_CHECK(v.is_number(), source, ": key '", key, "' must be a number, got ", v.dump());
    }
    out = v.get<T>();
  } catch (const nlohmann::json::exception& e) {
    HAM_FAIL(source, ": key '", key, "': ", e.what());
  }
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source) {
  HAM_CHECK(j.is_object(), source, ": model config must be a JSON object");
  static const std::set<std::string> known = {
      "family", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
      "d_ff", "rope_base", "norm_eps", "init_std", "recompute", "seed"};
  for (const auto& item : j.items()) {
    HAM_CHECK(known.count(item.key()), source, ": unknown key '", item.key(), "' in model config");
  }
  ModelConfig c;
  if (j.contains("family")) {
    HAM_CHECK(j["family"].is_string(), source, ": key 'family' must be a string");
    std::string f = j["family"].get<std::string>();
    HAM_CHECK(f == "transformer", source, ": key 'family': unknown model family '", f,
              "' (available: transformer)");
    c.family = ModelFamily::Transformer;
  }
  read_key(j, source, "vocab_size", c.vocab_size);
  read_key(j, source, "d_model", c.d_model);
  read_key(j, source, "n_layers", c.n_layers);
  read_key(j, source, "n_heads", c.n_heads);
  c.n_kv_heads = c.n_heads;
  read_key(j, source, "n_kv_heads", c.n_kv_heads);
  read_key(j, source, "head_dim", c.head_dim);
  read_key(j, source, "d_ff", c.d_ff);
  read_key(j, source, "rope_base", c.rope_base);
  read_key(j, source, "norm_eps", c.norm_eps);
  read_key(j, source, "init_std", c.init_std);
  read_key(j, source, "recompute", c.recompute);
  read_key(j, source, "seed", c.seed);
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
  return {{"family", family_name(family)}, {"vocab_size", vocab_size}, {"d_model", d_model},
          {"n_layers", n_layers},          {"n_heads", n_heads},       {"n_kv_heads", n_kv_heads},
          {"head_dim", head_dim},          {"d_ff", d_ff},             {"rope_base", rope_base},
          {"norm_eps", norm_eps},          {"init_std", init_std},     {"recompute", recompute},
          {"seed", seed}};
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](const char* key, int64_t v) {
    HAM_CHECK(v > 0, source, ": key '", key, "' must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("head_dim", head_dim);
  positive("d_ff", d_ff);
  HAM_CHECK(n_heads % n_kv_heads == 0, source, ": key 'n_kv_heads' (", n_kv_heads,
            ") must divide n_heads (", n_heads, ")");
  HAM_CHECK(head_dim % 2 == 0, source, ": key 'head_dim' must be even for RoPE, got ", head_dim);
  HAM_CHECK(rope_base > 1.0, source, ": key 'rope_base' must be > 1, got ", rope_base);
  HAM_CHECK(norm_eps > 0.0, source, ": key 'norm_eps' must be positive, got ", norm_eps);
  HAM_CHECK(init_std > 0.0, source, ": key 'init_std' must be positive, got ", init_std);
}

}  // namespace ham

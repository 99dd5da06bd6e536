#pragma once
// Model configuration, read from JSON. Unknown keys and out-of-range values are errors
// that name the file and the key, so a typo never silently falls back to a default.
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ham {

enum class ModelFamily { Transformer };
const char* family_name(ModelFamily family);

struct ModelConfig {
  ModelFamily family = ModelFamily::Transformer;
  int64_t vocab_size = 257;
  int64_t d_model = 128;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;   // grouped-query attention when < n_heads
  int64_t head_dim = 32;
  int64_t d_ff = 384;       // SwiGLU hidden size
  double rope_base = 10000.0;
  double norm_eps = 1e-6;
  double init_std = 0.02;
  bool recompute = false;   // activation recompute per block
  uint64_t seed = 0;        // initialisation seed

  // `source` labels errors (a file path or "<embedded>").
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_file(const std::string& path);
  nlohmann::json to_json() const;
  void validate(const std::string& source) const;
};

}  // namespace ham

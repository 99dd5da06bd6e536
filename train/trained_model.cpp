#include "train/trained_model.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "core/safetensors.h"
#include "train/checkpoint.h"

namespace ham {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTrainingPrefix = "training.";

// Entries whose name starts with `prefix`, with the prefix removed.
std::vector<std::pair<std::string, Tensor>> with_prefix_removed(
    const std::vector<std::pair<std::string, Tensor>>& named, const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : named) {
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), t);
  }
  return out;
}

}  // namespace

TrainedModel load_trained_model(const std::string& path) {
  HAM_CHECK(fs::exists(path), path, ": no such model directory");
  TrainedModel out;
  fs::path export_config = fs::path(path) / "config.json";
  if (fs::exists(export_config) && !fs::exists(fs::path(path) / "state.json")) {
    ModelConfig config = ModelConfig::from_file(export_config.string());
    std::vector<std::pair<std::string, Tensor>> all =
        load_safetensors((fs::path(path) / "model.safetensors").string()).tensors;
    std::vector<std::pair<std::string, Tensor>> params;
    for (const auto& entry : all) {
      if (entry.first.rfind(kTrainingPrefix, 0) != 0) params.push_back(entry);
    }
    out.model = make_model(config);
    out.model->load_parameters(params);
    out.model->load_training_state(with_prefix_removed(all, kTrainingPrefix));
    out.source = path;
    if (fs::exists(fs::path(path) / kTokenizerFile)) out.tokenizer = (fs::path(path) / kTokenizerFile).string();
    return out;
  }
  CheckpointContents c = load_checkpoint(path);
  std::string state_file = c.state.value("checkpoint_dir", path) + "/state.json";
  HAM_CHECK(c.state.contains("config"), state_file, ": missing key 'config'");
  ModelConfig config = ModelConfig::from_json(c.state.at("config"), state_file);
  out.model = make_model(config);
  out.model->load_parameters(c.model);
  out.model->load_training_state(with_prefix_removed(c.optimizer, kTrainingPrefix));
  out.source = c.state.value("checkpoint_dir", path);
  out.step = c.state.value("step", int64_t(-1));
  if (!c.tokenizer_json.empty()) out.tokenizer = (fs::path(out.source) / kTokenizerFile).string();
  return out;
}

void export_trained_model(const std::string& dir, const LanguageModel& model, const std::string& tokenizer_json) {
  std::vector<std::pair<std::string, Tensor>> entries = model.named_parameters();
  for (auto& [name, t] : model.training_state()) entries.emplace_back(kTrainingPrefix + name, t);
  export_weights(dir, entries, model.config().to_json(), tokenizer_json);
}

}  // namespace ham

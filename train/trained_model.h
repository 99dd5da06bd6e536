#pragma once
// Loading a trained model for eval, generate, analyze and compare: from a checkpoint
// directory (or the newest checkpoint in an output directory), or from a weights export
// (model.safetensors + config.json, as `ham train --export` writes).
#include <memory>
#include <string>

#include "models/language_model.h"

namespace ham {

struct TrainedModel {
  std::shared_ptr<LanguageModel> model;
  std::string source;  // the directory the weights came from
  int64_t step = -1;   // training step of a checkpoint; -1 for an export
  // The tokenizer saved beside the weights (<source>/tokenizer.json), else "bytes": what
  // eval, generate and analyze read text with unless told otherwise.
  std::string tokenizer = "bytes";
};

// The model with its parameters and non-parameter state (HAM's learned thresholds). Errors
// name the path and what is missing or mismatched.
TrainedModel load_trained_model(const std::string& path);

// Writes what load_trained_model reads back from an export: the parameters, the model's
// training state (prefixed "training."), the config and the tokenizer's text (none for bytes).
void export_trained_model(const std::string& dir, const LanguageModel& model, const std::string& tokenizer_json = "");

}  // namespace ham

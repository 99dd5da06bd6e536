#pragma once
// Checkpoints: one directory per saved step,
//   <out>/step-00000040/model.safetensors      parameters (dotted names)
//                       optimizer.safetensors  AdamW moments + the model's training state
//                       state.json             config, options, step, data RNG, metrics
//                       tokenizer.json         the run's tokenizer, when not bytes
// written into a hidden temporary directory that is renamed into place only when every
// file is complete and synced, so a crash mid-write leaves the previous checkpoint intact.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace ham {

struct CheckpointContents {
  std::vector<std::pair<std::string, Tensor>> model;
  std::vector<std::pair<std::string, Tensor>> optimizer;
  nlohmann::json state;  // step, config, options, data RNG, optimizer step count, ...
  // The text of the tokenizer.json the run's data was encoded with, kept beside the weights
  // so eval, generate and analyze read text as training did; empty for bytes.
  std::string tokenizer_json;
};

// The file name a checkpoint or export keeps its tokenizer under.
inline constexpr const char* kTokenizerFile = "tokenizer.json";
// A run's tokenizer as CheckpointContents::tokenizer_json holds it: "" for "bytes", else
// the file's text.
std::string tokenizer_file_text(const std::string& tokenizer);

// Writes `<out_dir>/step-<step>` atomically, then deletes the oldest checkpoints so at most
// `keep_last` remain (0 keeps all). Returns the checkpoint's directory. `write_more`, when
// given, is called with the temporary directory after the safetensors files and before
// state.json (the other ranks of a sharded run write their files into it then).
std::string save_checkpoint(const std::string& out_dir, int64_t step,
                            const CheckpointContents& contents, int64_t keep_last,
                            const std::function<void(const std::string&)>& write_more = {});
// The temporary directory save_checkpoint writes step `step` into when run by process `pid`.
std::string checkpoint_temporary_dir(const std::string& out_dir, int64_t step, int64_t pid);

// Loads a checkpoint directory, or the newest complete one inside an output directory.
CheckpointContents load_checkpoint(const std::string& path);
// Only its state.json (with "checkpoint_dir" set to the directory it was read from).
nlohmann::json load_checkpoint_state(const std::string& path);

// The complete checkpoint directories in out_dir, oldest first (none if it is not a
// directory).
std::vector<std::string> list_checkpoints(const std::string& out_dir);
// The newest complete checkpoint directory in out_dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& out_dir);

// Deletes every checkpoint in out_dir, complete or not (a run starting again from step 0
// must not leave another run's checkpoints for --resume to find); other files stay.
void remove_checkpoints(const std::string& out_dir);

// Weights-only export other tools read: <dir>/model.safetensors + <dir>/config.json, and
// <dir>/tokenizer.json when tokenizer_json is not empty (else an older one there is removed).
void export_weights(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& params,
                    const nlohmann::json& config, const std::string& tokenizer_json = "");

}  // namespace ham

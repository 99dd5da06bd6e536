#pragma once
// The training loop: sample -> forward -> backward (accumulating over micro-batches) ->
// clip -> AdamW step, with a progress line and periodic validation loss.
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/language_model.h"
#include "train/checkpoint.h"
#include "train/text_data.h"

namespace ham {

struct TrainOptions {
  int64_t steps = 400;
  int64_t batch_size = 8;
  int64_t seq_len = 128;
  int64_t grad_accum = 1;
  double lr = 3e-3;          // peak; the paper's 800M runs use 1e-4
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 20;  // the paper uses 1,024
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip = 1.0;
  int64_t log_every = 20;
  int64_t eval_every = 100;
  int64_t eval_batches = 8;
  uint64_t seed = 0;
  bool skip_nonfinite = false;  // skip a step with a NaN/Inf loss or gradient (default: stop)
  std::string data_path;        // text file or token shards (.bin, globs); "" = embedded corpus
  std::string val_data_path;    // validation shards (text data splits off its own)
  std::string tokenizer = "bytes";  // "bytes" or a tokenizer.json: shards' document-start id
  std::string out_dir;          // checkpoints go here when set
  std::string log_dir;          // metrics.jsonl + TensorBoard events ("" = out_dir, if set)
  int64_t checkpoint_every = 0; // steps between checkpoints (0: only at the end)
  int64_t keep_checkpoints = 3; // newest checkpoints kept (0: all)
  double mix_mqar = 0;          // fraction of training rows drawn from MQAR (Zoology)
  int64_t mqar_pairs = 8;       // key-value pairs per MQAR row (4 x pairs <= seq_len)
  double mix_niah = 0;          // fraction of training rows drawn from RULER NIAH single_1
  double peak_gflops = 0;       // hardware peak for the MFU estimate (0: measure the CPU's)

  nlohmann::json to_json() const;
  // Overrides fields present in `j`; unknown keys are errors naming `source` and the key.
  void update_from_json(const nlohmann::json& j, const std::string& source);
  // update_from_json with a JSON file's contents.
  void update_from_file(const std::string& path);
};

struct TrainResult {
  double first_loss = 0;       // training loss of step 1
  double final_loss = 0;       // mean training loss over the last log window
  double initial_val_loss = 0;
  double final_val_loss = 0;
  int64_t steps = 0;
  int64_t skipped_steps = 0;
  std::vector<double> step_losses;  // training loss of every step run by this call
  std::string last_checkpoint;
};

// Mean loss over up to `max_batches` consecutive windows of `data`, without gradients.
double evaluate(const LanguageModel& model, const TokenSource& data, int64_t batch,
                int64_t seq_len, int64_t max_batches);

// Trains from scratch, or continues from `resume` (a loaded checkpoint) so that the
// losses are bit-identical to an uninterrupted run.
TrainResult train(LanguageModel& model, const TokenSource& train_data,
                  const TokenSource& val_data, const TrainOptions& options, std::ostream& log,
                  const CheckpointContents* resume = nullptr);

}  // namespace ham

#pragma once
// The training loop: sample -> forward -> backward (accumulating over micro-batches) ->
// clip -> AdamW step, with a progress line and periodic validation loss.
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/language_model.h"
#include "train/checkpoint.h"
#include "train/text_data.h"

namespace ham {

namespace dist {
class Communicator;
}

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
  double clip = 1.0;           // global gradient-norm bound (0: no clipping)
  int64_t log_every = 20;
  int64_t eval_every = 100;    // steps between validation losses (0: only at the end)
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
  double mix_mqar = 0;          // fraction of training rows drawn from MQAR (Zoology); with
                                // mix_niah, at most 1 (1: no rows from the data)
  int64_t mqar_pairs = 8;       // key-value pairs per MQAR row (4 x pairs <= seq_len)
  double mix_niah = 0;          // fraction of training rows drawn from RULER NIAH single_1
  double peak_gflops = 0;       // hardware peak for the MFU estimate (0: measure the CPU's)
  // Gradient inspection (train/gradient_monitor.h): per-parameter and per-layer gradient
  // norms (and HAM router statistics) every N steps, 0: never; the gradients of the
  // parameters named (globs, or "score_grad" for HAM's dL/de_t) written at the given steps
  // to <out_dir or log_dir>/grads/step-NNNNNNNN.safetensors.
  int64_t grad_norms_every = 0;
  std::vector<std::string> dump_grads;
  std::vector<int64_t> dump_grads_at;
  // Sharded data parallelism (mpirun -np N; distributed/README.md): "grads" shards the
  // gradients, optimizer state and master weights, "full" the parameters too. Ranks are
  // split into shard groups of shard_group_size (0: all ranks; the ranks of a node for
  // hybrid sharding), replicated across groups. A world of one ignores both.
  std::string shard = "grads";
  int64_t shard_group_size = 0;
  // Where the model trains: "cpu", "cuda" (cuda:<local rank> under mpirun, else cuda:0) or
  // "cuda:N". Parameters, optimizer state and batches live there; checkpoints are on CPU.
  std::string device = "cpu";
  // "f32", or "bf16": mixed precision. Parameters, activations and gradients in bf16 (HAM's
  // learned routers stay f32), f32 master weights and AdamW moments, loss in f32.
  // Checkpoints and the model train() leaves behind hold the f32 master weights.
  std::string precision = "f32";
  // Op profile (core/profiler.h): time every op of N steps (after the first step, where
  // more steps follow), by phase (forward, backward, optimizer) and op; prints a table and
  // writes a Chrome trace to profile_trace ("" = <out_dir>/profile.json, if out_dir is set).
  int64_t profile_steps = 0;
  std::string profile_trace;

  nlohmann::json to_json() const;
  // Overrides fields present in `j`; unknown keys and values out of range (validate) are
  // errors naming `source` and the key.
  void update_from_json(const nlohmann::json& j, const std::string& source);
  // Checks that every number lies in its range (a learning rate finite and positive, betas
  // in [0, 1), ...): a one-line error naming `source` (if any), the key, its flag and the
  // value.
  void validate(const std::string& source) const;
  // update_from_json with a JSON file's contents.
  void update_from_file(const std::string& path);
};

// The whole run's record, from step 1: a resumed run's earlier steps come from its
// checkpoint (state.json's "history"; a checkpoint written before 2026-12-03 has none, and
// the record then starts after the resumed step: recorded_from_step).
struct TrainResult {
  int64_t recorded_from_step = 0;  // the record covers the steps after this one
  double first_loss = 0;       // training loss of the first step not skipped
  double final_loss = 0;       // mean training loss over the last log window
  double initial_val_loss = 0;  // before step 1 (0 without validation data)
  double final_val_loss = 0;
  int64_t steps = 0;
  int64_t skipped_steps = 0;
  // The signal that stopped the run before opt.steps (stop_signals.h), else 0; `steps` is
  // then where it stopped, and last_checkpoint holds that step when out_dir is set.
  int stopped_by_signal = 0;
  std::vector<double> step_losses;  // loss of every recorded step not skipped, in order
  std::string last_checkpoint;
  // The peak of the bytes asked of the training device's pool over the steps (tensors, and
  // on a GPU cuBLASLt's workspace; the largest rank's), validation included.
  int64_t peak_memory_bytes = 0;
  double train_seconds = 0;  // wall time of the steps and validations
};

// The record a checkpoint's state.json keeps of its run up to its step ("history"), with
// steps and last_checkpoint set; errors name `source` and the key. A checkpoint written
// before the history was kept gives only its step and final loss.
TrainResult train_result_at_checkpoint(const nlohmann::json& state, const std::string& source);

// The device `spec` ("cpu", "cuda", "cuda:N") names for a process of local rank
// `local_rank`. Checks that a tensor can be made there; the one-line error names the
// option and why not (a build without CUDA, no visible GPU).
Device resolve_training_device(const std::string& spec, int local_rank);

// The compute dtype the `precision` option names ("f32" or "bf16"); the error names the
// option and the choices.
DType training_dtype(const std::string& precision);

// The batch's tensors on `device` (a no-op when they are there already).
TokenBatch batch_on_device(const TokenBatch& batch, Device device);

// Where the model's parameters are (the CPU for a model without any).
Device model_device(const LanguageModel& model);

// Mean loss over up to `max_batches` consecutive windows of `data`, without gradients,
// on the device of the model's parameters.
double evaluate(const LanguageModel& model, const TokenSource& data, int64_t batch,
                int64_t seq_len, int64_t max_batches);

// Trains from scratch, or continues from `resume` (a loaded checkpoint) so that the
// losses are bit-identical to an uninterrupted run. train() lets go of the checkpoint's
// tensors once the model and optimizer hold their values, so a caller that moves it in
// keeps no second copy of the weights and moments while the run trains (a copy shares
// the tensors, which the caller's object then keeps). With a `world` of N > 1 ranks (every
// rank calls this with a model built from the same config), each rank trains on its
// batch_size / N rows of the global batch with sharded data parallelism; losses, metrics
// and checkpoints are those of the whole job (only rank 0 writes to `log`), and a
// checkpoint resumes on any number of ranks. nullptr: a world of one.
TrainResult train(LanguageModel& model, const TokenSource& train_data,
                  const TokenSource& val_data, const TrainOptions& options, std::ostream& log,
                  std::optional<CheckpointContents> resume = std::nullopt,
                  const std::shared_ptr<dist::Communicator>& world = nullptr);

}  // namespace ham

#pragma once
// One training step of a tiny model on a device, side by side with the same step on the
// CPU: shared by the GPU test (tests/train) and the emulated-device test (tests/device).
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "models/language_model.h"
#include "train/text_data.h"
#include "train/trainer.h"

namespace ham::testing {

inline std::filesystem::path repository_dir() {
#ifdef HAM_SOURCE_DIR
  return HAM_SOURCE_DIR;
#else
  return std::filesystem::path(__FILE__).parent_path().parent_path();
#endif
}

// Every configs/tiny/*.json, sorted by name.
inline std::vector<std::filesystem::path> tiny_config_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(repository_dir() / "configs" / "tiny")) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A few rows of the embedded corpus, on the CPU.
inline TokenBatch corpus_batch(int64_t rows, int64_t seq_len, uint64_t seed) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  Generator gen(seed);
  return train_data.sample(rows, seq_len, gen);
}

// The loss of `batch` and every parameter's gradient after one backward, read back to
// the CPU, in named_parameters() order.
struct StepResult {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> gradients;
};

inline StepResult loss_and_gradients(LanguageModel& model, const TokenBatch& batch) {
  Device device = model.parameters().front().device();
  model.zero_grad();
  Tensor loss = model.loss(batch_on_device(batch, device));
  backward(loss);
  StepResult result;
  result.loss = loss.item();
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor g = grad(p);
    result.gradients.emplace_back(name, g.defined() ? g.to(Device::cpu()) : Tensor());
  }
  return result;
}

// Short training options for device-versus-CPU runs: no validation, no checkpoints.
inline TrainOptions short_run(const std::string& device, int64_t steps) {
  TrainOptions opt;
  opt.device = device;
  opt.steps = steps;
  opt.batch_size = 2;
  opt.seq_len = 32;
  opt.warmup_steps = 1;
  opt.log_every = steps;
  opt.eval_every = steps;
  opt.eval_batches = 1;
  opt.peak_gflops = 1;  // skips measuring the CPU peak
  return opt;
}

}  // namespace ham::testing

#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "core/file_io.h"
#include "models/transformer.h"
#include "tests/error_testing.h"
#include "tests/testing.h"
#include "train/stop_signals.h"
#include "train/trained_model.h"
#include "train/trainer.h"

namespace ham {
namespace {

namespace fs = std::filesystem;

ModelConfig small_config() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.v_head_dim = 16;
  c.d_ff = 48;
  return c;
}

TrainOptions small_options(int64_t steps, const fs::path& out) {
  TrainOptions o;
  o.steps = steps;
  o.batch_size = 2;
  o.seq_len = 24;
  o.log_every = 5;
  o.eval_every = 1000;
  o.warmup_steps = 5;
  o.out_dir = out.string();
  return o;
}

TEST(Checkpoint, ResumeIsBitIdenticalToAnUninterruptedRun) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  fs::path dir_a = testing::fresh_temp_dir("straight"), dir_b = testing::fresh_temp_dir("resumed");

  Transformer straight(small_config());
  TrainResult full = train(straight, train_data, val_data, small_options(40, dir_a), log);

  // A run stopped after step 20 leaves exactly the checkpoint a 40-step run writes at
  // step 20 (the schedule is defined by the total step count), so resume from that one.
  Transformer with_checkpoint(small_config());
  TrainOptions o = small_options(40, dir_b);
  o.checkpoint_every = 20;
  o.keep_checkpoints = 0;
  TrainResult reference = train(with_checkpoint, train_data, val_data, o, log);
  ASSERT_EQ(reference.step_losses, full.step_losses);  // checkpointing changes nothing

  Transformer resumed(small_config());
  CheckpointContents ck = load_checkpoint((dir_b / "step-00000020").string());
  EXPECT_EQ(ck.state.at("step").get<int64_t>(), 20);
  TrainResult rest = train(resumed, train_data, val_data, o, log, ck);
  // The record covers the whole run, its first 20 steps taken from the checkpoint.
  EXPECT_EQ(rest.step_losses, full.step_losses);
  EXPECT_EQ(rest.first_loss, full.first_loss);
  EXPECT_EQ(rest.final_loss, full.final_loss);
  EXPECT_EQ(rest.steps, 40);
  const TrainResult at_checkpoint = train_result_at_checkpoint(ck.state, "state.json");
  EXPECT_EQ(at_checkpoint.steps, 20);
  EXPECT_EQ(at_checkpoint.step_losses,
            std::vector<double>(full.step_losses.begin(), full.step_losses.begin() + 20));
  EXPECT_GT(at_checkpoint.peak_memory_bytes, 0);
  EXPECT_GE(rest.peak_memory_bytes, at_checkpoint.peak_memory_bytes);
  EXPECT_GT(rest.train_seconds, at_checkpoint.train_seconds);
  // And the final weights are identical bit for bit.
  auto pa = straight.named_parameters(), pb = resumed.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>()) << pa[i].first;
  }
  fs::remove_all(dir_a);
  fs::remove_all(dir_b);
}

// A resumed run that was handed its checkpoint holds no copy of it while it trains: its
// peak memory is the uninterrupted run's. A caller that keeps the checkpoint keeps its
// weights and moments in memory, and the peak shows them.
TEST(Checkpoint, AResumedRunHoldsNoCopyOfItsCheckpoint) {
  testing::ScopedThreadCount one_thread(1);  // scratch buffers depend on the threads
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  const fs::path dir = testing::fresh_temp_dir("peak_on_resume");
  TrainOptions o = small_options(20, dir);
  o.checkpoint_every = 10;
  o.keep_checkpoints = 0;
  const std::string step_10 = (dir / "step-00000010").string();
  // One model alive at a time: the peak counts every live tensor of the device's pool.
  TrainResult full, moved, copied;
  {
    Transformer straight(small_config());
    full = train(straight, train_data, val_data, o, log);
  }
  {
    Transformer handed_over(small_config());
    moved = train(handed_over, train_data, val_data, o, log, load_checkpoint(step_10));
  }
  EXPECT_EQ(moved.step_losses, full.step_losses);
  EXPECT_EQ(moved.peak_memory_bytes, full.peak_memory_bytes) << log.str();

  int64_t checkpoint_bytes = 0;
  {
    const CheckpointContents kept = load_checkpoint(step_10);
    for (const auto* tensors : {&kept.model, &kept.optimizer}) {
      for (const auto& [name, t] : *tensors) checkpoint_bytes += t.numel() * int64_t(sizeof(float));
    }
    Transformer kept_by_caller(small_config());
    copied = train(kept_by_caller, train_data, val_data, o, log, kept);
  }
  EXPECT_EQ(copied.step_losses, full.step_losses);
  EXPECT_GE(copied.peak_memory_bytes, full.peak_memory_bytes + checkpoint_bytes);
  fs::remove_all(dir);
}

// The corpus, asking to stop (as a signal handler would) on its `stop_at_read`-th read:
// a stop request arriving in the middle of a chosen step.
class StopRequestingSource final : public TokenSource {
 public:
  StopRequestingSource(const TokenSource& source, int stop_at_read)
      : source_(source), stop_at_read_(stop_at_read) {}
  int64_t size() const override { return source_.size(); }
  int64_t document_start_id() const override { return source_.document_start_id(); }
  void read(int64_t begin, int64_t count, int64_t* out) const override {
    if (++reads_ == stop_at_read_) request_stop(SIGTERM);
    source_.read(begin, count, out);
  }

 private:
  const TokenSource& source_;
  int stop_at_read_;
  mutable int reads_ = 0;
};

TEST(Checkpoint, AStopRequestEndsTheRunBetweenStepsWithACheckpointThatResumesBitForBit) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  fs::path straight_dir = testing::fresh_temp_dir("straight");
  fs::path stopped_dir = testing::fresh_temp_dir("stopped");
  const TrainOptions straight_options = small_options(30, straight_dir);
  Transformer straight(small_config());
  const TrainResult full = train(straight, train_data, val_data, straight_options, log);

  // Each step reads its batch_size windows: the 24th read is in step 12's batch.
  clear_stop_request();
  const StopRequestingSource stopping(train_data, 2 * 12);
  Transformer stopped(small_config());
  const TrainOptions options = small_options(30, stopped_dir);
  const TrainResult part = train(stopped, stopping, val_data, options, log);
  clear_stop_request();
  EXPECT_EQ(part.stopped_by_signal, SIGTERM);
  ASSERT_EQ(part.steps, 12);  // the step in progress finished; none began after it
  EXPECT_EQ(part.last_checkpoint, (stopped_dir / "step-00000012").string());
  EXPECT_NE(log.str().find("step    12/30 | stopping: SIGTERM received"), std::string::npos)
      << log.str();

  CheckpointContents checkpoint = load_checkpoint(part.last_checkpoint);
  Transformer resumed(small_config());
  const TrainResult rest = train(resumed, train_data, val_data, options, log, checkpoint);
  EXPECT_EQ(rest.stopped_by_signal, 0);
  EXPECT_EQ(rest.step_losses, full.step_losses);
  fs::remove_all(straight_dir);
  fs::remove_all(stopped_dir);
}

TEST(Checkpoint, AStopRequestBeforeTheFirstStepRunsNoneAndWritesNothing) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  fs::path dir = testing::fresh_temp_dir("stopped_at_once");
  request_stop(SIGINT);
  Transformer model(small_config());
  const TrainResult result = train(model, train_data, val_data, small_options(30, dir), log);
  clear_stop_request();
  EXPECT_EQ(result.stopped_by_signal, SIGINT);
  EXPECT_EQ(result.steps, 0);
  EXPECT_TRUE(result.last_checkpoint.empty());
  EXPECT_FALSE(fs::exists(dir / "step-00000000"));
  fs::remove_all(dir);
}

TEST(Checkpoint, AHistoryThatDoesNotAddUpToTheStepIsNamed) {
  nlohmann::json state = {{"step", 3}, {"train_loss", 2.5}};
  const TrainResult without = train_result_at_checkpoint(state, "old/state.json");
  EXPECT_EQ(without.steps, 3);  // written before histories were kept
  EXPECT_EQ(without.recorded_from_step, 3);
  EXPECT_TRUE(without.step_losses.empty());
  state["history"] = {{"recorded_from_step", 0},
                      {"first_loss", 3.0},      {"initial_val_loss", nullptr},
                      {"final_val_loss", 0.0},  {"skipped_steps", 1},
                      {"step_losses", {3.0, 2.5}}, {"peak_memory_bytes", 10},
                      {"train_seconds", 1.5}};
  const TrainResult with = train_result_at_checkpoint(state, "a/state.json");
  EXPECT_EQ(with.step_losses, (std::vector<double>{3.0, 2.5}));
  EXPECT_TRUE(std::isnan(with.initial_val_loss));
  state["history"]["skipped_steps"] = 0;
  testing::expect_error([&] { train_result_at_checkpoint(state, "b/state.json"); },
                        {"b/state.json", "history.step_losses holds 2 losses", "3 steps"});
  state["history"]["recorded_from_step"] = 1;  // resumed from a checkpoint without history
  EXPECT_EQ(train_result_at_checkpoint(state, "d/state.json").recorded_from_step, 1);
  state["history"].erase("train_seconds");
  testing::expect_error([&] { train_result_at_checkpoint(state, "c/state.json"); },
                        {"c/state.json", "train_seconds"});
}

// A checkpoint written before runs kept their record resumes with a record of the steps
// after it, which its own checkpoints carry on.
TEST(Checkpoint, ACheckpointWithoutHistoryResumesWithTheRecordOfTheStepsAfterIt) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  const fs::path dir = testing::fresh_temp_dir("without_history");
  TrainOptions o = small_options(12, dir);
  o.checkpoint_every = 4;
  o.keep_checkpoints = 0;
  Transformer straight(small_config());
  const TrainResult full = train(straight, train_data, val_data, o, log);

  CheckpointContents old = load_checkpoint((dir / "step-00000004").string());
  old.state.erase("history");
  Transformer resumed(small_config());
  const TrainResult after_old = train(resumed, train_data, val_data, o, log, old);
  EXPECT_EQ(after_old.recorded_from_step, 4);
  EXPECT_EQ(after_old.step_losses,
            std::vector<double>(full.step_losses.begin() + 4, full.step_losses.end()));
  EXPECT_EQ(after_old.first_loss, full.step_losses[4]);

  // Its step-8 checkpoint records steps 5 to 8, and resuming from it gives 5 to 12.
  CheckpointContents later = load_checkpoint((dir / "step-00000008").string());
  Transformer again(small_config());
  const TrainResult after_later = train(again, train_data, val_data, o, log, later);
  EXPECT_EQ(after_later.recorded_from_step, 4);
  EXPECT_EQ(after_later.step_losses, after_old.step_losses);
  fs::remove_all(dir);
}

TEST(Checkpoint, HamWithLearnedThresholdResumesBitForBit) {
  // The learned thresholds and their own AdamW are training state outside the parameters.
  ModelConfig c = ModelConfig::from_file(std::string(HAM_SOURCE_DIR) + "/configs/tiny/ham-learned-tau.json");
  c.d_model = 32;
  c.gdn_heads = 1;
  c.gdn_head_dim = 16;
  c.gdn_v_head_dim = 24;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.v_head_dim = 12;
  c.d_ff = 48;
  c.tau_freeze_steps = 5;
  c.tau_lr = 0.05;
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  fs::path dir = testing::fresh_temp_dir("ham_resume");
  TrainOptions o = small_options(40, dir);
  o.checkpoint_every = 20;
  o.keep_checkpoints = 0;
  auto straight = make_model(c);
  TrainResult full = train(*straight, train_data, val_data, o, log);
  auto resumed = make_model(c);
  CheckpointContents ck = load_checkpoint((dir / "step-00000020").string());
  bool has_threshold_state = false;
  for (const auto& [name, t] : ck.optimizer) has_threshold_state |= name.find("p_tau") != std::string::npos;
  EXPECT_TRUE(has_threshold_state) << "the checkpoint holds no learned threshold";
  TrainResult rest = train(*resumed, train_data, val_data, o, log, ck);
  EXPECT_EQ(rest.step_losses, full.step_losses);
  auto ra = straight->routing(), rb = resumed->routing();
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t i = 0; i < ra.size(); ++i) EXPECT_EQ(ra[i].tau, rb[i].tau) << "layer " << i;
  fs::remove_all(dir);
}

TEST(Checkpoint, SyntheticTaskMixtureResumesBitForBit) {
  // MQAR and NIAH rows are drawn with the trainer's data generator, which is checkpointed.
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  fs::path dir = testing::fresh_temp_dir("mixture");
  TrainOptions o = small_options(16, dir);
  o.seq_len = 384;
  o.mix_mqar = 0.3;
  o.mix_niah = 0.3;
  o.checkpoint_every = 8;
  o.keep_checkpoints = 0;
  Transformer straight(small_config());
  TrainResult full = train(straight, train_data, val_data, o, log);
  Transformer resumed(small_config());
  CheckpointContents ck = load_checkpoint((dir / "step-00000008").string());
  TrainResult rest = train(resumed, train_data, val_data, o, log, ck);
  EXPECT_EQ(rest.step_losses, full.step_losses);
  fs::remove_all(dir);
}

TEST(Checkpoint, KeepsOnlyTheNewest) {
  fs::path dir = testing::fresh_temp_dir("keep");
  CheckpointContents c;
  c.model = {{"w", Tensor::full({2}, 1.0)}};
  c.state = {{"step", 0}};
  for (int step = 1; step <= 5; ++step) save_checkpoint(dir.string(), step, c, 2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000004", "step-00000005"}));
  EXPECT_EQ(*latest_checkpoint(dir.string()), (dir / "step-00000005").string());
  fs::remove_all(dir);
}

TEST(Checkpoint, AFailedWriteLeavesThePreviousCheckpointIntact) {
  fs::path dir = testing::fresh_temp_dir("atomic");
  CheckpointContents good;
  good.model = {{"w", Tensor::full({3}, 2.0)}};
  good.state = {{"step", 1}};
  save_checkpoint(dir.string(), 1, good, 0);
  CheckpointContents bad = good;
  bad.model.push_back({"w", Tensor::full({3}, 5.0)});  // duplicate name: the write throws
  EXPECT_THROW(save_checkpoint(dir.string(), 1, bad, 0), Error);
  CheckpointContents back = load_checkpoint(dir.string());
  EXPECT_EQ(back.model.at(0).second.to_vector<float>(), (std::vector<float>{2, 2, 2}));
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos)
        << "temporary left behind: " << e.path();
  }
  fs::remove_all(dir);
}

// A flipped bit in the newest checkpoint's optimizer moments: loading it fails with one
// line that names the file and the checkpoint before it, which still loads.
TEST(Checkpoint, ADamagedFileIsNamedWithTheCheckpointBeforeIt) {
  fs::path dir = testing::fresh_temp_dir("damaged");
  CheckpointContents c;
  c.model = {{"w", Tensor::full({3}, 2.0)}};
  c.optimizer = {{"w.exp_avg", Tensor::full({64}, 0.5)}};
  for (int step = 1; step <= 2; ++step) {
    c.state = {{"step", step}};
    save_checkpoint(dir.string(), step, c, 0);
  }
  const fs::path damaged = dir / "step-00000002" / "optimizer.safetensors";
  std::string bytes;
  {
    std::ifstream in(damaged, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 5] = char(bytes[bytes.size() - 5] ^ 0x01);
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes;
  try {
    load_checkpoint(dir.string());
    FAIL() << "a damaged checkpoint loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.rfind(damaged.string(), 0), 0u) << message;
    EXPECT_NE(message.find("fails its checksum"), std::string::npos) << message;
    EXPECT_NE(message.find("the checkpoint before it: " + (dir / "step-00000001").string()),
              std::string::npos)
        << message;
  }
  CheckpointContents earlier = load_checkpoint((dir / "step-00000001").string());
  EXPECT_EQ(earlier.state.at("step"), 1);
  EXPECT_EQ(earlier.optimizer.at(0).second.to_vector<float>(), std::vector<float>(64, 0.5f));
  fs::remove_all(dir);
}

// A run on a tokenizer keeps a copy of its tokenizer.json in every checkpoint and export,
// and load_trained_model points eval, generate and analyze at it; a
// bytes run keeps none, and its export removes an older export's.
TEST(Checkpoint, CheckpointsAndExportsKeepTheRunsTokenizer) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  fs::path dir = testing::fresh_temp_dir("tokenizer_kept");
  fs::create_directories(dir);
  const std::string tokenizer_path = std::string(HAM_SOURCE_DIR) + "/tests/data/tokenizers/byte_level_bpe.json";
  const std::string tokenizer_text = read_file(tokenizer_path, "the fixture");
  fs::copy_file(tokenizer_path, dir / "run_tokenizer.json");
  TrainOptions o = small_options(4, dir / "run");
  o.tokenizer = (dir / "run_tokenizer.json").string();  // the token ids below are bytes: any vocabulary holds them
  o.checkpoint_every = 2;
  ModelConfig config = small_config();
  Transformer model(config);
  std::ostringstream log;
  TrainResult r = train(model, train_data, val_data, o, log);
  write_file_atomically(o.tokenizer, "changed after the run");  // the checkpoints keep their copies
  ASSERT_EQ(list_checkpoints(o.out_dir).size(), 2u);
  for (const std::string& checkpoint : list_checkpoints(o.out_dir)) {
    EXPECT_EQ(read_file(checkpoint + "/tokenizer.json", "the kept tokenizer"), tokenizer_text) << checkpoint;
    EXPECT_EQ(load_checkpoint(checkpoint).tokenizer_json, tokenizer_text);
    TrainedModel trained = load_trained_model(checkpoint);
    EXPECT_EQ(trained.tokenizer, checkpoint + "/tokenizer.json");
  }
  EXPECT_EQ(load_trained_model(o.out_dir).tokenizer, r.last_checkpoint + "/tokenizer.json");

  const std::string exported = (dir / "export").string();
  export_trained_model(exported, model, tokenizer_text);
  EXPECT_EQ(load_trained_model(exported).tokenizer, exported + "/tokenizer.json");
  export_trained_model(exported, model);  // now a bytes model
  EXPECT_FALSE(fs::exists(exported + "/tokenizer.json"));
  EXPECT_EQ(load_trained_model(exported).tokenizer, "bytes");

  TrainOptions bytes = small_options(2, dir / "bytes");
  Transformer bytes_model(config);
  train(bytes_model, train_data, val_data, bytes, log);
  EXPECT_FALSE(fs::exists(fs::path(latest_checkpoint(bytes.out_dir).value()) / "tokenizer.json"));
  EXPECT_EQ(load_trained_model(bytes.out_dir).tokenizer, "bytes");
  fs::remove_all(dir);
}

TEST(Checkpoint, MissingCheckpointIsNamed) {
  fs::path dir = testing::fresh_temp_dir("empty");
  fs::create_directories(dir);
  try {
    load_checkpoint(dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(TrainOptions, JsonRoundTripAndUnknownKeys) {
  TrainOptions o;
  o.steps = 17;
  o.lr = 1e-4;
  o.out_dir = "x";
  TrainOptions back;
  back.update_from_json(o.to_json(), "state.json");
  EXPECT_EQ(back.to_json(), o.to_json());
  EXPECT_THROW(back.update_from_json({{"stepz", 3}}, "state.json"), Error);
  EXPECT_THROW(back.update_from_json({{"steps", "many"}}, "state.json"), Error);
}

}  // namespace
}  // namespace ham

#include "train/stop_signals.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <sstream>
#include <string>

#include "models/transformer.h"
#include "tests/testing.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace ham {
namespace {

namespace fs = std::filesystem;

TEST(StopSignals, ASignalIsRecordedNotFatal) {
  StopSignals handlers;
  EXPECT_EQ(stop_requested(), 0);
  ASSERT_EQ(::raise(SIGTERM), 0);
  EXPECT_EQ(stop_requested(), SIGTERM);
  EXPECT_STREQ(stop_signal_name(stop_requested()), "SIGTERM");
  clear_stop_request();
}

TEST(StopSignals, ASecondSignalEndsTheProcessAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopSignals handlers;
        ::raise(SIGINT);
        if (stop_requested() != SIGINT) std::_Exit(3);
        ::raise(SIGINT);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
}

std::atomic<int> earlier_handler_calls{0};
extern "C" void count_earlier_handler_call(int) { ++earlier_handler_calls; }

TEST(StopSignals, LeavingScopeRestoresTheEarlierHandler) {
  struct sigaction counting {}, previous {};
  counting.sa_handler = count_earlier_handler_call;
  sigemptyset(&counting.sa_mask);
  ASSERT_EQ(::sigaction(SIGTERM, &counting, &previous), 0);
  {
    StopSignals handlers;
    ::raise(SIGTERM);
    EXPECT_EQ(earlier_handler_calls.load(), 0);
  }
  clear_stop_request();
  ::raise(SIGTERM);
  EXPECT_EQ(earlier_handler_calls.load(), 1);
  ASSERT_EQ(::sigaction(SIGTERM, &previous, nullptr), 0);
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

ModelConfig tiny_transformer() {
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

TrainOptions options_writing_to(const fs::path& out) {
  TrainOptions o;
  o.steps = 30;
  o.batch_size = 2;
  o.seq_len = 24;
  o.log_every = 5;
  o.eval_every = 1000;
  o.warmup_steps = 5;
  o.out_dir = out.string();
  return o;
}

TEST(StopSignals, TrainingStopsBetweenStepsWithACheckpointThatResumesBitForBit) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  fs::path straight_dir = testing::fresh_temp_dir("straight");
  fs::path stopped_dir = testing::fresh_temp_dir("stopped");
  const TrainOptions straight_options = options_writing_to(straight_dir);
  Transformer straight(tiny_transformer());
  const TrainResult full = train(straight, train_data, val_data, straight_options, log);

  // Each step reads its batch_size windows: the 24th read is in step 12's batch.
  clear_stop_request();
  const StopRequestingSource stopping(train_data, 2 * 12);
  Transformer stopped(tiny_transformer());
  const TrainOptions options = options_writing_to(stopped_dir);
  const TrainResult part = train(stopped, stopping, val_data, options, log);
  clear_stop_request();
  EXPECT_EQ(part.stopped_by_signal, SIGTERM);
  ASSERT_EQ(part.steps, 12);  // the step in progress finished; none began after it
  EXPECT_EQ(part.last_checkpoint, (stopped_dir / "step-00000012").string());
  EXPECT_NE(log.str().find("step    12/30 | stopping: SIGTERM received"), std::string::npos)
      << log.str();

  CheckpointContents checkpoint = load_checkpoint(part.last_checkpoint);
  Transformer resumed(tiny_transformer());
  const TrainResult rest = train(resumed, train_data, val_data, options, log, &checkpoint);
  EXPECT_EQ(rest.stopped_by_signal, 0);
  ASSERT_EQ(rest.step_losses.size(), 18u);
  for (size_t i = 0; i < rest.step_losses.size(); ++i) {
    EXPECT_EQ(rest.step_losses[i], full.step_losses[12 + i]) << "step " << 13 + i;
  }
  fs::remove_all(straight_dir);
  fs::remove_all(stopped_dir);
}

TEST(StopSignals, ARequestBeforeTheFirstStepRunsNoneAndWritesNothing) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  std::ostringstream log;
  fs::path dir = testing::fresh_temp_dir("stopped_at_once");
  request_stop(SIGINT);
  Transformer model(tiny_transformer());
  const TrainResult result = train(model, train_data, val_data, options_writing_to(dir), log);
  clear_stop_request();
  EXPECT_EQ(result.stopped_by_signal, SIGINT);
  EXPECT_EQ(result.steps, 0);
  EXPECT_TRUE(result.last_checkpoint.empty());
  EXPECT_FALSE(fs::exists(dir / "step-00000000"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ham

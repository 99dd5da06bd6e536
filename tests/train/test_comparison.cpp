#include "train/comparison.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "tests/error_testing.h"
#include "tests/testing.h"
#include "train/plot.h"
#include "train/stop_signals.h"
#include "train/synthetic.h"

namespace ham {
namespace {

using testing::expect_error;
namespace fs = std::filesystem;

const std::string kTiny = std::string(HAM_SOURCE_DIR) + "/configs/tiny/";

nlohmann::json tiny_spec() {
  return {{"runs", {{"gdn", "gdn.json"}, {"ham", "ham-fixed-tau.json"}}},
          {"train", {{"steps", 3}, {"batch_size", 2}, {"seq_len", 32}, {"mix_mqar", 1},
                     {"mqar_pairs", 4}, {"log_every", 1}, {"peak_gflops", 100}}},
          {"eval", {{"perplexity", false}, {"mqar_lengths", {32}}, {"mqar_pairs", 4},
                    {"samples", 4}, {"batch_size", 4}}}};
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Comparison, SweepRepeatsOnlyHamRunsOncePerValue) {
  nlohmann::json j = tiny_spec();
  j["sweep_kv"] = {0, 0.5, 1};
  CompareSpec spec = CompareSpec::from_json(j, "spec.json", kTiny);
  std::vector<CompareRun> runs = spec.runs();
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].name, "gdn");
  EXPECT_FALSE(runs[0].kv_target);
  EXPECT_EQ(runs[1].name, "ham@kv=0.00");
  EXPECT_EQ(runs[2].name, "ham@kv=0.50");
  EXPECT_EQ(runs[3].name, "ham@kv=1.00");
  EXPECT_TRUE(runs[2].config.learn_tau);
  EXPECT_EQ(runs[2].config.kv_target, std::vector<double>{0.5});
  EXPECT_EQ(spec.train.steps, 3);
  EXPECT_EQ(spec.eval.mqar_lengths, std::vector<int64_t>{32});
}

// rho = 0 and rho = 1 are fixed thresholds at the ends of tau's range: nothing, or every
// token, goes to the KV cache.
TEST(Comparison, KvFractionEndsSelectNothingOrEverything) {
  ModelConfig base = ModelConfig::from_file(kTiny + "ham-fixed-tau.json");
  MqarConfig mqar;
  mqar.vocab_size = base.vocab_size;
  mqar.seq_len = 32;
  mqar.num_pairs = 4;
  TokenBatch batch = mqar_batch(mqar, 0, 2);
  NoGradGuard no_grad;
  for (double rho : {0.0, 1.0}) {
    ModelConfig c = with_kv_fraction(base, rho);
    EXPECT_FALSE(c.learn_tau);
    auto model = make_model(c);
    model->forward(batch);
    for (const LayerRouting& layer : model->routing()) {
      EXPECT_DOUBLE_EQ(layer.kv_fraction, rho) << "layer " << layer.layer;
    }
  }
}

TEST(Comparison, BadSpecsNameTheFileAndKey) {
  nlohmann::json unknown = tiny_spec();
  unknown["sweep"] = {0.5};
  expect_error([&] { CompareSpec::from_json(unknown, "spec.json", kTiny); },
               {"spec.json", "unknown key 'sweep'"});
  nlohmann::json sweep = tiny_spec();
  sweep["sweep_kv"] = {0.5, 2};
  expect_error([&] { CompareSpec::from_json(sweep, "spec.json", kTiny); },
               {"spec.json", "sweep_kv", "2"});
  nlohmann::json name = tiny_spec();
  name["runs"]["my run"] = "gdn.json";
  expect_error([&] { CompareSpec::from_json(name, "spec.json", kTiny); },
               {"spec.json", "runs.my run"});
  nlohmann::json train = tiny_spec();
  train["train"]["stepz"] = 3;
  expect_error([&] { CompareSpec::from_json(train, "spec.json", kTiny); },
               {"spec.json", "stepz"});
  nlohmann::json eval = tiny_spec();
  eval["eval"]["mqar_lengths"] = "32";
  expect_error([&] { CompareSpec::from_json(eval, "spec.json", kTiny); },
               {"spec.json", "mqar_lengths"});
  nlohmann::json missing = tiny_spec();
  missing["runs"]["gdn"] = "no-such-config.json";
  expect_error([&] { CompareSpec::from_json(missing, "spec.json", kTiny); },
               {"no-such-config.json"});
  expect_error([] { with_kv_fraction(ModelConfig{}, 0.5); }, {"with_kv_fraction", "transformer"});
  for (const nlohmann::json& seeds :
       {nlohmann::json::array(), nlohmann::json{1, -1}, nlohmann::json{0.5}, nlohmann::json("1")}) {
    nlohmann::json bad = tiny_spec();
    bad["seeds"] = seeds;
    expect_error([&] { CompareSpec::from_json(bad, "spec.json", kTiny); },
                 {"spec.json", "key 'seeds'", "whole number"});
  }
  nlohmann::json twice = tiny_spec();
  twice["seeds"] = {2, 7, 2};
  expect_error([&] { CompareSpec::from_json(twice, "spec.json", kTiny); },
               {"spec.json", "key 'seeds'", "seed 2 is listed twice"});
  nlohmann::json not_a_list = tiny_spec();
  not_a_list["loss_below"] = 1.0;
  expect_error([&] { CompareSpec::from_json(not_a_list, "spec.json", kTiny); },
               {"spec.json", "key 'loss_below'", "list"});
  for (const nlohmann::json& value : {nlohmann::json(0), nlohmann::json(-1.5), nlohmann::json("1")}) {
    nlohmann::json bad = tiny_spec();
    bad["loss_below"] = {1.0, value};
    expect_error([&] { CompareSpec::from_json(bad, "spec.json", kTiny); },
                 {"spec.json", "key 'loss_below'", value.dump(), "not a loss > 0"});
  }
  expect_error([] { check_loss_thresholds({0.5, std::nan("")}, "--loss-below"); },
               {"--loss-below", "nan", "not a loss > 0"});
}

TEST(Comparison, FirstStepBelowAveragesTheLastWindowOfSteps) {
  const std::vector<double> losses = {4, 2, 0.5, 0.5, 3};
  EXPECT_EQ(first_step_below(losses, 1.0, 1), 3);
  EXPECT_EQ(first_step_below(losses, 1.0, 2), 4);         // (2 + 0.5) / 2 at step 3 is not
  EXPECT_EQ(first_step_below(losses, 3.0, 20), 3);  // before a full window, all steps: 6.5 / 3
  EXPECT_EQ(first_step_below(losses, 0.5, 1), std::nullopt);  // equal is not below
  EXPECT_EQ(first_step_below(losses, 5.0, 3), 1);
  EXPECT_EQ(first_step_below({}, 1.0), std::nullopt);
  // A skipped step's NaN keeps only its own windows from counting.
  const std::vector<double> skipped = {4, std::nan(""), 0.5, 0.5};
  EXPECT_EQ(first_step_below(skipped, 1.0, 2), 4);
  expect_error([] { first_step_below({1.0}, 1.0, 0); }, {"first_step_below", "window"});
}

// The report's loss-threshold columns: each run's step, and over seeds the mean of those
// that got there and how many did.
TEST(Comparison, TheReportGivesTheStepEachRunsLossFellBelowAThreshold) {
  CompareSpec spec = CompareSpec::from_json(tiny_spec(), "spec.json", kTiny);
  spec.seeds = {0, 1, 2};
  spec.loss_below = {1.0};
  CompareResult result;
  const std::vector<std::vector<double>> losses = {
      {4, 0, 0, 0, 0, 0},              // gdn@seed=0: means 4, 2, 1.33, 1, 0.8: step 5
      {4, 4, 4, 4, 4, 4},              // gdn@seed=1: never
      {4, 4, 4, 4, 4, 4},              // gdn@seed=2: never
      {0.5, 0.5, 0.5, 0.5, 0.5, 0.5},  // ham@seed=0: step 1
      {2, 0, 0, 0, 0, 0},              // ham@seed=1: means 2, 1, 0.67: step 3
      {1, 1, 1, 1, 1, 1}};             // ham@seed=2: 1 is never below 1
  const std::vector<CompareRun> runs = spec.runs();
  ASSERT_EQ(runs.size(), losses.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    CompareRunResult r;
    r.run = runs[i];
    r.family = family_name(r.run.config.family);
    r.parameters = 100;
    r.mean_kv_fraction = 0.5;
    r.train.step_losses = losses[i];
    result.runs.push_back(r);
  }
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed (scripts/install_deps.sh)";
  const fs::path out = testing::fresh_temp_dir("comparison_loss_below");
  const std::string md = write_comparison_report(spec, result, out.string());
  EXPECT_NE(md.find("first step with loss < 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 5 (1 of 3 seeds) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 ± 1 (2 of 3 seeds) |"), std::string::npos) << md;  // steps 1 and 3
  for (const char* row : {"| gdn@seed=0 | gdn | 100 | 0.500 | 0.6667 | 5 |",
                          "| gdn@seed=1 | gdn | 100 | 0.500 | 4.0000 | - |",
                          "| ham@seed=1 | ham | 100 | 0.500 | 0.3333 | 3 |"}) {
    EXPECT_NE(md.find(row), std::string::npos) << row << " not in:\n" << md;
  }
  std::ifstream json_file(out / "report.json");
  const nlohmann::json report = nlohmann::json::parse(json_file);
  EXPECT_EQ(report["loss_below"], (nlohmann::json{1.0}));
  EXPECT_EQ(report["runs"][4]["first_step_below"],
            (nlohmann::json{{{"loss", 1.0}, {"step", 3}}}));
  EXPECT_TRUE(report["runs"][1]["first_step_below"][0]["step"].is_null());
  const nlohmann::json& ham = report["groups"][1]["metrics"]["first step with loss < 1"];
  EXPECT_EQ(ham["count"], 2);
  EXPECT_EQ(ham["mean"], 2.0);
  EXPECT_EQ(ham["max"], 3.0);
  fs::remove_all(out);
}

TEST(Comparison, SeedsRepeatEveryRunWithThatModelAndDataSeed) {
  nlohmann::json j = tiny_spec();
  j["sweep_kv"] = {0.5};
  j["seeds"] = {3, 5};
  const std::vector<CompareRun> runs = CompareSpec::from_json(j, "spec.json", kTiny).runs();
  ASSERT_EQ(runs.size(), 4u);
  const char* names[] = {"gdn@seed=3", "gdn@seed=5", "ham@kv=0.50@seed=3", "ham@kv=0.50@seed=5"};
  const char* groups[] = {"gdn", "gdn", "ham@kv=0.50", "ham@kv=0.50"};
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].name, names[i]);
    EXPECT_EQ(runs[i].group, groups[i]);
    const uint64_t seed = i % 2 == 0 ? 3 : 5;
    EXPECT_EQ(runs[i].seed, seed) << names[i];
    EXPECT_EQ(runs[i].config.seed, seed) << names[i];
  }
  EXPECT_EQ(runs[2].kv_target, 0.5);
  EXPECT_EQ(runs[3].config.kv_target, std::vector<double>{0.5});
  j.erase("seeds");
  const std::vector<CompareRun> once = CompareSpec::from_json(j, "spec.json", kTiny).runs();
  ASSERT_EQ(once.size(), 2u);
  EXPECT_EQ(once[1].name, "ham@kv=0.50");
  EXPECT_EQ(once[1].group, "ham@kv=0.50");
  EXPECT_FALSE(once[1].seed);
}

// A NIAH length too short for its needles fails before any run trains.
TEST(Comparison, InfeasibleEvaluationFailsBeforeTraining) {
  nlohmann::json j = tiny_spec();
  j["eval"]["niah_tasks"] = {"single_1"};
  j["eval"]["niah_lengths"] = {96};
  CompareSpec spec = CompareSpec::from_json(j, "spec.json", kTiny);
  std::string out = (fs::temp_directory_path() / "ham_test_comparison_infeasible").string();
  std::ostringstream log;
  expect_error([&] { run_comparison(spec, out, log); }, {"spec.json", "single_1", "96"});
  EXPECT_EQ(log.str(), "");  // nothing trained
  fs::remove_all(out);
}

// Unless its eval block says otherwise, a spec's evaluation reads what its runs trained
// on: the training tokenizer, and the training text (its held-out documents) or the
// validation shards. Training shards alone name no held-out data for the perplexity.
TEST(Comparison, TheEvaluationReadsTheTrainingDataAndTokenizerUnlessToldOtherwise) {
  nlohmann::json j = tiny_spec();
  j["train"]["data_path"] = "notes.txt";
  j["train"]["tokenizer"] = "tok.json";
  j["eval"].erase("data_path");
  j["eval"].erase("tokenizer");
  CompareSpec spec = CompareSpec::from_json(j, "spec.json", kTiny);
  EXPECT_EQ(spec.eval.data_path, "notes.txt");
  EXPECT_EQ(spec.eval.tokenizer, "tok.json");
  j["eval"]["data_path"] = "other.txt";
  j["eval"]["tokenizer"] = "bytes";
  spec = CompareSpec::from_json(j, "spec.json", kTiny);
  EXPECT_EQ(spec.eval.data_path, "other.txt");
  EXPECT_EQ(spec.eval.tokenizer, "bytes");
  j["eval"].erase("data_path");
  j["train"]["data_path"] = "x_train_*.bin";
  j["eval"]["perplexity"] = true;
  expect_error([&] { CompareSpec::from_json(j, "spec.json", kTiny); },
               {"spec.json", "train.data_path", "train.val_data_path", "eval.data_path"});
  j["train"]["val_data_path"] = "x_val_000000.bin";
  EXPECT_EQ(CompareSpec::from_json(j, "spec.json", kTiny).eval.data_path, "x_val_000000.bin");
}

TEST(Comparison, ARunWhoseVocabularyCannotHoldTheTextNamesTheRunAndTheData) {
  nlohmann::json small = nlohmann::json::parse(std::ifstream(kTiny + "gdn.json"));
  small["vocab_size"] = 128;
  nlohmann::json j = tiny_spec();
  j["runs"] = {{"small", small}};
  j["train"]["mix_mqar"] = 0;  // rows from the embedded text
  CompareSpec spec = CompareSpec::from_json(j, "spec.json", kTiny);
  std::string out = (fs::temp_directory_path() / "ham_test_comparison_vocab").string();
  fs::remove_all(out);
  std::ostringstream log;
  expect_error([&] { run_comparison(spec, out, log); },
               {"compare run 'small'", "<embedded corpus> is byte-level text", "'vocab_size'",
                "at least 257", "got 128"});
  fs::remove_all(out);
}

// Same data, same budget: two runs of the same config give identical losses; the report
// has a row per run and both plots.
TEST(Comparison, RunsShareDataAndWriteTheReport) {
  // Equal peak memory needs one thread: with more, the gated delta rule's per-head scratch
  // buffers are live at the same time as the threads' timing allows.
  testing::ScopedThreadCount one_thread(1);
  nlohmann::json j = tiny_spec();
  j["runs"] = {{"a", "gdn.json"}, {"b", "gdn.json"}, {"ham", "ham-fixed-tau.json"}};
  CompareSpec spec = CompareSpec::from_json(j, "spec.json", kTiny);
  std::string out = (fs::temp_directory_path() / "ham_test_comparison").string();
  fs::remove_all(out);
  std::ostringstream log;
  CompareResult result = run_comparison(spec, out, log);
  ASSERT_EQ(result.runs.size(), 3u);
  EXPECT_EQ(result.runs[0].train.step_losses, result.runs[1].train.step_losses);
  EXPECT_EQ(result.runs[0].train.peak_memory_bytes, result.runs[1].train.peak_memory_bytes);
  EXPECT_GE(result.runs[0].train.peak_memory_bytes, 4 * 4 * result.runs[0].parameters);
  EXPECT_NE(log.str().find("| peak memory "), std::string::npos) << log.str();
  // The first progress line of each run is repeated in the comparison's log, the next
  // ones only a minute later; train.log has them all.
  EXPECT_NE(log.str().find("[1/3] a: step     1/3 | loss "), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("[1/3] a: step     2/3"), std::string::npos) << log.str();
  const std::string train_log = read_bytes(fs::path(out) / "runs/a/train.log");
  EXPECT_NE(train_log.find("step     3/3 | loss "), std::string::npos) << train_log;
  EXPECT_EQ(result.runs[0].mean_kv_fraction, 0.0);
  EXPECT_GT(result.runs[2].mean_kv_fraction, 0.0);
  ASSERT_EQ(result.runs[2].eval.mqar.size(), 1u);
  EXPECT_EQ(result.runs[2].eval.mqar[0].seq_len, 32);

  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed (scripts/install_deps.sh)";
  std::string md = write_comparison_report(spec, result, out);
  for (const char* row :
       {"| a | gdn |", "| b | gdn |", "| ham | ham |", "MQAR T=32 acc", "peak memory (MiB)"}) {
    EXPECT_NE(md.find(row), std::string::npos) << row << " not in:\n" << md;
  }
  EXPECT_TRUE(is_png_file(out + "/loss_curves.png"));
  EXPECT_TRUE(is_png_file(out + "/kv_tradeoff.png"));
  std::ifstream json_file(out + "/report.json");
  nlohmann::json report = nlohmann::json::parse(json_file);
  EXPECT_EQ(report["runs"].size(), 3u);
  EXPECT_EQ(report["runs"][2]["eval"]["mqar"][0]["seq_len"], 32);
  EXPECT_EQ(report["runs"][2]["peak_memory_bytes"], result.runs[2].train.peak_memory_bytes);
  EXPECT_TRUE(fs::exists(out + "/runs/ham/weights/model.safetensors"));
  fs::remove_all(out);
}

// A rerun on the same directory evaluates the weights of runs that finished with the same
// settings instead of training them again, with identical results; changed training
// settings, or retrain, train again; a damaged record is a one-line error naming it.
TEST(Comparison, ARerunReusesFinishedRunsAndTrainsChangedOnes) {
  CompareSpec spec = CompareSpec::from_json(tiny_spec(), "spec.json", kTiny);
  const std::string out = (fs::temp_directory_path() / "ham_test_comparison_rerun").string();
  fs::remove_all(out);
  std::ostringstream first_log;
  const CompareResult first = run_comparison(spec, out, first_log);
  ASSERT_EQ(first.runs.size(), 2u);

  std::ostringstream again_log;
  const CompareResult again = run_comparison(spec, out, again_log);
  ASSERT_EQ(again.runs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const std::string name = first.runs[i].run.name;
    EXPECT_NE(again_log.str().find("] " + name + ": trained earlier"), std::string::npos)
        << again_log.str();
    EXPECT_EQ(again.runs[i].train.step_losses, first.runs[i].train.step_losses) << name;
    EXPECT_EQ(again.runs[i].train.peak_memory_bytes, first.runs[i].train.peak_memory_bytes);
    EXPECT_EQ(again.runs[i].train.train_seconds, first.runs[i].train.train_seconds) << name;
    EXPECT_EQ(again.runs[i].parameters, first.runs[i].parameters) << name;
    // The reloaded weights evaluate exactly as the freshly trained ones did.
    EXPECT_EQ(again.runs[i].eval.to_json(), first.runs[i].eval.to_json()) << name;
    EXPECT_EQ(again.runs[i].mean_kv_fraction, first.runs[i].mean_kv_fraction) << name;
  }
  EXPECT_EQ(again_log.str().find("training 3 steps"), std::string::npos) << again_log.str();

  std::ostringstream forced_log;
  CompareOptions retrain;
  retrain.retrain = true;
  run_comparison(spec, out, forced_log, retrain);
  EXPECT_EQ(forced_log.str().find("trained earlier"), std::string::npos) << forced_log.str();

  CompareSpec longer = spec;
  longer.train.steps = 4;
  std::ostringstream longer_log;
  const CompareResult extended = run_comparison(longer, out, longer_log);
  EXPECT_NE(longer_log.str().find("holds other settings; training again"), std::string::npos)
      << longer_log.str();
  EXPECT_EQ(extended.runs[0].train.step_losses.size(), 4u);

  const std::string record = out + "/runs/gdn/trained.json";
  std::ifstream record_file(record);
  nlohmann::json without_losses = nlohmann::json::parse(record_file);
  without_losses["result"].erase("step_losses");
  std::ofstream(record) << without_losses.dump();
  std::ostringstream damaged_log;
  expect_error([&] { run_comparison(longer, out, damaged_log); },
               {"runs/gdn/trained.json", "not a training record", "step_losses", "--retrain"});
  std::ofstream(record) << "{\"settings\": ";
  expect_error([&] { run_comparison(longer, out, damaged_log); },
               {"runs/gdn/trained.json", "invalid JSON"});
  fs::remove_all(out);
}

// A run stopped midway (here: crashed after its step-2 checkpoint) resumes from its newest
// checkpoint, and one stopped after its last checkpoint but before its record is only
// evaluated; both give what an uninterrupted comparison gives. A checkpoint of other
// settings is deleted.
TEST(Comparison, ARunStoppedMidwayResumesFromItsNewestCheckpointBitForBit) {
  nlohmann::json j = tiny_spec();
  j["train"]["steps"] = 6;
  // State beyond the parameters: thresholds that move from the first step.
  std::ifstream learned_tau(kTiny + "ham-learned-tau.json");
  j["runs"]["ham"] = nlohmann::json::parse(learned_tau);
  j["runs"]["ham"]["tau_freeze_steps"] = 0;
  const CompareSpec spec = CompareSpec::from_json(j, "spec.json", kTiny);
  const fs::path straight_out = testing::fresh_temp_dir("comparison_straight");
  const fs::path out = testing::fresh_temp_dir("comparison_resumed");
  std::ostringstream straight_log;
  const CompareResult straight = run_comparison(spec, straight_out.string(), straight_log);
  ASSERT_EQ(straight.runs.size(), 2u);
  // What a run leaves behind: its last step's checkpoint, and no other.
  EXPECT_TRUE(fs::exists(straight_out / "runs/gdn/step-00000006/state.json"));
  EXPECT_FALSE(fs::exists(straight_out / "runs/gdn/step-00000002"));

  // Both runs trained as compare trains them, checkpointing every 2 steps; gdn then loses
  // every checkpoint after step 2 and neither writes its record.
  const std::vector<CompareRun> runs = spec.runs();
  for (const CompareRun& run : runs) {
    const fs::path dir = out / "runs" / run.name;
    TrainOptions options = spec.train;
    options.out_dir = dir.string();
    options.checkpoint_every = 2;
    options.keep_checkpoints = 0;
    const TokenStream no_rows(std::vector<int64_t>{});
    std::ostringstream discarded;
    auto model = make_model(run.config);
    train(*model, no_rows, no_rows, options, discarded);
  }
  fs::remove_all(out / "runs/gdn/step-00000004");
  fs::remove_all(out / "runs/gdn/step-00000006");

  std::ostringstream log;
  const CompareResult resumed = run_comparison(spec, out.string(), log);
  ASSERT_EQ(resumed.runs.size(), 2u);
  EXPECT_NE(log.str().find("] gdn: gdn model"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("resuming from " + (out / "runs/gdn/step-00000002").string() +
                           " at step 2 of 6"),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("] ham: trained to its last step earlier"), std::string::npos)
      << log.str();
  // Trained from step 2 on, not from the start (which gives the same losses).
  const std::string gdn_log = read_bytes(out / "runs/gdn/train.log");
  EXPECT_EQ(gdn_log.find("step     1/6 | loss"), std::string::npos) << gdn_log;
  EXPECT_NE(gdn_log.find("resumed from "), std::string::npos) << gdn_log;
  for (size_t i = 0; i < 2; ++i) {
    const std::string name = straight.runs[i].run.name;
    EXPECT_EQ(resumed.runs[i].train.step_losses, straight.runs[i].train.step_losses) << name;
    EXPECT_EQ(resumed.runs[i].train.first_loss, straight.runs[i].train.first_loss) << name;
    EXPECT_EQ(resumed.runs[i].train.final_loss, straight.runs[i].train.final_loss) << name;
    const bool same_weights =  // byte for byte (a failure must not print megabytes)
        read_bytes(out / "runs" / name / "weights/model.safetensors") ==
        read_bytes(straight_out / "runs" / name / "weights/model.safetensors");
    EXPECT_TRUE(same_weights) << name << ": the exported weights differ";
    EvalReport resumed_eval = resumed.runs[i].eval, straight_eval = straight.runs[i].eval;
    resumed_eval.source = straight_eval.source = "";  // the directories differ
    EXPECT_EQ(resumed_eval.to_json(), straight_eval.to_json()) << name;
    EXPECT_TRUE(fs::exists(out / "runs" / name / "trained.json")) << name;
  }
  // The next rerun finds the records.
  std::ostringstream again_log;
  run_comparison(spec, out.string(), again_log);
  EXPECT_EQ(again_log.str().find("resuming"), std::string::npos) << again_log.str();

  // Other settings: the record and every checkpoint of the old ones go.
  CompareSpec longer = spec;
  longer.train.steps = 8;
  fs::remove(out / "runs/gdn/trained.json");
  std::ostringstream longer_log;
  run_comparison(longer, out.string(), longer_log);
  EXPECT_NE(longer_log.str().find("runs/gdn/step-00000006 holds other settings; training "
                                  "from the start"),
            std::string::npos)
      << longer_log.str();
  EXPECT_FALSE(fs::exists(out / "runs/gdn/step-00000002"));
  EXPECT_FALSE(fs::exists(out / "runs/gdn/step-00000006"));
  EXPECT_TRUE(fs::exists(out / "runs/gdn/step-00000008"));
  fs::remove_all(straight_out);
  fs::remove_all(out);
}

// Each seed's run is that seed's training alone (another comparison of the seed alone
// gives it bit for bit), seeds differ, and the report gives every group's mean and sample
// standard deviation over its seeds.
TEST(Comparison, SeededRunsAreReproducibleAndTheReportSummarisesThem) {
  nlohmann::json j = tiny_spec();
  j["seeds"] = {0, 1};
  const CompareSpec spec = CompareSpec::from_json(j, "spec.json", kTiny);
  const fs::path out = testing::fresh_temp_dir("comparison_seeds");
  const fs::path alone_out = testing::fresh_temp_dir("comparison_seed_alone");
  std::ostringstream log;
  const CompareResult result = run_comparison(spec, out.string(), log);
  ASSERT_EQ(result.runs.size(), 4u);
  EXPECT_NE(result.runs[0].train.step_losses, result.runs[1].train.step_losses);
  std::ifstream record_file(out / "runs/gdn_seed1/trained.json");
  const nlohmann::json settings = nlohmann::json::parse(record_file)["settings"];
  EXPECT_EQ(settings["config"]["seed"], 1);  // the initialisation
  EXPECT_EQ(settings["train"]["seed"], 1);   // the rows

  CompareSpec seed_one = spec;
  seed_one.seeds = {1};
  const CompareResult alone = run_comparison(seed_one, alone_out.string(), log);
  ASSERT_EQ(alone.runs.size(), 2u);
  EXPECT_EQ(alone.runs[0].run.name, "gdn@seed=1");
  EXPECT_EQ(alone.runs[0].train.step_losses, result.runs[1].train.step_losses);
  EXPECT_EQ(alone.runs[1].train.step_losses, result.runs[3].train.step_losses);

  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed (scripts/install_deps.sh)";
  const std::string md = write_comparison_report(spec, result, out.string());
  std::ifstream json_file(out / "report.json");
  const nlohmann::json report = nlohmann::json::parse(json_file);
  ASSERT_EQ(report["groups"].size(), 2u);
  const nlohmann::json& ham = report["groups"][1];
  EXPECT_EQ(ham["name"], "ham");
  EXPECT_EQ(ham["runs"], (nlohmann::json{"ham@seed=0", "ham@seed=1"}));
  EXPECT_EQ(ham["seeds"], (nlohmann::json{0, 1}));
  const double a = report["runs"][2]["final_train_loss"], b = report["runs"][3]["final_train_loss"];
  const nlohmann::json& loss = ham["metrics"]["train loss (last 20 steps)"];
  EXPECT_DOUBLE_EQ(loss["mean"].get<double>(), (a + b) / 2);
  EXPECT_DOUBLE_EQ(loss["std"].get<double>(), std::abs(a - b) / std::sqrt(2.0));
  EXPECT_EQ(loss["min"].get<double>(), std::min(a, b));
  EXPECT_EQ(loss["count"], 2);
  EXPECT_EQ(report["runs"][3]["group"], "ham");
  EXPECT_EQ(report["runs"][3]["seed"], 1);
  const std::string row = fmt::format("| ham | ham | 2 | {} | ", result.runs[2].parameters);
  EXPECT_NE(md.find(row), std::string::npos) << md;
  EXPECT_NE(md.find(fmt::format("{:.4f} ± {:.4f}", (a + b) / 2, std::abs(a - b) / std::sqrt(2.0))),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| gdn@seed=1 | gdn |"), std::string::npos) << md;
  std::ifstream csv(out / "loss_curves.csv");
  const std::string curves(std::istreambuf_iterator<char>(csv), {});
  EXPECT_NE(curves.find("ham (mean of 2 seeds)"), std::string::npos) << curves;
  fs::remove_all(out);
  fs::remove_all(alone_out);
}

// A stop request between runs (one that arrived while a run was evaluated) starts no other.
TEST(Comparison, AStopRequestBetweenRunsStartsNoOther) {
  const CompareSpec spec = CompareSpec::from_json(tiny_spec(), "spec.json", kTiny);
  const fs::path out = testing::fresh_temp_dir("comparison_stopped");
  std::ostringstream log;
  request_stop(SIGTERM);
  const CompareResult result = run_comparison(spec, out.string(), log);
  clear_stop_request();
  EXPECT_EQ(result.stopped_by_signal, SIGTERM);
  EXPECT_TRUE(result.runs.empty());
  EXPECT_NE(log.str().find("[1/2] gdn: not started: SIGTERM received"), std::string::npos)
      << log.str();
  EXPECT_FALSE(fs::exists(out / "runs/gdn/trained.json"));
  fs::remove_all(out);
}

}  // namespace
}  // namespace ham

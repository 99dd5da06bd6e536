#include "train/evaluation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "autograd/grad_mode.h"
#include "tests/error_testing.h"
#include "train/tokenizer.h"

namespace ham {
namespace {

using testing::expect_error;

ModelConfig small_config() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.d_ff = 64;
  c.init_std = 0.3;  // logits far enough from uniform that the choices differ
  return c;
}

// A fixture model: at each position it puts logit 1 on the token a rule picks from the row's
// inputs (0 elsewhere; a rule returning -1 leaves the row uniform). With `routes`, it reports
// two layers whose KV fractions are 0.1 x the last batch's rows and 1.
class RuleModel : public LanguageModel {
 public:
  using Rule = std::function<int64_t(const std::vector<int64_t>& row, int64_t t)>;
  RuleModel(int64_t vocab, Rule rule, bool routes = false)
      : LanguageModel(config_with_vocab(vocab)), rule_(std::move(rule)), routes_(routes) {}

  Tensor forward(const TokenBatch& batch) const override {
    const int64_t B = batch.inputs.size(0), T = batch.inputs.size(1), V = config_.vocab_size;
    std::vector<int64_t> inputs = batch.inputs.to_vector<int64_t>();
    std::vector<float> logits(size_t(B * T * V), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> row(inputs.begin() + b * T, inputs.begin() + (b + 1) * T);
      for (int64_t t = 0; t < T; ++t) {
        int64_t token = rule_(row, t);
        if (token >= 0) logits[size_t((b * T + t) * V + token)] = 1.0f;
      }
    }
    last_rows_ = B;
    return Tensor::from_vector(logits, {B, T, V});
  }
  std::vector<LayerRouting> routing() const override {
    if (!routes_) return {};
    return {{0, 0.1 * double(last_rows_), 0.5}, {1, 1.0, 0.5}};
  }

 private:
  static ModelConfig config_with_vocab(int64_t vocab) {
    ModelConfig c;
    c.vocab_size = vocab;
    return c;
  }
  Rule rule_;
  bool routes_;
  mutable int64_t last_rows_ = 0;
};

// Associative recall done right: a token equal to one of the first `pairs` keys (the
// key-value prefix) predicts that key's value; `forget_last` drops the last pair.
RuleModel::Rule recall_rule(int64_t pairs, bool forget_last = false) {
  return [pairs, forget_last](const std::vector<int64_t>& row, int64_t t) -> int64_t {
    // Rows shorter than the prefix (a multiple-choice context) hold fewer pairs.
    for (int64_t i = 0; i < pairs - (forget_last ? 1 : 0) && 2 * i + 1 < int64_t(row.size()); ++i) {
      if (row[size_t(2 * i)] == row[size_t(t)]) return row[size_t(2 * i + 1)];
    }
    return 0;
  };
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("ham_test_evaluation_") + name)).string();
}

std::string write_file(const std::string& name, const std::string& text) {
  std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// ---- perplexity ---------------------------------------------------------------------------

TEST(Evaluation, PerplexityIsExpOfTheMeanTokenLossComputedDirectly) {
  auto model = make_model(small_config());
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 45; ++i) tokens.push_back((i * 37 + 11) % 256);
  TokenStream data(tokens);
  const int64_t seq_len = 8;
  // Windows start at 0, 8, ..., 32: five of them, in batches of 2, 2 and 1.
  PerplexityResult r = evaluate_perplexity(*model, data, 2, seq_len, 0, "numbers");
  EXPECT_EQ(r.sequences, 5);
  EXPECT_EQ(r.tokens, 40);
  EXPECT_EQ(r.data, "numbers");
  EXPECT_TRUE(r.kv_fraction.empty());

  NoGradGuard no_grad;
  double sum = 0;  // -log p(target) over every predicted token, one window at a time
  for (int64_t start = 0; start + seq_len + 1 <= data.size(); start += seq_len) {
    std::vector<float> logits = model->forward(data.batch_at({start}, seq_len)).to_vector<float>();
    const int64_t V = 257;
    for (int64_t t = 0; t < seq_len; ++t) {
      const float* row = logits.data() + t * V;
      double max = *std::max_element(row, row + V), z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - max);
      sum -= double(row[tokens[size_t(start + t + 1)]]) - max - std::log(z);
    }
  }
  EXPECT_NEAR(r.mean_loss, sum / 40.0, 1e-5);
  EXPECT_NEAR(r.perplexity, std::exp(sum / 40.0), 1e-3);

  PerplexityResult first = evaluate_perplexity(*model, data, 2, seq_len, 1);
  EXPECT_EQ(first.sequences, 2);
  EXPECT_EQ(first.tokens, 16);
}

// Bits per byte divide the summed loss by the bytes of text the targets stand for: one per
// byte, none for the document-start token 256.
TEST(Evaluation, BitsPerByteCountOnlyTheTargetsTextBytes) {
  auto model = make_model(small_config());
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 33; ++i) tokens.push_back(i % 8 == 0 ? 256 : (i * 37 + 11) % 256);
  TokenStream data(tokens);
  RawBytesTokenizer bytes;
  PerplexityResult without = evaluate_perplexity(*model, data, 2, 8, 0, "numbers");
  EXPECT_EQ(without.bytes, 0);
  EXPECT_EQ(without.bits_per_byte, 0);
  PerplexityResult r = evaluate_perplexity(*model, data, 2, 8, 0, "numbers", &bytes);
  EXPECT_EQ(r.tokens, 32);
  EXPECT_EQ(r.bytes, 32 - 4);  // targets 1..32; 8, 16, 24 and 32 are document starts
  EXPECT_EQ(r.mean_loss, without.mean_loss);
  EXPECT_NEAR(r.bits_per_byte, r.mean_loss * 32 / (std::log(2.0) * 28), 1e-12);

  ModelConfig wide = small_config();
  wide.vocab_size = 300;
  auto wide_model = make_model(wide);
  TokenStream bpe_ids(std::vector<int64_t>{1, 2, 299, 3, 4, 5, 6, 7, 8, 9});
  expect_error([&] { evaluate_perplexity(*wide_model, bpe_ids, 1, 8, 0, "ids.bin", &bytes); },
               {"ids.bin", "token id 299", "bytes", "--tokenizer"});
}

TEST(Evaluation, PerplexityOnTooLittleDataNamesIt) {
  auto model = make_model(small_config());
  TokenStream data(std::vector<int64_t>{1, 2, 3});
  expect_error([&] { evaluate_perplexity(*model, data, 2, 8, 0, "tiny.txt"); },
               {"tiny.txt", "3 tokens", "seq_len + 1 = 9"});
}

// ---- MQAR ---------------------------------------------------------------------------------

MqarConfig small_mqar() {
  MqarConfig c;
  c.vocab_size = 64;
  c.seq_len = 32;
  c.num_pairs = 4;
  c.seed = 3;
  return c;
}

TEST(Evaluation, MqarOracleScoresOneAndAConstantModelZero) {
  MqarConfig config = small_mqar();
  RuleModel oracle(64, recall_rule(config.num_pairs));
  MqarResult r = evaluate_mqar(oracle, config, 5, 2);
  EXPECT_EQ(r.samples, 5);
  EXPECT_EQ(r.queries, 5 * config.num_pairs);
  EXPECT_EQ(r.accuracy, 1.0);
  EXPECT_EQ(r.sequence_accuracy, 1.0);

  // Values live in [V/2, V), so always answering token 0 is never right.
  RuleModel zeros(64, [](const std::vector<int64_t>&, int64_t) { return int64_t(0); });
  MqarResult z = evaluate_mqar(zeros, config, 5, 2);
  EXPECT_EQ(z.accuracy, 0.0);
  EXPECT_EQ(z.sequence_accuracy, 0.0);
}

TEST(Evaluation, MqarCountsQueriesAndWholeSequencesSeparately) {
  MqarConfig config = small_mqar();
  // Recalls 3 of 4 keys: every query but one per sequence is right, no sequence is.
  RuleModel forgetful(64, recall_rule(config.num_pairs, /*forget_last=*/true));
  MqarResult r = evaluate_mqar(forgetful, config, 4, 3);
  EXPECT_DOUBLE_EQ(r.accuracy, 0.75);
  EXPECT_EQ(r.sequence_accuracy, 0.0);
}

TEST(Evaluation, KvFractionIsTheMeanOverSequences) {
  MqarConfig config = small_mqar();
  RuleModel routed(64, recall_rule(config.num_pairs), /*routes=*/true);
  // Batches of 2, 2 and 1 rows report layer-0 fractions 0.2, 0.2 and 0.1; weighted by rows
  // the mean is (2 x 0.2 + 2 x 0.2 + 0.1) / 5 = 0.18.
  MqarResult r = evaluate_mqar(routed, config, 5, 2);
  ASSERT_EQ(r.kv_fraction.size(), 2u);
  EXPECT_NEAR(r.kv_fraction[0], 0.18, 1e-12);
  EXPECT_NEAR(r.kv_fraction[1], 1.0, 1e-12);
}

// ---- NIAH and generation ------------------------------------------------------------------

TEST(Evaluation, FullForwardCompleterIsGreedyAndStopsAtAStopToken) {
  RuleModel next(16, [](const std::vector<int64_t>& row, int64_t t) {
    return (row[size_t(t)] + 1) % 16;
  });
  Completer complete = full_forward_completer(next, {6});
  EXPECT_EQ(complete({1, 3}, 2), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(complete({1, 3}, 10), (std::vector<int64_t>{4, 5}));  // 6 stops it
  EXPECT_EQ(complete({7}, 3), (std::vector<int64_t>{8, 9, 10}));
  EXPECT_TRUE(complete({7}, 0).empty());
}

TEST(Evaluation, AnswerStopTokensAreEndOfTextNewlinesAndUndecodableIds) {
  RawBytesTokenizer bytes;
  std::vector<int64_t> stops = answer_stop_tokens(bytes, 260);
  EXPECT_EQ(stops, (std::vector<int64_t>{256, '\n', 257, 258, 259}));
}

// A completer that knows the answers: the expected values of each prompt that NiahRun
// `run` builds (regenerated here with the same presets and seeds), written by `answer`.
Completer answering_completer(const NiahRun& run,
                              std::function<std::string(const std::vector<std::string>&)> answer,
                              int64_t* last_max_new_tokens = nullptr) {
  RawBytesTokenizer bytes;
  auto answers = std::make_shared<std::map<std::vector<int64_t>, std::vector<std::string>>>();
  for (int64_t i = 0; i < run.samples; ++i) {
    NiahExample ex = make_niah_example(
        NiahConfig::preset(run.kind, run.context_tokens, run.seed + uint64_t(i)));
    (*answers)[bytes.encode(ex.prompt)] = ex.expected;
  }
  return [answers, answer, last_max_new_tokens](const std::vector<int64_t>& prompt,
                                                 int64_t max_new_tokens) {
    if (last_max_new_tokens) *last_max_new_tokens = max_new_tokens;
    auto found = answers->find(prompt);
    if (found == answers->end()) {
      ADD_FAILURE() << "a prompt the run should not have built";
      return std::vector<int64_t>{};
    }
    return RawBytesTokenizer().encode(answer(found->second));
  };
}

// before + "v1, v2, ..." + after (built with += only: GCC 12 warns falsely on "x" + string).
std::string joined(const std::vector<std::string>& values, const std::string& before = "",
                   const std::string& after = "") {
  std::string out = before;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += values[i];
  }
  out += after;
  return out;
}

TEST(Evaluation, NiahScoresGeneratedAnswersByExactMatch) {
  RawBytesTokenizer bytes;
  RuleModel model(257, [](const std::vector<int64_t>&, int64_t) { return int64_t(0); });
  NiahRun run;
  run.kind = NiahKind::MultiKey1;
  run.context_tokens = 700;
  run.samples = 3;
  run.seed = 5;
  int64_t max_new = 0;
  Completer right = answering_completer(run, [](const std::vector<std::string>& expected) {
    return joined(expected, " ", ".\nThe rest is ignored.");
  }, &max_new);
  NiahResult r = evaluate_niah(model, bytes, right, run);
  EXPECT_EQ(r.task, "multikey_1");
  EXPECT_EQ(r.samples, 3);
  EXPECT_EQ(r.accuracy, 1.0);
  ASSERT_EQ(r.examples.size(), 3u);
  EXPECT_EQ(r.examples[0].output, joined(r.examples[0].expected, " ", "."));  // cut at "\n"
  // A 7-digit number: " 1234567." is 9 bytes, plus the margin.
  EXPECT_EQ(max_new, 9 + run.margin_tokens);
  EXPECT_TRUE(r.kv_fraction.empty());

  Completer wrong = answering_completer(run, [](const std::vector<std::string>&) {
    return std::string(" 0000000.");
  });
  EXPECT_EQ(evaluate_niah(model, bytes, wrong, run).accuracy, 0.0);

  // The right answer only after a newline does not count.
  Completer late = answering_completer(run, [](const std::vector<std::string>& expected) {
    return joined(expected, "\n");
  });
  EXPECT_EQ(evaluate_niah(model, bytes, late, run).accuracy, 0.0);
}

TEST(Evaluation, NiahGivesPartialCreditForSomeOfSeveralValues) {
  RawBytesTokenizer bytes;
  RuleModel routed(257, [](const std::vector<int64_t>&, int64_t) { return int64_t(0); },
                   /*routes=*/true);
  NiahRun run;
  run.kind = NiahKind::MultiValue;  // four values per key
  run.context_tokens = 800;
  run.samples = 2;
  Completer first_only = answering_completer(run, [](const std::vector<std::string>& expected) {
    return joined({expected[0]}, " ", ".");
  });
  NiahResult r = evaluate_niah(routed, bytes, first_only, run);
  EXPECT_DOUBLE_EQ(r.accuracy, 0.25);
  // One forward pass per prompt, one row each: layer 0 reports 0.1.
  ASSERT_EQ(r.kv_fraction.size(), 2u);
  EXPECT_NEAR(r.kv_fraction[0], 0.1, 1e-12);
}

// ---- multiple choice ----------------------------------------------------------------------

TEST(Evaluation, ContinuationTokensFollowTheHarness) {
  RawBytesTokenizer bytes;
  // Trailing white space of the context moves to the continuation; the document-start
  // token leads.
  ContinuationTokens t = continuation_tokens(bytes, "ab ", "c");
  EXPECT_EQ(t.context, (std::vector<int64_t>{256, 'a', 'b'}));
  EXPECT_EQ(t.continuation, (std::vector<int64_t>{' ', 'c'}));
  ContinuationTokens empty = continuation_tokens(bytes, "", "xy");
  EXPECT_EQ(empty.context, (std::vector<int64_t>{256}));
  EXPECT_EQ(empty.continuation, (std::vector<int64_t>{'x', 'y'}));
}

TEST(Evaluation, MultipleChoiceSumsTokenLogLikelihoodsOfEachChoice) {
  auto model = make_model(small_config());
  RawBytesTokenizer bytes;
  std::string path = write_file("choices.jsonl",
      "{\"context\": \"The cat sat on the\", \"choices\": [\" mat\", \" big red dog\"], \"answer\": 0}\n"
      "\n"
      "{\"context\": \"One, two,\", \"choices\": [\" three\", \" 4\", \" five\"], \"answer\": 2, \"id\": 9}\n");
  std::vector<ChoiceExample> examples = load_choice_file(path);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[1].where, path + ":3");

  // Each choice scored directly: one forward over [EOT] + context + choice, summing
  // log softmax at the positions that predict the choice's bytes.
  auto direct = [&](const std::string& context, const std::string& choice) {
    std::vector<int64_t> tokens = {256};
    for (unsigned char c : context + choice) tokens.push_back(c);
    NoGradGuard no_grad;
    std::vector<int64_t> inputs(tokens.begin(), tokens.end() - 1);
    TokenBatch batch{Tensor::from_vector(inputs, {1, int64_t(inputs.size())}), Tensor(),
                     Tensor(), Tensor()};
    std::vector<float> logits = model->forward(batch).to_vector<float>();
    const int64_t V = 257;
    double sum = 0;
    for (size_t p = 1 + context.size(); p < tokens.size(); ++p) {
      const float* row = logits.data() + (p - 1) * V;
      double max = *std::max_element(row, row + V), z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - max);
      sum += double(row[tokens[p]]) - max - std::log(z);
    }
    return sum;
  };
  int64_t correct = 0, correct_norm = 0;
  for (const ChoiceExample& ex : examples) {
    int64_t best = 0, best_norm = 0;
    std::vector<double> ll, norm;
    for (const std::string& choice : ex.choices) {
      ll.push_back(direct(ex.context, choice));
      norm.push_back(ll.back() / double(choice.size()));
      EXPECT_NEAR(continuation_log_likelihood(*model, continuation_tokens(bytes, ex.context, choice)),
                  ll.back(), 1e-4);
      if (ll.back() > ll[size_t(best)]) best = int64_t(ll.size()) - 1;
      if (norm.back() > norm[size_t(best_norm)]) best_norm = int64_t(norm.size()) - 1;
    }
    correct += best == ex.answer;
    correct_norm += best_norm == ex.answer;
  }
  ChoiceResult r = evaluate_multiple_choice(*model, bytes, examples, "choices.jsonl");
  EXPECT_EQ(r.examples, 2);
  EXPECT_DOUBLE_EQ(r.acc, double(correct) / 2);
  EXPECT_DOUBLE_EQ(r.acc_norm, double(correct_norm) / 2);
  std::filesystem::remove(path);
}

TEST(Evaluation, AccNormDividesByTheChoicesLengthInCharacters) {
  RawBytesTokenizer bytes;
  // Logit 1 on 'a' everywhere: log p('a') = 1 - log(e + 256) ~ -4.56, any other byte
  // -log(e + 256) ~ -5.56. " aaaa" sums to ~ -23.8 (-4.76 per character), " b" to ~ -11.1
  // (-5.56 per character): acc takes " b", acc_norm " aaaa".
  RuleModel likes_a(257, [](const std::vector<int64_t>&, int64_t) { return int64_t('a'); });
  std::vector<ChoiceExample> examples = {{"Q:", {" aaaa", " b"}, 1, "hand:1"},
                                         {"Q:", {" aaaa", " b"}, 0, "hand:2"}};
  ChoiceResult r = evaluate_multiple_choice(likes_a, bytes, examples, "hand");
  EXPECT_EQ(r.acc, 0.5);       // right for example 1 only
  EXPECT_EQ(r.acc_norm, 0.5);  // right for example 2 only
  // Uniform logits, every byte costs L = log 257. "\xc3\xa9" (e acute) is 2 bytes and 1
  // character: " e-acute" scores -3L / 2 characters, below " ab" at -3L / 3.
  RuleModel uniform(257, [](const std::vector<int64_t>&, int64_t) { return int64_t(-1); });
  std::vector<ChoiceExample> accented = {{"Q:", {" \xc3\xa9", " ab"}, 1, "hand:3"}};
  EXPECT_EQ(evaluate_multiple_choice(uniform, bytes, accented, "hand").acc_norm, 1.0);
}

TEST(Evaluation, BadChoiceLinesAreOneLineErrorsNamingFileLineAndKey) {
  const std::string good = "{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"answer\": 1}\n";
  struct Case {
    std::string line;
    std::vector<std::string> named;
  };
  std::vector<Case> cases = {
      {"{\"context\": \"a\", \"choices\": [\" b\"", {"not valid JSON"}},
      {"[1, 2]", {"expected a JSON object"}},
      {"{\"context\": \"a\", \"choices\": [\" b\", \" c\"]}", {"key 'answer' is missing"}},
      {"{\"choices\": [\" b\", \" c\"], \"answer\": 0}", {"key 'context' is missing"}},
      {"{\"context\": 3, \"choices\": [\" b\", \" c\"], \"answer\": 0}", {"key 'context' must be a string"}},
      {"{\"context\": \"a\", \"choices\": \" b\", \"answer\": 0}", {"key 'choices'", "at least 2 strings"}},
      {"{\"context\": \"a\", \"choices\": [\" b\", 7], \"answer\": 0}", {"key 'choices'", "entry 1", "string"}},
      {"{\"context\": \"a\", \"choices\": [\" b\", \"\"], \"answer\": 0}", {"key 'choices'", "entry 1", "empty"}},
      {"{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"answer\": 2}", {"key 'answer' (2)", "2 choices"}},
      {"{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"answer\": \"1\"}", {"key 'answer' must be an integer"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string path = write_file("bad_" + std::to_string(i) + ".jsonl", good + cases[i].line + "\n");
    std::vector<std::string> named = cases[i].named;
    named.push_back(path + ":2:");
    expect_error([&] { load_choice_file(path); }, named);
    std::filesystem::remove(path);
  }
  std::string empty = write_file("empty.jsonl", "\n  \n");
  expect_error([&] { load_choice_file(empty); }, {empty, "no examples"});
  std::filesystem::remove(empty);
  expect_error([&] { load_choice_file(temp_path("missing.jsonl")); },
               {"missing.jsonl", "cannot open"});
}

// ---- options and report -------------------------------------------------------------------

TEST(Evaluation, BadOptionsNameTheOption) {
  EvalOptions o;
  o.niah_tasks = {"single_1"};
  expect_error([&] { o.validate(); }, {"niah_tasks", "niah_lengths"});
  o.niah_lengths = {256};
  o.niah_tasks = {"single_9"};
  expect_error([&] { o.validate(); }, {"single_9"});
  o = EvalOptions{};
  o.mqar_pairs = 8;
  o.mqar_lengths = {64, 16};
  expect_error([&] { o.validate(); }, {"mqar_lengths", "16", "4 x mqar_pairs = 32"});
  RuleModel model(257, [](const std::vector<int64_t>&, int64_t) { return int64_t(0); });
  o = EvalOptions{};
  o.perplexity = false;
  o.niah_tasks = {"single_1"};
  o.niah_lengths = {600};
  expect_error([&] { evaluate_model(model, o, Completer()); }, {"NIAH", "completer"});
}

TEST(Evaluation, ReportHasEveryTaskInItsTableAndJson) {
  RuleModel routed(257, recall_rule(4), /*routes=*/true);
  std::string choices = write_file("report.jsonl",
      "{\"context\": \"x\", \"choices\": [\" y\", \" zz\"], \"answer\": 0}\n");
  EvalOptions o;
  o.seq_len = 16;
  o.max_batches = 1;
  o.batch_size = 2;
  o.mqar_lengths = {32};
  o.mqar_pairs = 4;
  o.samples = 2;
  o.niah_tasks = {"single_1"};
  o.niah_lengths = {500};
  o.choice_files = {choices};
  NiahRun run;
  run.kind = NiahKind::Single1;
  run.context_tokens = 500;
  run.samples = 2;
  run.seed = o.seed;
  Completer right = answering_completer(run, [](const std::vector<std::string>& expected) {
    return joined(expected, " ", ".");
  });
  EvalReport report = evaluate_model(routed, o, right);
  ASSERT_TRUE(report.perplexity.has_value());
  EXPECT_NE(report.perplexity->data.find("held-out"), std::string::npos);
  EXPECT_EQ(report.perplexity->sequences, 2);
  ASSERT_EQ(report.mqar.size(), 1u);
  EXPECT_EQ(report.mqar[0].accuracy, 1.0);
  ASSERT_EQ(report.niah.size(), 1u);
  EXPECT_EQ(report.niah[0].accuracy, 1.0);
  ASSERT_EQ(report.choices.size(), 1u);

  nlohmann::json j = report.to_json();
  EXPECT_EQ(j["model"]["family"], "transformer");
  EXPECT_EQ(j["mqar"][0]["seq_len"], 32);
  EXPECT_EQ(j["niah"][0]["task"], "single_1");
  EXPECT_EQ(j["choices"][0]["name"], choices);
  EXPECT_EQ(j["perplexity"]["kv_fraction"].size(), 2u);
  EXPECT_EQ(j["options"]["mqar_pairs"], 4);

  std::string table = report.table();
  for (const char* row : {"perplexity", "mqar 4 pairs", "niah single_1", "choices "}) {
    EXPECT_NE(table.find(row), std::string::npos) << row << " not in:\n" << table;
  }
  // Aligned: the metrics column starts at the same offset on every row.
  std::istringstream lines(table);
  std::string line;
  std::getline(lines, line);  // the model line
  std::getline(lines, line);
  size_t column = line.find("metrics");
  while (std::getline(lines, line)) {
    EXPECT_TRUE(line.compare(column, 4, "loss") == 0 || line.compare(column, 3, "acc") == 0) << table;
  }
  std::filesystem::remove(choices);
}

// The headline numbers come in the table's order under names that say the task and its
// length; the KV fraction is the mean over tasks of each task's mean over layers.
TEST(Evaluation, MetricsNameEveryHeadlineNumberAndTheKvFractionAveragesTasks) {
  EvalReport report;
  EXPECT_TRUE(report.metrics().empty());
  EXPECT_TRUE(std::isnan(report.mean_kv_fraction()));  // no routing: no fraction
  report.perplexity = PerplexityResult{"text", 64, 2, 128, 1.5, 4.5, {0.5, 0.25}, 400, 0.7};
  report.mqar.push_back(MqarResult{32, 4, 8, 32, 0.75, 0.5, {1.0, 0.5}});
  report.niah.push_back(NiahResult{"single_1", 400, 2, 0.5, {0.125, 0.125}, {}});
  report.choices.push_back(ChoiceResult{"c.jsonl", 2, 1.0, 0.5, {}});
  const std::vector<EvalMetric> metrics = report.metrics();
  const std::vector<std::pair<std::string, double>> expected = {
      {"perplexity (T=64)", 4.5}, {"bits per byte (T=64)", 0.7}, {"MQAR T=32 acc", 0.75}, {"MQAR T=32 all-correct", 0.5},
      {"NIAH single_1 T=400", 0.5}, {"c.jsonl acc", 1.0}, {"c.jsonl acc_norm", 0.5}};
  ASSERT_EQ(metrics.size(), expected.size());
  for (size_t i = 0; i < metrics.size(); ++i) {
    EXPECT_EQ(metrics[i].name, expected[i].first);
    EXPECT_EQ(metrics[i].value, expected[i].second) << expected[i].first;
  }
  // (0.375 + 0.75 + 0.125) / 3: the choices reported no fraction and do not count.
  EXPECT_DOUBLE_EQ(report.mean_kv_fraction(), 1.25 / 3);
}

}  // namespace
}  // namespace ham

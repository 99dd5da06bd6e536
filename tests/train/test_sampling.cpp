#include "train/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "autograd/grad_mode.h"
#include "tests/error_testing.h"

namespace ham {
namespace {

std::vector<double> random_logits(int64_t vocab, uint64_t seed, double std = 2.0) {
  Generator gen(seed);
  return normal({vocab}, gen, 0.0, std, DType::F64).to_vector<double>();
}

// Token ids by decreasing logit (ties: lower id first).
std::vector<int64_t> ranked(const std::vector<double>& logits) {
  std::vector<int64_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  return ids;
}

SamplingOptions options_with(double temperature, int64_t top_k = 0, double top_p = 1.0,
                             uint64_t seed = 0) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

TEST(Sampling, GreedyIsArgmaxWithTheLowestIdOnTies) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    std::vector<double> logits = random_logits(40, seed);
    Sampler greedy(options_with(0.0));
    EXPECT_EQ(greedy.next(logits), ranked(logits)[0]);
  }
  EXPECT_EQ(argmax({1.0, 3.0, -INFINITY, 3.0}), 1);
  Sampler greedy(options_with(0.0));
  EXPECT_EQ(greedy.next({1.0, 3.0, -INFINITY, 3.0}), 1);
}

TEST(Sampling, TemperatureNearZeroIsGreedy) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<double> logits = random_logits(50, seed);
    Sampler cold(options_with(1e-6, 0, 1.0, seed));
    EXPECT_EQ(cold.next(logits), argmax(logits)) << "seed " << seed;
  }
}

TEST(Sampling, TopKNeverLeavesTheTopK) {
  std::vector<double> logits = random_logits(50, 3, 0.5);  // flat: many tokens are likely
  std::vector<int64_t> order = ranked(logits);
  std::set<int64_t> top5(order.begin(), order.begin() + 5), seen;
  Sampler sampler(options_with(1.5, 5, 1.0, 11));
  for (int i = 0; i < 2000; ++i) {
    int64_t token = sampler.next(logits);
    ASSERT_TRUE(top5.count(token)) << "token " << token << " is not in the top 5";
    seen.insert(token);
  }
  EXPECT_EQ(seen, top5);  // and every one of them is drawn
}

TEST(Sampling, TopPKeepsTheSmallestSetWithEnoughMass) {
  std::vector<double> logits = random_logits(30, 4);
  const double temperature = 0.8, top_p = 0.6;
  // The full softmax(z / T), most probable first.
  std::vector<int64_t> order = ranked(logits);
  std::vector<double> p;
  double sum = 0;
  for (int64_t id : order) sum += std::exp((logits[size_t(id)] - logits[size_t(order[0])]) / temperature);
  for (int64_t id : order) p.push_back(std::exp((logits[size_t(id)] - logits[size_t(order[0])]) / temperature) / sum);

  auto nucleus = sampling_distribution(logits, options_with(temperature, 0, top_p));
  ASSERT_FALSE(nucleus.empty());
  double mass = 0;
  for (size_t i = 0; i < nucleus.size(); ++i) {
    EXPECT_EQ(nucleus[i].first, order[i]);  // a prefix of the ranking
    mass += p[i];
  }
  EXPECT_GE(mass, top_p);                         // enough mass
  EXPECT_LT(mass - p[nucleus.size() - 1], top_p);  // and no smaller prefix has it
  double renormalised = 0;
  for (size_t i = 0; i < nucleus.size(); ++i) {
    EXPECT_NEAR(nucleus[i].second, p[i] / mass, 1e-12);
    renormalised += nucleus[i].second;
  }
  EXPECT_NEAR(renormalised, 1.0, 1e-12);

  std::set<int64_t> allowed;
  for (const auto& [id, prob] : nucleus) allowed.insert(id);
  Sampler sampler(options_with(temperature, 0, top_p, 5));
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(allowed.count(sampler.next(logits)));
}

TEST(Sampling, FrequenciesFollowTheProbabilities) {
  // softmax(log p) = p for p = (0.1, 0.2, 0.3, 0.4).
  std::vector<double> logits = {std::log(0.1), std::log(0.2), std::log(0.3), std::log(0.4)};
  Sampler sampler(options_with(1.0, 0, 1.0, 8));
  std::map<int64_t, int> counts;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++counts[sampler.next(logits)];
  for (int64_t id = 0; id < 4; ++id) {
    // Binomial standard deviation at p = 0.4 over 20000 draws is 0.0035; allow 5 sigma.
    EXPECT_NEAR(double(counts[id]) / draws, 0.1 * double(id + 1), 0.0175) << "token " << id;
  }
}

TEST(Sampling, ReproducibleWithTheSeed) {
  std::vector<double> logits = random_logits(100, 6, 1.0);
  auto run = [&](uint64_t seed) {
    Sampler sampler(options_with(1.0, 20, 0.9, seed));
    std::vector<int64_t> tokens;
    for (int i = 0; i < 50; ++i) tokens.push_back(sampler.next(logits));
    return tokens;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampling, BadOptionsAreNamed) {
  using testing::expect_error;
  expect_error([] { Sampler s(options_with(-1.0)); }, {"sampling", "temperature", "-1"});
  expect_error([] { Sampler s(options_with(NAN)); }, {"sampling", "temperature", "nan"});
  expect_error([] { Sampler s(options_with(1.0, -2)); }, {"sampling", "top_k", "-2"});
  expect_error([] { Sampler s(options_with(1.0, 0, 0.0)); }, {"sampling", "top_p", "(0, 1]", "0"});
  expect_error([] { Sampler s(options_with(1.0, 0, 1.5)); }, {"sampling", "top_p", "1.5"});
  Sampler sampler(options_with(1.0));
  expect_error([&] { sampler.next(std::vector<double>{0.0, NAN}); }, {"sampling", "token 1", "nan"});
  expect_error([&] { sampler.next(std::vector<double>{}); }, {"sampling", "no logits"});
  expect_error([&] { sampler.next(Tensor::zeros({4})); }, {"Sampler::next", "[4]"});
}

// ---- generate -----------------------------------------------------------------------------

std::shared_ptr<LanguageModel> tiny_model(const std::string& variant) {
  return make_model(ModelConfig::from_file(HAM_SOURCE_DIR "/configs/tiny/" + variant + ".json"));
}

// Greedy continuation by rerunning the full forward on the whole sequence each step; the
// gap between the two largest logits must exceed decoding's rounding (1e-5 relative).
std::vector<int64_t> greedy_by_full_forward(const LanguageModel& model, std::vector<int64_t> tokens,
                                            int64_t steps) {
  NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < steps; ++i) {
    int64_t T = int64_t(tokens.size());
    Tensor logits = model.forward({Tensor::from_vector(tokens, {1, T}), Tensor(), Tensor(), Tensor()});
    std::vector<double> all = logits.to_vector<double>();
    std::vector<double> last(all.end() - model.config().vocab_size, all.end());
    std::vector<double> sorted = last;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    EXPECT_GT(sorted[0] - sorted[1], 1e-4 * std::abs(sorted[0])) << "near-tie at step " << i;
    out.push_back(argmax(last));
    tokens.push_back(out.back());
  }
  return out;
}

TEST(Generate, GreedyContinuationEqualsRepeatedFullForward) {
  std::vector<int64_t> prompt = {256, 72, 101, 108, 108, 111, 32, 119};
  for (const char* variant : {"transformer", "gdn-gsa", "ham-fixed-tau"}) {
    SCOPED_TRACE(variant);
    std::shared_ptr<LanguageModel> model = tiny_model(variant);
    EXPECT_EQ(greedy_continuation(*model, prompt, 8), greedy_by_full_forward(*model, prompt, 8));
  }
}

TEST(Generate, StopsAtTheStopTokenAndReportsTheCache) {
  std::shared_ptr<LanguageModel> model = tiny_model("transformer");
  std::vector<int64_t> prompt = {256, 84, 104, 101};
  std::vector<int64_t> free_run = greedy_continuation(*model, prompt, 6);
  ASSERT_EQ(free_run.size(), 6u);
  std::vector<int64_t> stopped = greedy_continuation(*model, prompt, 6, free_run[2]);
  auto first = std::find(free_run.begin(), free_run.end(), free_run[2]);
  EXPECT_EQ(stopped, std::vector<int64_t>(free_run.begin(), first));

  GenerateOptions options;
  options.max_new_tokens = 5;
  options.sampling = options_with(1.0, 10, 0.95, 3);
  GenerateResult r = generate(*model, prompt, options);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.context_tokens, 4 + 5 - 1);  // the last token is never fed
  for (const LayerCacheStats& s : r.layers) EXPECT_EQ(s.kv_tokens, std::vector<int64_t>{8});
  EXPECT_EQ(r.tokens, generate(*model, prompt, options).tokens);  // seeded
}

TEST(Generate, OnTokenSeesEveryNewTokenInOrderAndNotTheStopToken) {
  std::shared_ptr<LanguageModel> model = tiny_model("ham-fixed-tau");
  const std::vector<int64_t> prompt = {256, 84, 104, 101};
  GenerateOptions options;
  options.max_new_tokens = 7;
  options.sampling = options_with(1.0, 10, 0.95, 5);
  std::vector<int64_t> seen;
  options.on_token = [&](int64_t token) { seen.push_back(token); };
  const GenerateResult free_run = generate(*model, prompt, options);
  EXPECT_EQ(seen, free_run.tokens);
  ASSERT_EQ(seen.size(), 7u);

  seen.clear();
  options.stop_token = free_run.tokens[3];
  const GenerateResult stopped = generate(*model, prompt, options);
  ASSERT_TRUE(stopped.stopped);
  EXPECT_EQ(seen, stopped.tokens);
  EXPECT_LE(seen.size(), 3u);
}

TEST(Generate, BadArgumentsAreNamed) {
  std::shared_ptr<LanguageModel> model = tiny_model("gdn");
  GenerateOptions options;
  testing::expect_error([&] { generate(*model, {}, options); }, {"generate", "prompt"});
  options.max_new_tokens = -1;
  testing::expect_error([&] { generate(*model, {1}, options); }, {"generate", "max_new_tokens", "-1"});
  options.max_new_tokens = 1;
  options.stop_token = 300;
  testing::expect_error([&] { generate(*model, {1}, options); }, {"generate", "stop_token", "300", "257"});
  options.stop_token.reset();
  options.routing.tau = 0.5;
  testing::expect_error([&] { generate(*model, {1}, options); }, {"Decoder", "HAM", "gdn"});
}

}  // namespace
}  // namespace ham

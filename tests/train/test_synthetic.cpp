#include "train/synthetic.h"
#include "tests/error_testing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>
#include <string>

#include "core/error.h"

namespace ham {
namespace {

using testing::error_of;

size_t count_of(const std::string& text, const std::string& piece) {
  size_t count = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) {
    ++count;
  }
  return count;
}

// ---- MQAR --------------------------------------------------------------------------------

TEST(Mqar, ConstraintsHold) {
  MqarConfig config{.vocab_size = 8192, .seq_len = 256, .num_pairs = 16, .power_a = 0.01,
                    .seed = 3};
  const int64_t V = config.vocab_size, T = config.seq_len, N = config.num_pairs;
  for (int64_t index = 0; index < 20; ++index) {
    MqarExample ex = mqar_example(config, index);
    ASSERT_EQ(int64_t(ex.inputs.size()), T);
    ASSERT_EQ(int64_t(ex.targets.size()), T);
    std::set<int64_t> keys, values;
    std::vector<int64_t> value_of(size_t(V), -1);
    for (int64_t i = 0; i < N; ++i) {
      int64_t key = ex.inputs[size_t(2 * i)], value = ex.inputs[size_t(2 * i + 1)];
      EXPECT_GE(key, 1);
      EXPECT_LT(key, V / 2);
      EXPECT_GE(value, V / 2);
      EXPECT_LT(value, V);
      keys.insert(key);
      values.insert(value);
      value_of[size_t(key)] = value;
    }
    EXPECT_EQ(int64_t(keys.size()), N) << "keys repeat in example " << index;
    EXPECT_EQ(int64_t(values.size()), N) << "values repeat in example " << index;

    ASSERT_EQ(int64_t(ex.query_positions.size()), N);
    std::set<int64_t> queried;
    for (int64_t position : ex.query_positions) {
      EXPECT_GE(position, 2 * N);
      EXPECT_LT(position, T);
      EXPECT_EQ((position - 2 * N) % 2, 0) << "queries sit at even offsets after the pairs";
      int64_t key = ex.inputs[size_t(position)];
      ASSERT_TRUE(keys.count(key)) << "position " << position << " holds no key";
      EXPECT_EQ(ex.targets[size_t(position)], value_of[size_t(key)]);
      queried.insert(key);
    }
    EXPECT_EQ(queried, keys) << "every key is queried exactly once";
    int64_t supervised = 0;
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_GE(ex.inputs[size_t(t)], 0);
      EXPECT_LT(ex.inputs[size_t(t)], V);
      if (ex.targets[size_t(t)] != kSyntheticIgnoreIndex) ++supervised;
    }
    EXPECT_EQ(supervised, N) << "only the query positions carry targets";
  }
}

TEST(Mqar, FourPairsPerTokenFitExactly) {
  // 4N == T is the tightest allowed: every gap slot of the query region is used.
  MqarConfig config{.vocab_size = 64, .seq_len = 32, .num_pairs = 8, .seed = 1};
  MqarExample ex = mqar_example(config, 0);
  std::vector<int64_t> expected;
  for (int64_t g = 0; g < 8; ++g) expected.push_back(16 + 2 * g);
  EXPECT_EQ(ex.query_positions, expected);
}

TEST(Mqar, SmallPowerPullsQueriesTowardsThePairs) {
  auto mean_gap = [](double power_a) {
    MqarConfig config{.vocab_size = 8192, .seq_len = 512, .num_pairs = 8, .power_a = power_a,
                      .seed = 7};
    double total = 0;
    int64_t count = 0;
    for (int64_t index = 0; index < 200; ++index) {
      for (int64_t position : mqar_example(config, index).query_positions) {
        total += double(position - 2 * config.num_pairs) / 2;
        ++count;
      }
    }
    return total / double(count);
  };
  double power_law = mean_gap(0.01), uniform = mean_gap(1.0);
  // Uniform gaps over 248 slots average about 124; the power law keeps most gaps short.
  EXPECT_NEAR(uniform, 123.5, 8.0);
  EXPECT_LT(power_law, 0.6 * uniform);
}

TEST(Mqar, DeterministicPerSeedAndIndex) {
  MqarConfig config{.vocab_size = 1024, .seq_len = 128, .num_pairs = 8, .seed = 11};
  MqarExample a = mqar_example(config, 5), b = mqar_example(config, 5);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(a.inputs, mqar_example(config, 6).inputs);
  MqarConfig other = config;
  other.seed = 12;
  EXPECT_NE(a.inputs, mqar_example(other, 5).inputs);

  TokenBatch batch = mqar_batch(config, 4, 3);
  EXPECT_EQ(batch.inputs.shape(), Shape({3, 128}));
  std::vector<int64_t> inputs = batch.inputs.to_vector<int64_t>();
  std::vector<int64_t> targets = batch.targets.to_vector<int64_t>();
  EXPECT_TRUE(std::equal(a.inputs.begin(), a.inputs.end(), inputs.begin() + 128))
      << "row 1 of a batch from index 4 is example 5";
  EXPECT_TRUE(std::equal(a.targets.begin(), a.targets.end(), targets.begin() + 128));
  std::vector<int64_t> positions = batch.positions.to_vector<int64_t>();
  EXPECT_EQ(positions[130], 2);
  for (int64_t doc : batch.doc_ids.to_vector<int64_t>()) EXPECT_EQ(doc, 0);
}

TEST(Mqar, NonQueriesStayZeroWithoutRandomFill) {
  MqarConfig config{.vocab_size = 256, .seq_len = 64, .num_pairs = 4, .seed = 2,
                    .random_non_queries = false};
  MqarExample ex = mqar_example(config, 0);
  std::set<int64_t> queries(ex.query_positions.begin(), ex.query_positions.end());
  for (int64_t t = 8; t < 64; ++t) {
    if (!queries.count(t)) {
      EXPECT_EQ(ex.inputs[size_t(t)], 0) << "position " << t;
    }
  }
}

TEST(Mqar, ErrorsNameTheField) {
  MqarConfig too_many_pairs{.vocab_size = 8192, .seq_len = 64, .num_pairs = 17};
  std::string message = error_of([&] { mqar_example(too_many_pairs, 0); });
  EXPECT_NE(message.find("MqarConfig.num_pairs"), std::string::npos) << message;
  EXPECT_NE(message.find("seq_len = 64"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line";

  MqarConfig small_vocab{.vocab_size = 16, .seq_len = 64, .num_pairs = 8};
  message = error_of([&] { small_vocab.validate(); });
  EXPECT_NE(message.find("MqarConfig.vocab_size"), std::string::npos) << message;

  MqarConfig bad_power{.power_a = 0};
  message = error_of([&] { bad_power.validate(); });
  EXPECT_NE(message.find("MqarConfig.power_a"), std::string::npos) << message;

  MqarConfig fine;
  EXPECT_NO_THROW(fine.validate());
  EXPECT_THROW(mqar_example(fine, -1), Error);
}

// ---- NIAH --------------------------------------------------------------------------------

TEST(Niah, EveryKindContainsItsNeedlesAndQuestion) {
  for (NiahKind kind : all_niah_kinds()) {
    SCOPED_TRACE(std::string(niah_kind_name(kind)));
    NiahConfig config = NiahConfig::preset(kind, 4096, 5);
    NiahExample ex = make_niah_example(config);
    EXPECT_EQ(int64_t(ex.needles.size()), config.num_keys * config.num_values);
    EXPECT_EQ(int64_t(ex.keys.size()), config.num_keys);
    EXPECT_EQ(int64_t(ex.queried_keys.size()), config.num_queries);
    EXPECT_EQ(int64_t(ex.expected.size()), config.num_queries * config.num_values);
    ASSERT_EQ(ex.needle_offsets.size(), ex.needles.size());
    for (size_t i = 0; i < ex.needles.size(); ++i) {
      EXPECT_EQ(ex.prompt.compare(ex.needle_offsets[i], ex.needles[i].size(), ex.needles[i]), 0)
          << "needle " << i << " is not at its offset";
      EXPECT_NE(ex.context.find(ex.needles[i]), std::string::npos);
    }
    // Each expected value sits in a needle of a queried key inside the context.
    for (const auto& value : ex.expected) {
      bool found = false;
      for (const auto& key : ex.queried_keys) {
        std::string needle = niah_needle(config.value_type, key, value);
        found = found || ex.context.find(needle) != std::string::npos;
      }
      EXPECT_TRUE(found) << value << " is not in a needle of a queried key";
    }
    // The prompt ends with the question, which names every queried key.
    ASSERT_GE(ex.prompt.size(), ex.question.size());
    EXPECT_EQ(ex.prompt.substr(ex.prompt.size() - ex.question.size()), ex.question);
    EXPECT_TRUE(ex.question.starts_with("What "));
    for (const auto& key : ex.queried_keys) EXPECT_NE(ex.question.find(key), std::string::npos);
    EXPECT_EQ(ex.question.find('\n'), std::string::npos);
    EXPECT_LE(ex.tokens, 4096);
    EXPECT_GE(ex.tokens, 4096 - 200);
    EXPECT_GT(ex.haystack_units, 0);
  }
}

TEST(Niah, PresetsMatchRuler) {
  auto c = NiahConfig::preset(NiahKind::Single1);
  EXPECT_EQ(c.haystack, NiahHaystack::Noise);
  EXPECT_EQ(c.value_type, NiahValueType::Numbers);
  EXPECT_EQ(NiahConfig::preset(NiahKind::Single3).value_type, NiahValueType::Uuids);
  EXPECT_EQ(NiahConfig::preset(NiahKind::MultiKey1).num_keys, 4);
  EXPECT_EQ(NiahConfig::preset(NiahKind::MultiKey2).haystack, NiahHaystack::Needle);
  c = NiahConfig::preset(NiahKind::MultiKey3);
  EXPECT_EQ(c.key_type, NiahValueType::Uuids);
  EXPECT_EQ(c.value_type, NiahValueType::Uuids);
  EXPECT_EQ(NiahConfig::preset(NiahKind::MultiValue).num_values, 4);
  c = NiahConfig::preset(NiahKind::MultiQuery);
  EXPECT_EQ(c.num_keys, 4);
  EXPECT_EQ(c.num_queries, 4);
}

TEST(Niah, KindNamesRoundTrip) {
  for (NiahKind kind : all_niah_kinds()) {
    EXPECT_EQ(niah_kind_from_name(niah_kind_name(kind)), kind);
    EXPECT_EQ(niah_kind_from_name("niah_" + std::string(niah_kind_name(kind))), kind);
  }
  std::string message = error_of([] { niah_kind_from_name("single_9"); });
  EXPECT_NE(message.find("single_9"), std::string::npos) << message;
  EXPECT_NE(message.find("multiquery"), std::string::npos) << "lists the known tasks";
}

TEST(Niah, NoiseHaystackRepeatsTheParagraph) {
  NiahExample ex = make_niah_example(NiahConfig::preset(NiahKind::Single1, 2000, 1));
  const std::string noise =
      "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
  EXPECT_EQ(int64_t(count_of(ex.context, noise)), ex.haystack_units);
  EXPECT_GT(ex.haystack_units, 15);
}

TEST(Niah, MultiKey2HasDistractorNeedles) {
  NiahExample ex = make_niah_example(NiahConfig::preset(NiahKind::MultiKey2, 3000, 4));
  size_t needles = count_of(ex.context, "One of the special magic numbers for ");
  EXPECT_EQ(int64_t(needles), ex.haystack_units + 1) << "every unit is a distractor needle";
  EXPECT_GT(needles, 20u);
  // Only the real needle names the queried key or carries the answer.
  EXPECT_EQ(count_of(ex.context, " " + ex.queried_keys[0] + " is: "), 1u);
  EXPECT_EQ(count_of(ex.context, ex.expected[0]), 1u);
}

TEST(Niah, ValueFormats) {
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  NiahExample single3 = make_niah_example(NiahConfig::preset(NiahKind::Single3, 2000, 2));
  ASSERT_EQ(single3.expected.size(), 1u);
  EXPECT_TRUE(std::regex_match(single3.expected[0], uuid)) << single3.expected[0];
  NiahExample multikey3 = make_niah_example(NiahConfig::preset(NiahKind::MultiKey3, 2000, 2));
  EXPECT_TRUE(std::regex_match(multikey3.expected[0], uuid)) << multikey3.expected[0];
  EXPECT_TRUE(std::regex_match(multikey3.queried_keys[0], uuid)) << multikey3.queried_keys[0];
  EXPECT_NE(multikey3.question.find("special magic uuid for "), std::string::npos);

  const std::regex seven_digits("[1-9][0-9]{6}");
  const std::regex adjective_noun("[a-z]+-[a-z]+");
  NiahExample multivalue = make_niah_example(NiahConfig::preset(NiahKind::MultiValue, 3000, 2));
  ASSERT_EQ(multivalue.expected.size(), 4u);
  for (const auto& value : multivalue.expected) {
    EXPECT_TRUE(std::regex_match(value, seven_digits)) << value;
  }
  EXPECT_TRUE(std::regex_match(multivalue.queried_keys[0], adjective_noun));

  NiahConfig words = NiahConfig::preset(NiahKind::Single1, 1000, 2);
  words.value_type = NiahValueType::Words;
  NiahExample word_example = make_niah_example(words);
  EXPECT_TRUE(std::regex_match(word_example.expected[0], adjective_noun));
  EXPECT_NE(word_example.expected[0], word_example.queried_keys[0]);
  EXPECT_NE(word_example.context.find("One of the special magic words for "), std::string::npos);
}

TEST(Niah, QuestionTemplates) {
  NiahExample single = make_niah_example(NiahConfig::preset(NiahKind::Single2, 2000, 3));
  const std::string& key = single.queried_keys[0];
  EXPECT_EQ(single.question, "What is the special magic number for " + key +
                                 " mentioned in the provided text? The special magic number "
                                 "for " + key + " mentioned in the provided text is");
  EXPECT_TRUE(single.prompt.starts_with("A special magic number is hidden"));

  NiahExample multi = make_niah_example(NiahConfig::preset(NiahKind::MultiQuery, 3000, 3));
  const auto& q = multi.queried_keys;
  std::string keys = q[0] + ", " + q[1] + ", " + q[2] + ", and " + q[3];
  EXPECT_EQ(multi.question, "What are all the special magic numbers for " + keys +
                                " mentioned in the provided text? The special magic numbers "
                                "for " + keys + " mentioned in the provided text are");
  EXPECT_TRUE(multi.prompt.starts_with("Some special magic numbers are hidden"));
}

TEST(Niah, LengthFillsTheTargetForAnyCounter) {
  // A word counter stands in for a subword tokenizer.
  TokenCounter words = [](std::string_view text) {
    int64_t count = 0;
    bool in_word = false;
    for (char c : text) {
      bool space = c == ' ' || c == '\n';
      if (!space && !in_word) ++count;
      in_word = !space;
    }
    return count;
  };
  for (int64_t target : {500, 4000, 32000}) {
    for (NiahKind kind : {NiahKind::Single1, NiahKind::Single2, NiahKind::MultiKey2}) {
      SCOPED_TRACE(std::string(niah_kind_name(kind)) + " at " + std::to_string(target));
      NiahExample bytes = make_niah_example(NiahConfig::preset(kind, target, 9));
      EXPECT_LE(bytes.tokens, target);
      EXPECT_EQ(bytes.tokens, int64_t(bytes.prompt.size()));
      EXPECT_GE(double(bytes.tokens), target - std::max(200.0, 0.01 * double(target)));

      NiahExample counted = make_niah_example(NiahConfig::preset(kind, target, 9), words);
      EXPECT_LE(counted.tokens, target);
      EXPECT_EQ(counted.tokens, words(counted.prompt));
      EXPECT_GE(double(counted.tokens), target - std::max(40.0, 0.01 * double(target)));
    }
  }
}

TEST(Niah, TooSmallContextNamesTheField) {
  std::string message =
      error_of([] { make_niah_example(NiahConfig::preset(NiahKind::MultiQuery, 100, 0)); });
  EXPECT_NE(message.find("NiahConfig.context_tokens"), std::string::npos) << message;
  NiahConfig bad = NiahConfig::preset(NiahKind::Single1);
  bad.num_queries = 2;
  message = error_of([&] { make_niah_example(bad); });
  EXPECT_NE(message.find("NiahConfig.num_queries"), std::string::npos) << message;
  bad = NiahConfig::preset(NiahKind::Single1);
  bad.depth = 1.5;
  message = error_of([&] { make_niah_example(bad); });
  EXPECT_NE(message.find("NiahConfig.depth"), std::string::npos) << message;
}

TEST(Niah, DepthPlacesTheNeedle) {
  for (NiahKind kind : {NiahKind::Single1, NiahKind::Single2}) {
    SCOPED_TRACE(std::string(niah_kind_name(kind)));
    NiahConfig config = NiahConfig::preset(kind, 20000, 6);
    size_t context_start = 0;
    auto relative_depth = [&](double depth) {
      config.depth = depth;
      NiahExample ex = make_niah_example(config);
      context_start = ex.prompt.find(ex.context);
      return double(ex.needle_offsets[0] - context_start) / double(ex.context.size());
    };
    config.depth = 0;
    NiahExample top = make_niah_example(config);
    EXPECT_TRUE(top.context.starts_with(top.needles[0]));
    config.depth = 1;
    NiahExample bottom = make_niah_example(config);
    EXPECT_TRUE(bottom.context.ends_with(bottom.needles[0]));
    for (double depth : {0.25, 0.5, 0.75}) EXPECT_NEAR(relative_depth(depth), depth, 0.04);
  }
  // Without a depth, needles land all over the haystack.
  double lowest = 1, highest = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    NiahExample ex = make_niah_example(NiahConfig::preset(NiahKind::Single2, 4000, seed));
    size_t context_start = ex.prompt.find(ex.context);
    double depth = double(ex.needle_offsets[0] - context_start) / double(ex.context.size());
    lowest = std::min(lowest, depth);
    highest = std::max(highest, depth);
  }
  EXPECT_LT(lowest, 0.2);
  EXPECT_GT(highest, 0.8);
}

TEST(Niah, MultipleNeedlesAtOneDepthStayTogether) {
  NiahConfig config = NiahConfig::preset(NiahKind::MultiValue, 4000, 8);
  config.depth = 0.5;
  NiahExample ex = make_niah_example(config);
  ASSERT_EQ(ex.needle_offsets.size(), 4u);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(ex.needle_offsets[i], ex.needle_offsets[i - 1] + ex.needles[i - 1].size() + 1)
        << "needles at one depth follow each other";
  }
}

TEST(Niah, DeterministicPerSeed) {
  for (NiahKind kind : all_niah_kinds()) {
    SCOPED_TRACE(std::string(niah_kind_name(kind)));
    NiahExample a = make_niah_example(NiahConfig::preset(kind, 3000, 21));
    NiahExample b = make_niah_example(NiahConfig::preset(kind, 3000, 21));
    NiahExample c = make_niah_example(NiahConfig::preset(kind, 3000, 22));
    EXPECT_EQ(a.prompt, b.prompt);
    EXPECT_EQ(a.expected, b.expected);
    EXPECT_NE(a.prompt, c.prompt);
    EXPECT_NE(a.expected, c.expected);
  }
}

TEST(Niah, EssayIsGeneratedProse) {
  Generator gen(3), same(3), other(4);
  std::string essay = generate_essay(200, gen);
  EXPECT_EQ(essay, generate_essay(200, same));
  EXPECT_NE(essay, generate_essay(200, other));
  std::set<std::string> sentences;
  size_t start = 0;
  while (start < essay.size()) {
    size_t end = essay.find(". ", start);
    if (end == std::string::npos) end = essay.size() - 1;
    std::string sentence = essay.substr(start, end + 1 - start);
    EXPECT_TRUE(sentence[0] >= 'A' && sentence[0] <= 'Z') << sentence;
    EXPECT_EQ(sentence.back(), '.') << sentence;
    sentences.insert(sentence);
    start = end + 2;
  }
  EXPECT_EQ(sentences.size(), 200u) << "sentences do not repeat";
  for (char c : essay) {
    EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' ' || c == '.' ||
                c == ',')
        << "unexpected character '" << c << "'";
  }
  EXPECT_EQ(essay.find("  "), std::string::npos);
  EXPECT_EQ(essay.find("magic"), std::string::npos);
}

TEST(Ruler, ScoreIsTheFractionOfExpectedStringsFound) {
  EXPECT_DOUBLE_EQ(ruler_score("The numbers are 1234567 and 7654321.", {"1234567", "7654321"}),
                   1.0);
  EXPECT_DOUBLE_EQ(ruler_score("only 1234567", {"1234567", "7654321", "1111111", "2222222"}),
                   0.25);
  EXPECT_DOUBLE_EQ(ruler_score("nothing here", {"1234567"}), 0.0);
  EXPECT_DOUBLE_EQ(ruler_score("It is BRAVE-LANTERN.", {"brave-lantern"}), 1.0)
      << "matching ignores case, as RULER's does";
  EXPECT_THROW(ruler_score("x", {}), Error);
  // A perfect continuation of an example scores 1.
  NiahExample ex = make_niah_example(NiahConfig::preset(NiahKind::MultiValue, 2000, 1));
  std::string answer;
  for (const auto& value : ex.expected) answer += " " + value + ",";
  EXPECT_DOUBLE_EQ(ruler_score(answer, ex.expected), 1.0);
  EXPECT_DOUBLE_EQ(ruler_score(ex.expected[0], ex.expected), 0.25);
}

// ---- Mixtures ----------------------------------------------------------------------------

TokenStream counting_stream(int64_t size) {
  std::vector<int64_t> tokens(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) tokens[size_t(i)] = i % 200;
  return TokenStream(std::move(tokens));
}

TEST(SyntheticMixture, RowsFollowTheWeightsDeterministically) {
  TokenStream text = counting_stream(5000);
  MqarConfig mqar{.vocab_size = 256, .num_pairs = 4};
  auto make = [&](uint64_t seed) {
    return BatchMixture({text_source(text, 3.0), mqar_source(mqar, 1.0),
                         mqar_source(mqar, 0.0, "never")},
                        seed);
  };
  BatchMixture mixture = make(5), same = make(5), other = make(6);
  int64_t mqar_rows = 0, rows = 0;
  bool differs = false;
  for (int step = 0; step < 50; ++step) {
    TokenBatch a = mixture.sample(8, 64), b = same.sample(8, 64), c = other.sample(8, 64);
    ASSERT_EQ(a.inputs.shape(), Shape({8, 64}));
    ASSERT_TRUE(a.doc_ids.defined() && a.positions.defined());
    EXPECT_EQ(a.inputs.to_vector<int64_t>(), b.inputs.to_vector<int64_t>());
    EXPECT_EQ(a.targets.to_vector<int64_t>(), b.targets.to_vector<int64_t>());
    EXPECT_EQ(mixture.last_row_sources(), same.last_row_sources());
    differs = differs || a.inputs.to_vector<int64_t>() != c.inputs.to_vector<int64_t>();
    std::vector<int64_t> targets = a.targets.to_vector<int64_t>();
    for (int64_t r = 0; r < 8; ++r) {
      int64_t source = mixture.last_row_sources()[size_t(r)];
      EXPECT_NE(source, 2) << "a zero-weight source is never drawn";
      int64_t ignored = 0;
      for (int64_t t = 0; t < 64; ++t)
        ignored += targets[size_t(r * 64 + t)] == kSyntheticIgnoreIndex;
      if (source == 1) {
        EXPECT_EQ(ignored, 64 - 4) << "an MQAR row supervises only its 4 queries";
        ++mqar_rows;
      } else {
        EXPECT_EQ(ignored, 0) << "a text row supervises every token";
      }
      ++rows;
    }
  }
  EXPECT_TRUE(differs);
  EXPECT_NEAR(double(mqar_rows) / double(rows), 0.25, 0.07);
}

TEST(SyntheticMixture, BadWeightsAreNamed) {
  TokenStream text = counting_stream(500);
  std::string message = error_of([&] { BatchMixture({text_source(text, -1.0, "web")}, 0); });
  EXPECT_NE(message.find("'web'"), std::string::npos) << message;
  EXPECT_THROW(BatchMixture({text_source(text, 0.0)}, 0), Error);
  EXPECT_THROW(BatchMixture({}, 0), Error);
}

TEST(SyntheticMixture, NiahRowsSuperviseOnlyTheAnswer) {
  ByteTokenizer tokenizer;
  TextEncoder encode = [&](std::string_view text) { return tokenizer.encode(text); };
  BatchMixture mixture({niah_source(NiahConfig::preset(NiahKind::MultiKey1), encode,
                                    ByteTokenizer::kEndOfText, 1.0)},
                       9);
  const int64_t T = 1024;
  TokenBatch batch = mixture.sample(2, T);
  std::vector<int64_t> inputs = batch.inputs.to_vector<int64_t>();
  std::vector<int64_t> targets = batch.targets.to_vector<int64_t>();
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<int64_t> answer, prompt;
    for (int64_t t = 0; t < T; ++t) {
      int64_t target = targets[size_t(r * T + t)];
      if (target != kSyntheticIgnoreIndex) answer.push_back(target);
      int64_t input = inputs[size_t(r * T + t)];
      if (input != ByteTokenizer::kEndOfText) prompt.push_back(input);
    }
    std::string answer_text = tokenizer.decode(answer);
    std::string row_text = tokenizer.decode(prompt);
    EXPECT_TRUE(std::regex_match(answer_text, std::regex(" [1-9][0-9]{6}\\.")))
        << "the answer is one 7-digit number: '" << answer_text << "'";
    size_t question = row_text.find("What is the special magic number for ");
    ASSERT_NE(question, std::string::npos);
    // The answer completes the prompt (its last token is only a target).
    EXPECT_TRUE((row_text + ".").ends_with(answer_text));
    EXPECT_GT(row_text.size(), size_t(T * 9 / 10)) << "the haystack fills the row";
  }
}

}  // namespace
}  // namespace ham

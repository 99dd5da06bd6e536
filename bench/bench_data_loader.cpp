// Data loading throughput: tokens/s of encoding text with each tokenizer, and of cutting
// training batches out of memory-mapped llm.c shards. A CPU trainer consumes ~1e4-1e5
// tokens/s, so both should be orders of magnitude faster.
//
// The BPE tokenizers are built from the embedded corpus (its most frequent words become
// merge chains, as in a trained vocabulary). HAM_BENCH_TOKENIZER=path/tokenizer.json adds
// a run with a real file (e.g. GPT-2's).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "train/shards.h"
#include "train/text_data.h"
#include "train/tokenizer.h"

namespace {

using json = nlohmann::json;
constexpr int kMerges = 8000;

// Splits UTF-8 text into characters.
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = uint8_t(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// Merge chains that build the most frequent words left to right.
void add_word_merges(const std::map<std::string, int64_t>& counts, json& vocab, json& merges) {
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [word, n] : counts) by_count.emplace_back(-n, word);
  std::sort(by_count.begin(), by_count.end());
  for (const auto& [neg_count, word] : by_count) {
    std::vector<std::string> chars = characters(word);
    std::string prefix = chars[0];
    for (size_t i = 1; i < chars.size() && int(merges.size()) < kMerges; ++i) {
      if (!vocab.contains(chars[i]) || !vocab.contains(prefix)) break;
      std::string merged = prefix + chars[i];
      if (!vocab.contains(merged)) {
        vocab[merged] = vocab.size();
        merges.push_back(json::array({prefix, chars[i]}));
      }
      prefix = merged;
    }
    if (int(merges.size()) >= kMerges) break;
  }
}

std::unique_ptr<ham::BpeTokenizer> byte_level_tokenizer(std::string_view corpus) {
  json vocab = json::object(), merges = json::array();
  for (int b = 0; b < 256; ++b) vocab[ham::byte_level_char(uint8_t(b))] = vocab.size();
  std::map<std::string, int64_t> counts;
  for (auto piece : ham::split_gpt2_pretokens(corpus)) {
    std::string mapped;
    for (unsigned char c : piece) mapped += ham::byte_level_char(c);
    ++counts[mapped];
  }
  add_word_merges(counts, vocab, merges);
  vocab["<|endoftext|>"] = vocab.size();
  json doc = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
              {"added_tokens", json::array({{{"id", vocab.size() - 1}, {"content", "<|endoftext|>"}, {"special", true}}})}};
  return std::make_unique<ham::BpeTokenizer>(ham::BpeTokenizer::from_json(doc, "bench byte-level"));
}

std::unique_ptr<ham::BpeTokenizer> sentencepiece_tokenizer(std::string_view corpus) {
  const std::string marker = "\xe2\x96\x81";
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}}, merges = json::array();
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = vocab.size();
  }
  // Words are "▁" + letters; every ASCII character is a piece, the rest fall back to bytes.
  std::map<std::string, int64_t> counts;
  for (char c = 32; c < 127; ++c) vocab[c == ' ' ? marker : std::string(1, c)] = vocab.size();
  std::string word;
  for (char c : corpus) {
    if (c == ' ') {
      if (!word.empty()) ++counts[word];
      word = marker;
    } else {
      word += c;
    }
  }
  add_word_merges(counts, vocab, merges);
  json doc = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", true},
                         {"unk_token", "<unk>"}}},
              {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array({
                  {{"type", "Prepend"}, {"prepend", marker}},
                  {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", marker}}})}}},
              {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}},
                                            {{"id", 2}, {"content", "</s>"}, {"special", true}}})}};
  return std::make_unique<ham::BpeTokenizer>(ham::BpeTokenizer::from_json(doc, "bench sentencepiece"));
}

// Encodes the corpus; `cold` rebuilds the tokenizer first (outside the timing) so that
// every word misses the cache.
template <class Make>
void encode_corpus(benchmark::State& state, Make make, bool cold) {
  std::string_view corpus = ham::default_corpus();
  std::unique_ptr<ham::Tokenizer> tok = make(corpus);
  int64_t tokens = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      tok = make(corpus);
      state.ResumeTiming();
    }
    auto ids = tok->encode(corpus);
    tokens += int64_t(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
  state.counters["MB/s"] = benchmark::Counter(double(corpus.size()) * double(state.iterations()) / 1e6,
                                              benchmark::Counter::kIsRate);
  state.counters["vocab"] = double(tok->vocab_size());
}

void BM_EncodeBytes(benchmark::State& state) {
  encode_corpus(state, [](std::string_view) { return std::make_unique<ham::RawBytesTokenizer>(); }, false);
}
void BM_EncodeByteLevelBpe(benchmark::State& state) {
  encode_corpus(state, byte_level_tokenizer, state.range(0) == 1);
}
void BM_EncodeSentencePieceBpe(benchmark::State& state) {
  encode_corpus(state, sentencepiece_tokenizer, state.range(0) == 1);
}
void BM_EncodeTokenizerFile(benchmark::State& state) {
  const char* path = std::getenv("HAM_BENCH_TOKENIZER");
  if (!path) {
    state.SkipWithError("set HAM_BENCH_TOKENIZER=path/tokenizer.json to run this");
    return;
  }
  encode_corpus(state, [&](std::string_view) { return ham::load_tokenizer(path); }, state.range(0) == 1);
}
BENCHMARK(BM_EncodeBytes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeByteLevelBpe)->ArgName("cold")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeSentencePieceBpe)->ArgName("cold")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeTokenizerFile)->ArgName("cold")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Two uint16 shards of 4M random tokens each, written once.
const std::vector<std::string>& bench_shards() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> p;
    std::mt19937 rng(1);
    auto dir = std::filesystem::temp_directory_path() / ("ham_bench_shards_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    for (int s = 0; s < 2; ++s) {
      std::vector<int64_t> tokens(4'000'000);
      for (auto& t : tokens) t = rng() % 50257;
      for (size_t i = 0; i < tokens.size(); i += 700) tokens[i] = 50256;
      p.push_back((dir / ("bench_train_00000" + std::to_string(s) + ".bin")).string());
      ham::write_shard(p.back(), tokens, 2);
    }
    std::atexit([] { std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                                 ("ham_bench_shards_" + std::to_string(getpid()))); });
    return p;
  }();
  return paths;
}

// Random windows of batch x seq_len as training samples them (the tensors included).
void BM_ShardSampleBatches(benchmark::State& state) {
  ham::ShardDataset data(bench_shards(), 50257, 50256);
  ham::Generator gen(0);
  const int64_t batch = state.range(0), seq_len = state.range(1);
  for (auto _ : state) {
    ham::TokenBatch b = data.sample(batch, seq_len, gen);
    benchmark::DoNotOptimize(b.inputs.raw_data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(double(batch * seq_len) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ShardSampleBatches)->Args({8, 1024})->Args({64, 2048})->Unit(benchmark::kMicrosecond);

// Opening and validating shards against a vocabulary (the scan of every token).
void BM_ShardOpenAndValidate(benchmark::State& state) {
  const auto& paths = bench_shards();
  for (auto _ : state) {
    ham::ShardDataset data(paths, 50257, 50256);
    benchmark::DoNotOptimize(data.size());
  }
  state.counters["tokens/s"] = benchmark::Counter(8e6 * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ShardOpenAndValidate)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

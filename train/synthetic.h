#pragma once
// Synthetic recall tasks generated in process (nothing is downloaded):
//   * MQAR, Zoology's multi-query associative recall, as token batches;
//   * the RULER needle-in-a-haystack family as text prompts plus expected answers, sized to
//     a target length measured by any tokenizer's counter;
//   * a mixture that interleaves such rows into training batches by probability.
// All randomness comes from ham::Generator, so the same seed gives the same data everywhere.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/random.h"
#include "models/language_model.h"
#include "train/text_data.h"

namespace ham {

// The target value that takes no part in the loss (cross_entropy's default ignore_index).
inline constexpr int64_t kSyntheticIgnoreIndex = -100;

// ---- MQAR (Zoology multi-query associative recall) ------------------------------------
// A sequence starts with num_pairs key-value pairs (k1 v1 k2 v2 ...), keys drawn without
// replacement from [1, V/2) and values from [V/2, V). In the rest of the sequence every key
// reappears once, at an even offset 2 * gap after the pairs, where the gaps are drawn
// without replacement with P(gap = g - 1) proportional to g^(power_a - 1), g = 1 .. (T-2N)/2
// (small power_a: most queries come soon after the pairs, a few come late). The target at
// a query position is the key's value; every other target is kSyntheticIgnoreIndex. Other
// positions hold uniform tokens from [0, V) (random_non_queries) or 0.
struct MqarConfig {
  int64_t vocab_size = 8192;
  int64_t seq_len = 256;
  int64_t num_pairs = 16;
  double power_a = 0.01;
  uint64_t seed = 0;
  bool random_non_queries = true;

  // One-line error naming the field at fault: 4 * num_pairs <= seq_len, enough keys in
  // [1, V/2) and values in [V/2, V), power_a > 0.
  void validate() const;
};

struct MqarExample {
  std::vector<int64_t> inputs;         // seq_len tokens
  std::vector<int64_t> targets;        // seq_len; the value at each query, else ignore
  std::vector<int64_t> query_positions;  // where keys are queried, in order of position
};

// Example `index` of the dataset keyed by config.seed: a pure function of (config, index)
// (it reads Philox blocks starting at index * 2^32 of the seed's stream).
MqarExample mqar_example(const MqarConfig& config, int64_t index);
// Examples first_index .. first_index + batch_size - 1 as a [batch_size, seq_len] batch
// (doc_ids all 0, positions 0 .. seq_len - 1).
TokenBatch mqar_batch(const MqarConfig& config, int64_t first_index, int64_t batch_size);

// ---- RULER needle in a haystack ---------------------------------------------------------
// The eight RULER NIAH tasks (haystack, key type, value type, keys / values / queries):
//   single_1    noise  words numbers 1/1/1     multikey_2  needle words numbers 1/1/1
//   single_2    essay  words numbers 1/1/1     multikey_3  needle uuids uuids   1/1/1
//   single_3    essay  words uuids   1/1/1     multivalue  essay  words numbers 1/4/1
//   multikey_1  essay  words numbers 4/1/1     multiquery  essay  words numbers 4/1/4
enum class NiahKind { Single1, Single2, Single3, MultiKey1, MultiKey2, MultiKey3, MultiValue,
                      MultiQuery };
// noise: a fixed paragraph repeated; essay: generated English prose; needle: distractor
// needles with other keys and values.
enum class NiahHaystack { Noise, Essay, Needle };
// numbers: 7 digits; words: adjective-noun pairs ("brave-lantern"); uuids: 32 lowercase hex
// digits as 8-4-4-4-12 (version-4 layout, like Python's uuid.UUID(..., version=4)).
enum class NiahValueType { Numbers, Words, Uuids };

std::string_view niah_kind_name(NiahKind kind);  // "single_1", ...
// Accepts the names above, with or without a "niah_" prefix; an unknown name is an error
// listing the known ones.
NiahKind niah_kind_from_name(std::string_view name);
const std::vector<NiahKind>& all_niah_kinds();
std::string_view niah_value_type_name(NiahValueType type);  // "numbers", "words", "uuids"

// Counts the tokens of a text; the default counts bytes (the ByteTokenizer's length).
using TokenCounter = std::function<int64_t(std::string_view)>;
int64_t count_bytes(std::string_view text);

struct NiahConfig {
  NiahHaystack haystack = NiahHaystack::Noise;
  NiahValueType key_type = NiahValueType::Words;
  NiahValueType value_type = NiahValueType::Numbers;
  int64_t num_keys = 1;     // needles' keys
  int64_t num_values = 1;   // values (needles) per key
  int64_t num_queries = 1;  // keys asked about (<= num_keys)
  // The whole prompt is filled with haystack up to this many tokens (never past it).
  int64_t context_tokens = 4096;
  // Needle depth as a fraction of the haystack, in [0, 1]: every needle goes at that
  // point, in order. Negative: each needle at a uniformly random point.
  double depth = -1;
  uint64_t seed = 0;

  // RULER's settings for `kind`.
  static NiahConfig preset(NiahKind kind, int64_t context_tokens = 4096, uint64_t seed = 0);
  void validate() const;  // one-line error naming the field
};

struct NiahExample {
  // Instructions, "\n", context, "\n", question: the model continues it with the answers.
  std::string prompt;
  std::string context;   // haystack with the needles in it
  // "What is the special magic number for {key} mentioned in the provided text? The special
  // magic number for {key} mentioned in the provided text is" (plural with several answers).
  std::string question;
  std::vector<std::string> expected;      // the queried keys' values, in query order
  std::vector<std::string> queried_keys;
  std::vector<std::string> keys;           // every key that has needles
  std::vector<std::string> needles;        // the needle sentences, in order of appearance
  std::vector<size_t> needle_offsets;      // byte offset of each needle in `prompt`
  int64_t haystack_units = 0;  // noise paragraphs / essay sentences / distractor needles
  int64_t tokens = 0;          // counter(prompt)
};

// Deterministic per config (seed included). The haystack grows until one more unit would
// take the prompt past context_tokens; an error names context_tokens when even the needles
// and the question alone do not fit.
NiahExample make_niah_example(const NiahConfig& config,
                              const TokenCounter& counter = count_bytes);

// The needle sentence: "One of the special magic {numbers|words|uuids} for {key} is: {value}."
std::string niah_needle(NiahValueType value_type, std::string_view key, std::string_view value);

// RULER's string-match-all: the fraction of expected strings found (case-insensitively) in
// the output. `expected` must not be empty.
double ruler_score(const std::string& output, const std::vector<std::string>& expected);

// `sentences` sentences of procedurally generated English prose (original word lists and
// grammar, so no text is copied), separated by single spaces.
std::string generate_essay(int64_t sentences, Generator& gen);

// ---- Mixtures ---------------------------------------------------------------------------
// A source of training rows: sample(rows, seq_len, gen) returns a [rows, seq_len] batch
// (doc_ids / positions may be left undefined: the mixture fills 0 / 0 .. seq_len - 1).
struct MixtureSource {
  std::string name;
  double weight = 1;  // relative probability that a row comes from this source
  std::function<TokenBatch(int64_t rows, int64_t seq_len, Generator& gen)> sample;
};

// Random windows of a token stream (the stream must outlive the source).
MixtureSource text_source(const TokenStream& stream, double weight, std::string name = "text");
// MQAR rows at the batch's seq_len (config.seq_len is replaced), each a random example
// index of config.seed's dataset. Tokens are in [0, config.vocab_size).
MixtureSource mqar_source(MqarConfig config, double weight, std::string name = "mqar");

// Turns text into token ids (e.g. ByteTokenizer::encode).
using TextEncoder = std::function<std::vector<int64_t>(std::string_view)>;
// NIAH rows: the prompt then " " + the expected answers joined by ", " + ".", with targets
// only on the answer tokens; the haystack is sized to the batch's seq_len with `encode`'s
// length as the counter, and the rest of the row is `pad_token` with ignored targets.
// config.context_tokens and config.seed are replaced per row.
MixtureSource niah_source(NiahConfig config, TextEncoder encode, int64_t pad_token,
                          double weight, std::string name = "niah");

// Draws every row of a batch from one of the sources with probability weight / sum of
// weights; deterministic per seed (row choices and the sources' own draws share the
// mixture's generator).
class BatchMixture {
 public:
  BatchMixture(std::vector<MixtureSource> sources, uint64_t seed);
  TokenBatch sample(int64_t batch, int64_t seq_len) { return sample(batch, seq_len, gen_); }
  // The same draw from an outside generator (the trainer's, whose state is checkpointed).
  TokenBatch sample(int64_t batch, int64_t seq_len, Generator& gen);
  // Index into the sources of each row of the last batch.
  const std::vector<int64_t>& last_row_sources() const { return last_row_sources_; }
  const std::vector<MixtureSource>& sources() const { return sources_; }

 private:
  std::vector<MixtureSource> sources_;
  Generator gen_;
  std::vector<int64_t> last_row_sources_;
};

// ---- Where the parts of a NIAH prompt lie in its tokens ---------------------------------
// A token range [begin, end).
struct TokenSpan {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t t) const { return t >= begin && t < end; }
};

struct NiahTokenSpans {
  TokenSpan instructions, context, question;
  std::vector<TokenSpan> needles;  // in order of appearance, inside `context`
};

// The spans of encode(example.prompt) that hold each part: a part starting at byte b and
// ending at byte e spans tokens [len(encode(prompt[0, b))), len(encode(prompt[0, e)))).
// Exact for byte-level tokens; with BPE a token that straddles a boundary counts with the
// part where it ends.
NiahTokenSpans niah_token_spans(const NiahExample& example, const TextEncoder& encode);

}  // namespace ham

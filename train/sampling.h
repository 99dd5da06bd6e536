#pragma once
// Next-token selection from logits, and text generation with a Decoder (models/decoding.h).
//
// Sampling, for one row of logits z over the vocabulary:
//   temperature T = 0   greedy: argmax z (the lowest id among equal maxima)
//   temperature T > 0   p = softmax(z / T), then
//     top_k k > 0       keep the k most probable tokens (ties: lower id first)
//     top_p P < 1       keep the smallest set of most probable tokens whose mass is >= P
//                       (of what top-k kept; the token that crosses P stays in)
//   and draw from p renormalised over the kept tokens with u ~ U[0, 1): the first kept
//   token (most probable first) whose cumulative probability exceeds u * mass.
// Each draw reads one Philox block: draw i of a Sampler seeded with s uses block i of the
// stream keyed by s (core/random.h), so a run is a pure function of the seed. Greedy
// draws no random numbers.
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "core/random.h"
#include "models/decoding.h"
#include "models/language_model.h"

namespace ham {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k cut
  double top_p = 1.0;        // 1: no nucleus cut; in (0, 1]
  uint64_t seed = 0;
};

// Throws a one-line error naming the option ("temperature", "top_k", "top_p") unless the
// options are usable.
void validate_sampling_options(const SamplingOptions& options);

// The lowest id with the largest logit; NaN logits are an error.
int64_t argmax(const std::vector<double>& logits);

// The tokens sampling may return and their renormalised probabilities, most probable
// first (greedy: the argmax with probability 1).
std::vector<std::pair<int64_t, double>> sampling_distribution(const std::vector<double>& logits,
                                                              const SamplingOptions& options);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);  // validates
  int64_t next(const std::vector<double>& logits);
  // One token per row of logits [B, vocab], or of the last position of [B, n, vocab].
  std::vector<int64_t> next(const Tensor& logits);
  const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  Generator generator_;
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  std::optional<int64_t> stop_token;  // generation ends when it is drawn (not returned)
  SamplingOptions sampling;
  RoutingOverride routing;  // HAM: tau per layer or a target KV fraction
  // Called with each new token as soon as it is drawn (not with the stop token), e.g. to
  // print the continuation as it grows; its time is left out of decode_seconds.
  std::function<void(int64_t)> on_token;
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // the new tokens, without the prompt or the stop token
  bool stopped = false;         // the stop token ended generation
  int64_t context_tokens = 0;   // tokens fed to the decoder (prompt + all new but the last)
  std::vector<LayerCacheStats> layers;  // the decoder's state after the last feed
  CacheBytes bytes;
  // Wall time of the prompt's feed (with the first token's sampling), and of the feeds of
  // the new tokens one at a time (with their sampling).
  double prompt_seconds = 0, decode_seconds = 0;
};

// Feeds `prompt` (one sequence, at least one token) in one call, then samples up to
// max_new_tokens tokens one at a time.
GenerateResult generate(const LanguageModel& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& options);

// Greedy decoding of `prompt`'s continuation (the stop token excluded).
std::vector<int64_t> greedy_continuation(const LanguageModel& model,
                                         const std::vector<int64_t>& prompt,
                                         int64_t max_new_tokens,
                                         std::optional<int64_t> stop_token = std::nullopt);

// greedy_continuation as an evaluation Completer (train/evaluation.h): (prompt, max new
// tokens) -> new tokens, stopping at `stop_token`. `model` must outlive it.
std::function<std::vector<int64_t>(const std::vector<int64_t>&, int64_t)> greedy_completer(
    const LanguageModel& model, std::optional<int64_t> stop_token);

}  // namespace ham

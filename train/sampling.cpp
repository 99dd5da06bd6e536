#include "train/sampling.h"

#include <chrono>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ham {

void validate_sampling_options(const SamplingOptions& o) {
  HAM_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
            "sampling: temperature must be a finite number >= 0 (0: greedy), got ", o.temperature);
  HAM_CHECK(o.top_k >= 0, "sampling: top_k must be >= 0 (0: off), got ", o.top_k);
  HAM_CHECK(o.top_p > 0 && o.top_p <= 1, "sampling: top_p must lie in (0, 1] (1: off), got ",
            o.top_p);
}

namespace {

void check_logits(const std::vector<double>& logits) {
  HAM_CHECK(!logits.empty(), "sampling: no logits (empty vocabulary)");
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    HAM_CHECK(!std::isnan(logits[i]) && logits[i] != INFINITY, "sampling: logit of token ", i,
              " is ", logits[i], "; logits must be finite or -inf");
    any_finite = any_finite || std::isfinite(logits[i]);
  }
  HAM_CHECK(any_finite, "sampling: every logit is -inf");
}

}  // namespace

int64_t argmax(const std::vector<double>& logits) {
  check_logits(logits);
  return int64_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<std::pair<int64_t, double>> sampling_distribution(const std::vector<double>& logits,
                                                              const SamplingOptions& options) {
  validate_sampling_options(options);
  if (options.temperature == 0) return {{argmax(logits), 1.0}};
  check_logits(logits);
  // Most probable first; equal logits keep the lower id first.
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  size_t kept = order.size();
  if (options.top_k > 0) kept = std::min(kept, size_t(options.top_k));
  // softmax(z / T) over the kept tokens, shifted by the largest logit.
  const double top = logits[size_t(order[0])];
  std::vector<double> weight(kept);
  double mass = 0;
  for (size_t i = 0; i < kept; ++i) {
    weight[i] = std::exp((logits[size_t(order[i])] - top) / options.temperature);
    mass += weight[i];
  }
  if (options.top_p < 1) {
    double cumulative = 0;
    size_t nucleus = 0;
    while (nucleus < kept && cumulative < options.top_p * mass) cumulative += weight[nucleus++];
    kept = std::max<size_t>(nucleus, 1);
    mass = cumulative;
  }
  std::vector<std::pair<int64_t, double>> out;
  for (size_t i = 0; i < kept && weight[i] > 0; ++i) out.emplace_back(order[i], weight[i] / mass);
  return out;
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), generator_(options.seed) {
  validate_sampling_options(options_);
}

int64_t Sampler::next(const std::vector<double>& logits) {
  std::vector<std::pair<int64_t, double>> candidates = sampling_distribution(logits, options_);
  if (options_.temperature == 0) return candidates[0].first;
  const double u = rng::uniform_from_block(rng::stream_block(generator_.seed(), generator_.advance(1)),
                                           0, /*f64=*/true);
  double cumulative = 0;
  for (const auto& [token, p] : candidates) {
    cumulative += p;
    if (cumulative > u) return token;
  }
  // The probabilities may sum to just under 1 by rounding, and u may lie above the sum.
  return candidates.back().first;
}

std::vector<int64_t> Sampler::next(const Tensor& logits) {
  HAM_CHECK(logits.dim() == 2 || logits.dim() == 3,
            "Sampler::next: logits must be [B, vocab] or [B, n, vocab], got ",
            shape_str(logits.shape()));
  const int64_t B = logits.size(0), V = logits.size(-1);
  const int64_t rows = logits.dim() == 3 ? logits.size(1) : 1;
  std::vector<double> all = logits.to_vector<double>();
  std::vector<int64_t> out;
  for (int64_t b = 0; b < B; ++b) {
    auto last = all.begin() + ((b + 1) * rows - 1) * V;  // the row's last position
    out.push_back(next(std::vector<double>(last, last + V)));
  }
  return out;
}

GenerateResult generate(const LanguageModel& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& options) {
  HAM_CHECK(!prompt.empty(), "generate: the prompt needs at least one token");
  HAM_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ",
            options.max_new_tokens);
  const int64_t vocab = model.config().vocab_size;
  HAM_CHECK(!options.stop_token || (*options.stop_token >= 0 && *options.stop_token < vocab),
            "generate: stop_token ", options.stop_token.value_or(0), " is outside the vocabulary [0, ",
            vocab, ")");
  Sampler sampler(options.sampling);
  Decoder decoder(model, 1, options.routing);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Tensor logits = decoder.feed(std::vector<std::vector<int64_t>>{prompt});
  GenerateResult r;
  Clock::time_point decode_start = start;
  Clock::duration in_callback{0};
  while (int64_t(r.tokens.size()) < options.max_new_tokens) {
    int64_t token = sampler.next(logits)[0];  // reads the logits: waits for the device
    if (r.tokens.empty()) decode_start = Clock::now();
    if (options.stop_token && token == *options.stop_token) {
      r.stopped = true;
      break;
    }
    r.tokens.push_back(token);
    if (options.on_token) {
      const Clock::time_point called = Clock::now();
      options.on_token(token);
      in_callback += Clock::now() - called;
    }
    if (int64_t(r.tokens.size()) == options.max_new_tokens) break;  // no logits needed
    logits = decoder.feed(std::vector<std::vector<int64_t>>{{token}});
  }
  const Clock::time_point end = Clock::now();
  if (decode_start == start) decode_start = end;  // nothing sampled: the prompt alone
  r.prompt_seconds = std::chrono::duration<double>(decode_start - start).count();
  r.decode_seconds = std::chrono::duration<double>(end - decode_start - in_callback).count();
  r.context_tokens = decoder.position();
  r.layers = decoder.layer_stats();
  r.bytes = decoder.cache_bytes();
  return r;
}

std::vector<int64_t> greedy_continuation(const LanguageModel& model,
                                         const std::vector<int64_t>& prompt,
                                         int64_t max_new_tokens,
                                         std::optional<int64_t> stop_token) {
  GenerateOptions options;
  options.max_new_tokens = max_new_tokens;
  options.stop_token = stop_token;
  options.sampling.temperature = 0;
  return generate(model, prompt, options).tokens;
}

std::function<std::vector<int64_t>(const std::vector<int64_t>&, int64_t)> greedy_completer(
    const LanguageModel& model, std::optional<int64_t> stop_token) {
  return [&model, stop_token](const std::vector<int64_t>& prompt, int64_t max_new_tokens) {
    return greedy_continuation(model, prompt, max_new_tokens, stop_token);
  };
}

}  // namespace ham

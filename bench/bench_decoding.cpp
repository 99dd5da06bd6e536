// Decoding on the CPU: the two decode ops against the copy bandwidth measured in the same
// process, and the time per generated token of each model family against the context.
//
// Run (from the repository root):
//   cmake -S . -B build-bench -G Ninja -DHAM_CUDA=OFF -DHAM_BUILD_TESTS=OFF
//   ninja -C build-bench bench_decoding
//   OMP_NUM_THREADS=1 ./build-bench/bench/bench_decoding --benchmark_repetitions=5
//   ... --benchmark_filter=decode_token   (the families only)
//
// What it measures (f32, B = 1 unless named):
//   - routed_attention_decode/L=X: one query per head over a cache of L visible tokens, the
//     paper's HAM KV heads (Hq = Hkv = 10, Dk = 128, Dv = 192).
//   - gated_delta_rule_decode/B=X: one token through the paper's GDN heads (H = 5, K = 256,
//     V = 384), the state advanced in place.
//   - decode_token/FAMILY/L=X: Decoder::feed of one token after a prompt of L tokens, for
//     configs/tiny/{transformer,gdn,gdn-gsa,ham-fixed-tau}.json with their initial weights
//     (the prompt is fed once, before timing).
//
// How to read it:
//   - "bytes_per_second": the bytes an op must move per second (the cached keys and values
//     read; the state read and written); "copy_fraction": that over the copy bandwidth
//     measured at start-up with the same thread count (256 MiB, read + write bytes, best of
//     5, printed to stderr). A cache far larger than the caches of the CPU sits near 1 when
//     the op runs at memory speed; the GDN state (2 MB a sequence) may fit in cache and
//     exceed 1.
//   - decode_token: the time per iteration is the time per generated token (32 per run);
//     "context" is the tokens fed before the run (the prompt, plus the tokens of earlier
//     repetitions), "cache_bytes" what the decoder then holds (KV caches, recurrent states,
//     conv windows), "kv_tokens" the tokens cached per attention layer, on average.
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/ops/gated_delta_rule_decode.h"
#include "core/ops/routed_attention_decode.h"
#include "core/tensor.h"
#include "models/config.h"
#include "models/decoding.h"
#include "models/language_model.h"

namespace {

using ham::Shape;
using ham::Tensor;

double g_copy_bytes_per_second = 0;
constexpr int64_t kTokensPerRun = 32;  // decode_token: generated tokens timed per run

// Copy bandwidth: 256 MiB copied in OpenMP chunks, read + write bytes, best of 5.
double measure_copy_bandwidth() {
  const size_t n = size_t(64) << 20;  // floats
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  double best = 1e30;
  for (int trial = 0; trial < 6; ++trial) {
    auto t0 = std::chrono::steady_clock::now();
    const int64_t chunks = 256;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t begin = n / size_t(chunks) * size_t(c);
      std::memcpy(dst.data() + begin, src.data() + begin, n / size_t(chunks) * sizeof(float));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (trial > 0) best = std::min(best, seconds);  // the first run faults the pages in
  }
  benchmark::DoNotOptimize(dst.data());
  return 2.0 * double(n * sizeof(float)) / best;
}

Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(lo, hi);
  std::vector<float> values(size_t(ham::shape_numel(shape)));
  for (float& x : values) x = uni(rng);
  return Tensor::from_vector(values, shape);
}

// Wall time (OpenMP threads do the work), with the bytes moved as a rate and a fraction.
template <class Step>
void time_memory_bound(benchmark::State& state, double bytes, Step&& step) {
  step();  // warm-up
  double seconds = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    seconds += dt;
  }
  state.SetBytesProcessed(int64_t(bytes) * int64_t(state.iterations()));
  state.counters["copy_fraction"] =
      bytes * double(state.iterations()) / seconds / g_copy_bytes_per_second;
}

void BM_RoutedAttentionDecode(benchmark::State& state, int64_t context) {
  const int64_t H = 10, Dk = 128, Dv = 192;
  const Tensor q = uniform({1, 1, H, Dk}, 1, -1, 1);
  const Tensor k = uniform({1, context, H, Dk}, 2, -1, 1);
  const Tensor v = uniform({1, context, H, Dv}, 3, -1, 1);
  const Tensor visible = Tensor::from_vector(std::vector<int64_t>{context}, {1, 1});
  time_memory_bound(state, 4.0 * double(context * H * (Dk + Dv)), [&] {
    benchmark::DoNotOptimize(ham::ops::routed_attention_decode(q, k, v, visible).out.raw_data());
  });
}

void BM_GatedDeltaRuleDecode(benchmark::State& state, int64_t batch) {
  const int64_t H = 5, K = 256, V = 384;
  const Tensor q = uniform({batch, 1, H, K}, 1, -0.06f, 0.06f);
  const Tensor k = uniform({batch, 1, H, K}, 2, -0.1f, 0.1f);
  const Tensor v = uniform({batch, 1, H, V}, 3, -1, 1);
  const Tensor g = uniform({batch, 1, H}, 4, -0.1f, -0.01f);
  const Tensor beta = uniform({batch, 1, H}, 5, 0.1f, 0.9f);
  Tensor s = uniform({batch, H, K, V}, 6, -0.1f, 0.1f);
  time_memory_bound(state, 8.0 * double(batch * H * K * V), [&] {
    benchmark::DoNotOptimize(ham::ops::gated_delta_rule_decode(s, q, k, v, g, beta).o.raw_data());
  });
}

// A decoder that has read a prompt of `context` tokens (random bytes).
struct PromptedDecoder {
  std::shared_ptr<ham::LanguageModel> model;
  std::unique_ptr<ham::Decoder> decoder;
};

PromptedDecoder prompted(const std::string& family, int64_t context) {
  PromptedDecoder p;
  p.model = ham::make_model(
      ham::ModelConfig::from_file(std::string(HAM_SOURCE_DIR) + "/configs/tiny/" + family + ".json"));
  p.decoder = std::make_unique<ham::Decoder>(*p.model, 1);
  std::mt19937_64 rng(7);
  std::vector<int64_t> prompt(static_cast<size_t>(context));
  for (int64_t& id : prompt) id = int64_t(rng() % 256);
  ham::NoGradGuard no_grad;
  p.decoder->feed({prompt});
  return p;
}

void BM_DecodeToken(benchmark::State& state, std::string family, int64_t context) {
  // One prompted decoder per case, kept across repetitions (the prompt takes seconds).
  static std::map<std::string, PromptedDecoder> decoders;
  const std::string key = family + "/" + std::to_string(context);
  if (!decoders.count(key)) decoders.emplace(key, prompted(family, context));
  PromptedDecoder& p = decoders.at(key);
  ham::NoGradGuard no_grad;
  // Each run adds its tokens to the context: what the run started from is reported.
  const double context_now = double(p.decoder->position());
  const ham::CacheBytes bytes = p.decoder->cache_bytes();
  double kv_tokens = 0;
  int64_t attention_layers = 0;
  for (int64_t l = 0; l < p.decoder->num_layers(); ++l) {
    const std::vector<int64_t> tokens = p.decoder->kv_cache_tokens(l);
    if (tokens.empty()) continue;
    kv_tokens += double(tokens[0]);
    ++attention_layers;
  }
  int64_t next = 65;
  p.decoder->feed({{next}});  // the first token grows the caches past the prompt
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    Tensor logits = p.decoder->feed({{next}});
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    benchmark::DoNotOptimize(logits.raw_data());
    next = (next * 31 + 7) % 256;
  }
  state.counters["context"] = context_now;
  state.counters["cache_bytes"] = double(bytes.total());
  state.counters["kv_tokens"] = attention_layers ? kv_tokens / double(attention_layers) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  g_copy_bytes_per_second = measure_copy_bandwidth();
  std::fprintf(stderr, "bench_decoding: copy bandwidth %.2f GB/s with %d thread(s)\n",
               g_copy_bytes_per_second / 1e9, omp_get_max_threads());
  benchmark::AddCustomContext("copy_gb_per_s", std::to_string(g_copy_bytes_per_second / 1e9));

  for (int64_t L : {1024, 4096, 16384}) {
    benchmark::RegisterBenchmark(("routed_attention_decode/L=" + std::to_string(L)).c_str(),
                                 BM_RoutedAttentionDecode, L)
        ->Unit(benchmark::kMicrosecond)
        ->UseManualTime();
  }
  for (int64_t B : {1, 8}) {
    benchmark::RegisterBenchmark(("gated_delta_rule_decode/B=" + std::to_string(B)).c_str(),
                                 BM_GatedDeltaRuleDecode, B)
        ->Unit(benchmark::kMicrosecond)
        ->UseManualTime();
  }
  for (const char* family : {"transformer", "gdn", "gdn-gsa", "ham-fixed-tau"}) {
    for (int64_t L : {1024, 4096, 16384}) {
      benchmark::RegisterBenchmark(
          ("decode_token/" + std::string(family) + "/L=" + std::to_string(L)).c_str(),
          BM_DecodeToken, std::string(family), L)
          ->Iterations(kTokensPerRun)
          ->Unit(benchmark::kMicrosecond)
          ->UseManualTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

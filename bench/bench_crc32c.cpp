// The CRC-32C that every safetensors file ham writes carries (core/crc32c.h), against a
// plain read of the same buffer on the same thread: how much a checkpoint's save and load
// pay for their checksum.
//
// Run (from the repository root):
//   ninja -C build bench/bench_crc32c
//   ./build/bench/bench_crc32c --benchmark_repetitions=5
//
// What it measures, each over a 64 MiB buffer of pseudo-random bytes (larger than the
// caches, as a checkpoint is):
//   - BM_ReadWords: the sum of its 64-bit words, the reference: what streaming the buffer
//     through one core costs at all;
//   - BM_Crc32c: crc32c(), on the SSE4.2 instruction where the CPU has it (the label
//     says which);
//   - BM_Crc32cPortable: crc32c_portable(), slicing by 8, what CPUs without it run.
// "bytes_per_second" is the buffer's size over the wall time of one pass.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/crc32c.h"

namespace {

const std::vector<uint8_t>& buffer() {
  static const std::vector<uint8_t> bytes = [] {
    std::vector<uint8_t> b(size_t(64) << 20);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint8_t& byte : b) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
      byte = uint8_t(x);
    }
    return b;
  }();
  return bytes;
}

void BM_ReadWords(benchmark::State& state) {
  const std::vector<uint8_t>& b = buffer();
  for (auto _ : state) {
    uint64_t sum = 0;
    for (size_t i = 0; i + 8 <= b.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, b.data() + i, 8);
      sum += word;
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(b.size()));
}
BENCHMARK(BM_ReadWords)->Unit(benchmark::kMillisecond);

void BM_Crc32c(benchmark::State& state) {
  const std::vector<uint8_t>& b = buffer();
  for (auto _ : state) benchmark::DoNotOptimize(ham::crc32c(b.data(), b.size()));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(b.size()));
  state.SetLabel(ham::crc32c_uses_hardware() ? "SSE4.2" : "portable");
}
BENCHMARK(BM_Crc32c)->Unit(benchmark::kMillisecond);

void BM_Crc32cPortable(benchmark::State& state) {
  const std::vector<uint8_t>& b = buffer();
  for (auto _ : state) benchmark::DoNotOptimize(ham::crc32c_portable(b.data(), b.size()));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(b.size()));
}
BENCHMARK(BM_Crc32cPortable)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

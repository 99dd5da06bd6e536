// What the CPU memory pool saves a training step: the same tensors allocated, written once
// (as the kernel that produces each does) and freed, every step, with the pool's cache
// (cache:1, the default's behaviour) and without it (cache:0: aligned_alloc and free).
//
// Run (from the repository root):
//   ninja -C build bench/bench_cpu_memory_pool
//   ./build/bench/bench_cpu_memory_pool --benchmark_repetitions=5
//
// A "step" is the f32 activations of one tiny-HAM layer's forward and backward (batch 8,
// 128 tokens: [1024, 384], [1024, 128], [8, 128, 2, 96], ...), allocated in that order,
// each filled by one pass over its bytes, and freed last-in first-out as the backward frees
// them. "faults" counts the minor page faults per step (getrusage), "bytes_per_second" the
// bytes written. The whole training step's figure is the closing note's, from
// `ham train` with HAM_CPU_CACHE_MIB=0 against the default.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/cpu_memory_pool.h"

namespace {

constexpr size_t kF32 = 4;

// One layer's activations and gradients of the tiny HAM config, in elements.
const std::vector<size_t> kStepTensors = {
    1024 * 128, 1024 * 384, 1024 * 384, 1024 * 128, 1024 * 192, 1024 * 192,
    1024 * 128, 8 * 128 * 2 * 96, 8 * 128 * 2 * 64, 8 * 128 * 2 * 64, 8 * 128 * 2,
    8 * 128 * 4 * 48, 8 * 128 * 4 * 32, 8 * 128 * 4, 1024 * 257, 1024 * 257,
    1024 * 384, 1024 * 128, 1024 * 192, 8 * 128 * 2 * 96, 1024 * 128, 1024 * 384};

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

void BM_TrainingStepAllocations(benchmark::State& state) {
  const bool cache = state.range(0) != 0;
  ham::CpuMemoryPool pool(cache ? size_t(256) << 20 : 0);
  std::vector<void*> held;
  int64_t bytes = 0;
  const int64_t faults_before = minor_faults();
  for (auto _ : state) {
    for (size_t elements : kStepTensors) {
      void* block = pool.allocate(elements * kF32);
      std::memset(block, 1, elements * kF32);
      held.push_back(block);
      bytes += int64_t(elements * kF32);
    }
    for (auto it = held.rbegin(); it != held.rend(); ++it) pool.free(*it);
    held.clear();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(bytes);
  state.counters["faults"] = benchmark::Counter(double(minor_faults() - faults_before),
                                                benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_TrainingStepAllocations)->ArgName("cache")->Arg(0)->Arg(1)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

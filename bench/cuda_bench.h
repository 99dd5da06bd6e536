#pragma once
// What the plain CUDA benchmark programs share (bench_*_cuda.cpp; they time with CUDA events
// rather than Google Benchmark): the command line, the GPU and CSV set-up, their inputs and
// the event timing loop, and the block timeline tables (--timeline).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kernel_settings.h"
#include "core/tensor.h"
#include "cuda/autotune.h"
#include "cuda/block_timeline.h"
#include "cuda/check.h"
#include "cuda/stream.h"

namespace ham::bench {

struct CudaBenchArgs {
  int reps = 10;
  std::string csv_path;  // "" = no CSV
  std::string filter;    // run only the cases it matches (matches_filter)
  // Small cases in place of the benchmark's, sized for the SIMT emulator, that take every
  // table's path: the CI's check that a GPU session's benchmark runs (times meaningless).
  bool smoke = false;
  // The kernel settings --set applied, "NAME=VALUE" each, in order.
  std::vector<std::string> settings;

  // They as one field of a CSV or a table's title: space-separated, or "defaults".
  std::string settings_text() const {
    std::string text;
    for (const std::string& s : settings) text += (text.empty() ? "" : " ") + s;
    return text.empty() ? "defaults" : text;
  }
};

// Whether the case `label` is one --filter asks for: every case without a filter, else
// those whose label contains one of its '|'-separated parts ("T4096_B4|docs20").
inline bool matches_filter(const std::string& filter, const std::string& label) {
  if (filter.empty()) return true;
  for (size_t from = 0;;) {
    const size_t bar = filter.find('|', from);
    const std::string part = filter.substr(from, bar == std::string::npos ? bar : bar - from);
    if (!part.empty() && label.find(part) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    from = bar + 1;
  }
}

// [--reps N] [--csv FILE] [--filter SUBSTRING] [--set kernel.NAME=VALUE ...], and [--smoke]
// where the program has such cases (`takes_smoke`); anything else prints the usage and
// exits 2. Each --set applies a kernel setting (core/kernel_settings.h,
// docs/kernel_settings.md) for the whole run, as `ham train --set` does, and prints
// "kernel: NAME OLD -> NEW"; so that a table runs under a variant without a rebuild. One
// the backend does not take is a one-line error naming it, and exit 2.
inline CudaBenchArgs parse_cuda_bench_args(int argc, char** argv, int default_reps,
                                           bool takes_smoke = false) {
  CudaBenchArgs args;
  args.reps = default_reps;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) args.reps = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--csv" && i + 1 < argc) args.csv_path = argv[++i];
    else if (arg == "--filter" && i + 1 < argc) args.filter = argv[++i];
    else if (arg == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
    else if (arg == "--smoke" && takes_smoke) args.smoke = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--reps N] [--csv FILE] [--filter SUBSTRING] "
                   "[--set kernel.NAME=VALUE ...]%s\n",
                   argv[0], takes_smoke ? " [--smoke]" : "");
      std::exit(2);
    }
  }
  for (const std::string& text : sets) {
    const std::string prefix = "kernel.";
    const size_t eq = text.find('=');
    try {
      HAM_CHECK(text.rfind(prefix, 0) == 0 && eq != std::string::npos && eq > prefix.size(),
                "expected kernel.NAME=VALUE");
      const std::string name = text.substr(prefix.size(), eq - prefix.size());
      const std::string value = text.substr(eq + 1);
      std::printf("kernel: %s\n", apply_kernel_setting(name, value).c_str());
      args.settings.push_back(name + "=" + value);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: --set %s: %s\n", argv[0], text.c_str(), e.what());
      std::exit(2);
    }
  }
  std::fflush(stdout);
  return args;
}

// --smoke: kernel.autotune times each combination once after its untimed call, not 3 x 2
// times (the choice's path, not its quality).
inline void shorten_autotune_for_smoke() {
  cuda::exchange_autotune_plan({.rounds = 1, .reps = 1, .margin = 0.02});
}

// False, after saying why on stderr, when `program` finds no usable GPU.
inline bool gpu_available(const char* program) {
  const std::string reason = cuda::unavailable_reason();
  if (reason.empty()) return true;
  std::fprintf(stderr, "%s: %s\n", program, reason.c_str());
  return false;
}

// The CSV file at `path` with its header line written; a closed stream for "" (no CSV).
inline std::ofstream open_csv(const std::string& path, const char* header) {
  std::ofstream csv;
  if (path.empty()) return csv;
  csv.open(path);
  if (!csv) throw Error("--csv " + path + ": cannot open for writing");
  csv << header << "\n";
  return csv;
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Values uniform in [lo, hi) from splitmix64 (cheap, and the same on every run), rounded to
// `dtype`, on GPU 0.
inline Tensor uniform_on_gpu(const Shape& shape, DType dtype, uint64_t seed, float lo, float hi) {
  std::vector<float> values(size_t(shape_numel(shape)));
  uint64_t state = seed;
  for (float& v : values) {
    state = splitmix64(state);
    v = lo + (hi - lo) * float(state >> 40) / float(1 << 24);
  }
  return Tensor::from_vector(values, shape).to(dtype).to(Device::cuda());
}

// n normal values of standard deviation `scale`.
inline std::vector<double> normal_values(int64_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> x(static_cast<size_t>(n));
  for (double& v : x) v = normal(rng);
  return x;
}

// A normal tensor whose rows (last dim) are scaled to L2 norm `norm`, in `dtype` on GPU 0
// (the gated delta rule's q and k).
inline Tensor unit_rows_on_gpu(const Shape& shape, double norm, DType dtype, std::mt19937_64& rng) {
  std::vector<double> x = normal_values(shape_numel(shape), rng);
  const size_t width = size_t(shape.back());
  for (size_t r = 0; r < x.size() / width; ++r) {
    double s = 0;
    for (size_t j = 0; j < width; ++j) s += x[r * width + j] * x[r * width + j];
    for (size_t j = 0; j < width; ++j) x[r * width + j] *= norm / std::sqrt(s);
  }
  return Tensor::from_vector(x, shape).to(dtype).to(Device::cuda());
}

// Milliseconds of each of `reps` calls step(i) on the current stream of device 0, each timed
// between two events recorded around it, after `warmup` untimed calls; sorted ascending
// (front = min, [size / 2] = median, back = max).
inline std::vector<double> sorted_event_times_ms(int reps, int warmup,
                                                 const std::function<void(int)>& step) {
  cudaStream_t stream = cuda::current_stream(0);
  for (int i = 0; i < warmup; ++i) step(i);
  std::vector<cuda::Event> starts, stops;
  for (int i = 0; i < reps; ++i) {
    starts.emplace_back(0, true);
    stops.emplace_back(0, true);
  }
  for (int i = 0; i < reps; ++i) {
    starts[size_t(i)].record(stream);
    step(i);
    stops[size_t(i)].record(stream);
  }
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) ms.push_back(stops[size_t(i)].elapsed_ms_since(starts[size_t(i)]));
  std::sort(ms.begin(), ms.end());
  return ms;
}

// The min, median and max of sorted times (as sorted_event_times_ms returns them).
struct Spread {
  double min, median, max;  // milliseconds
};
inline Spread spread_of(const std::vector<double>& sorted_ms) {
  return {sorted_ms.front(), sorted_ms[sorted_ms.size() / 2], sorted_ms.back()};
}

// Each choice kernel.autotune made in this process (cuda/autotune.h): its line, then every
// combination's median against the defaults' (defaults / it above 1: it is faster).
inline void print_autotune_choices() {
  const std::vector<cuda::AutotuneChoice> choices = cuda::autotune_choices();
  if (choices.empty()) return;
  std::printf("\nkernel.autotune's choices (each combination of the tuned settings timed at "
              "the shape; defaults / combination above 1: the combination is faster)\n");
  for (const cuda::AutotuneChoice& choice : choices) {
    std::printf("%s\n", cuda::describe(choice).c_str());
    const double defaults = choice.variants.front().median_ms;
    for (size_t i = 0; i < choice.variants.size(); ++i) {
      const cuda::TunedVariant& v = choice.variants[i];
      std::printf("  %c %9.3f ms %6.2f  %s\n", int(i) == choice.chosen ? '*' : ' ', v.median_ms,
                  defaults / v.median_ms, v.label.c_str());
    }
  }
  std::fflush(stdout);
}

// Microseconds the host takes to issue one call of `step` (the mean of `reps` calls issued
// back to back, the device's queue drained after them).
inline double host_issue_us(int reps, const std::function<void()>& step) {
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) step();
  const auto issued = std::chrono::steady_clock::now();
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::micro>(issued - start).count() / reps;
}

// The columns of a --timeline run's --csv: a row per block of each recorded launch, its
// stamps as cycles after its start (-1 where not stamped), its start and end in ns after
// the launch's first start.
inline constexpr const char* kBlockTimelineCsvHeader =
    "case,kernel,block,sm,tiles,start_cycle,copies_issued_after,first_tile_after,"
    "tiles_done_after,end_after,start_ns,end_ns";

// Each block of a recorded launch as a CSV row (the kernel's name, which holds commas,
// quoted).
inline void write_block_rows(std::ofstream& csv, const std::string& case_name,
                             const cuda::KernelTimeline& launch) {
  uint64_t first_ns = UINT64_MAX;
  for (const cuda::BlockStamps& s : launch.blocks) first_ns = std::min(first_ns, s.start_ns);
  auto after_start = [](const cuda::BlockStamps& s, uint64_t stamp) {
    return stamp == 0 ? int64_t(-1) : int64_t(stamp - s.start);
  };
  for (size_t i = 0; i < launch.blocks.size(); ++i) {
    const cuda::BlockStamps& s = launch.blocks[i];
    csv << case_name << ",\"" << launch.kernel << "\"," << i << ',' << s.sm << ','
        << s.tiles << ',' << s.start << ',' << after_start(s, s.copies_issued) << ','
        << after_start(s, s.first_tile) << ',' << after_start(s, s.tiles_done) << ','
        << after_start(s, s.end) << ',' << int64_t(s.start_ns - first_ns) << ','
        << int64_t(s.end_ns - first_ns) << '\n';
  }
}

// One pass (`run`) once more with the kernels' block stamps recorded: a row per kernel
// launch (cuda::timeline_summary_row), its first block start and last end set against the
// pass's first block start (with a CSV, a row per block there too).
template <class Run>
void timeline_rows(const char* pass, const std::string& case_name, Run run, std::ofstream& csv) {
  std::printf("%s:\n", pass);
  cuda::record_block_timelines(true);
  run();
  cuda::record_block_timelines(false);
  const std::vector<cuda::KernelTimeline> launches = cuda::take_block_timelines();
  // Summaries first, so that the pass's first start is known before any row is printed.
  std::vector<cuda::TimelineSummary> summaries(launches.size());
  std::vector<std::string> errors(launches.size());
  uint64_t pass_start_ns = UINT64_MAX;
  for (size_t i = 0; i < launches.size(); ++i) {
    // Stamps no kernel should leave end this launch's row, not the run: the CSV keeps them
    // for a look.
    try {
      summaries[i] = cuda::summarize_block_timeline(launches[i].blocks);
      if (summaries[i].blocks > 0) {
        pass_start_ns = std::min(pass_start_ns, summaries[i].first_start_ns);
      }
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  }
  for (size_t i = 0; i < launches.size(); ++i) {
    if (errors[i].empty()) {
      std::printf("%s\n",
                  cuda::timeline_summary_row(launches[i].kernel, summaries[i], pass_start_ns)
                      .c_str());
    } else {
      std::printf("%-44s error: %s\n", launches[i].kernel.c_str(), errors[i].c_str());
    }
    if (csv.is_open()) write_block_rows(csv, case_name, launches[i]);
  }
}

}  // namespace ham::bench

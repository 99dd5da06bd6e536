// Routed (sparse-KV) attention on the GPU: compaction, forward and backward times of ham's
// CUDA kernels (cuda/routed_attention.cu), for comparison with PyTorch's SDPA flash
// attention and FlexAttention on the same shapes and masks
// (bench/bench_routed_attention_torch.py reads this program's CSV).
//
// Run (on a GPU machine; scripts/gpu_check.sh does this):
//   ./build/bench/bench_routed_attention_cuda --csv routed_ham.csv [--reps 10] [--filter T4096]
//   ./build/bench/bench_routed_attention_cuda --timeline [--filter docs20] [--csv blocks.csv]
//   python3 bench/bench_routed_attention_torch.py routed_ham.csv
// --part main prints only the first table (and writes the CSV), --part variants only the
// tables after it, so that a run with a deadline times the reference before the variants;
// --part persistent only the first three of those (a block a tile vs persistent blocks).
// --set kernel.NAME=VALUE (repeatable, bench/cuda_bench.h) runs every table under a kernel
// setting; the CSV's `settings` field names them. Two runs of the first table, one under
// --set, meet one reference run: bench_routed_attention_torch.py a.csv --also b.csv.
// --smoke runs small cases that take every table's path instead, on the SIMT emulator in CI
// (bench_routed_attention_cuda_on_emulated_gpu, bench/smoke_on_emulated_gpu.sh), so that no
// GPU session is the first to run a table; the times mean nothing there.
//
// The masks are a pure function of (b, t) that the Python script recomputes bit for bit:
//   selected(b, t) = splitmix64(seed + b * T + t) >> 40  <  density * 2^24   (density 1: all)
//   doc(b, t)      = t * docs / T                          (docs equal runs of tokens)
// value_scale p is present (the learned router's path), q, k, v are bf16 normal values.
// Each step is timed on its own with CUDA events after 3 warm-ups; the table gives the
// median in ms (the CSV the min and max too), and TFLOP/s counted on the visible pairs only:
//   forward 2 * pairs * Hq * (Dk + Dv), backward 2.5 x that (flash-attention's convention).
// After it, #8's goal against our own dense time: time / (rho x dense time) of each case
// below rho 1 whose dense case ran, at min / median / max, and (without --set) the same of
// the tuned passes against the tuned dense case.
// "fwd tuned" and "bwd tuned" are the forward and the backward with kernel.autotune on
// (cuda/autotune.h: their bit-equal variants timed at the case's shape in the first warm-up
// call, checked equal to the defaults' outputs, the fastest kept); the lines after the table
// give each choice and every combination's time. Under --set they are not timed ("-"), since
// a tuned setting set by hand is an error while autotune is on.
// The tables after it (not in the CSV) time the variants in the same run: first the forward
// and the backward on one warpgroup, each with a block a tile against persistent blocks
// (set_attention_forward_persistent, set_attention_backward_dq_persistent and
// set_attention_backward_dkdv_persistent), with each variant's time / (rho x dense time);
// then the backward's unselected keys' zeros written by its first pass against by the dQ
// blocks (set_attention_backward_zeros_in_dq); then the tensor-core forward of the 128 x 128 cases
// with 64-row blocks (one 16-row tile per warp) against the default 128-row blocks (two)
// (cuda/routed_attention.h), and 64 against 128 rows for value heads of 192.
// The next two time the backward and the forward on warpgroup tensor cores (wgmma, sm_90a)
// against mma.sync, for the head dims those have (64 and 128, 128 x 192, 256 x 256); then the
// wgmma dQ kernel's key tiles of 32 against 64 and 16 against 32
// (set_attention_backward_dq_keys), its blocks
// from their rows' ranges against from the query tiles' records
// (set_attention_backward_dq_records), the backward with its first pass in order against
// beside the others on a second stream (set_attention_backward_overlap), and last with its
// dK/dV blocks' key tiles by rank against by work (set_attention_backward_key_order); then,
// on any GPU, the backward's kernels as plain against dependent launches
// (set_dependent_launches, cuda/dependent_launch.h).
//
// --timeline (with --filter, --reps) instead prints, for each case, where the blocks of one
// forward and one backward spend their time (cuda/block_timeline.h: per kernel launch its
// first start and last end after the pass's first block start, so that the gaps between
// kernels show; the prologue, the time a tile and the epilogue at p10 / median / p90, a
// least-squares fixed cost and cost a tile, the SMs' idle share between blocks and at the
// tail), beside the event time of each pass and the host's time to issue it (when that is
// near the event time, the pass waits on the host, not the GPU); then the backward once
// more with the unselected keys' zeros from its first pass, not the dQ blocks (the default;
// set_attention_backward_zeros_in_dq), once with that pass in order, not beside the others
// on a second stream (its default; set_attention_backward_overlap), once with the dQ
// kernel's blocks started from the query tiles' records (set_attention_backward_dq_records),
// once with the dQ kernel in 16-key tiles (set_attention_backward_dq_keys), the forward and
// the backward with the persistent kernels (an entry a query tile, or a key tile for the
// dK/dV kernel's), once with the
// dK/dV blocks' key tiles by work (set_attention_backward_key_order), and once as dependent
// launches (set_dependent_launches). With
// --csv, every block's stamps go to the file as well: case, kernel, block, SM, tiles, its
// start cycle, its first copies issued, first tile, tiles done and end as cycles after its
// start (-1 where not stamped), and its start and end in ns after the launch's first start.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops/routed_attention.h"
#include "core/tensor.h"
#include "bench/cuda_bench.h"
#include "cuda/block_timeline.h"
#include "cuda/check.h"
#include "cuda/dependent_launch.h"
#include "cuda/routed_attention.h"
#include "cuda/stream.h"

namespace {

using namespace ham;
using bench::host_issue_us;
using bench::timeline_rows;

struct BenchCase {
  int64_t batch, seq_len, q_heads, kv_heads, key_dim, value_dim;
  double density;
  int64_t docs;
  // e.g. T16384_B1_H16x16_D128_rho50_docs1; unequal head dims as D128x192
  std::string name() const {
    char dims[48], text[128];
    std::snprintf(dims, sizeof dims, value_dim == key_dim ? "%lld" : "%lldx%lld",
                  (long long)key_dim, (long long)value_dim);
    std::snprintf(text, sizeof text, "T%lld_B%lld_H%lldx%lld_D%s_rho%d_docs%lld",
                  (long long)seq_len, (long long)batch, (long long)q_heads, (long long)kv_heads,
                  dims, int(density * 100 + 0.5), (long long)docs);
    return text;
  }
};

// --smoke (set once by main): bench_cases() gives small cases for the SIMT emulator.
bool smoke_cases = false;

// 16k tokens per step (B * T), 16 heads of 128, as in flash-attention's published tables.
std::vector<BenchCase> bench_cases() {
  if (smoke_cases) {  // every table's path on the emulator: each head dims a table picks
    return {{1, 256, 2, 2, 128, 128, 0.25, 1}, {1, 256, 2, 2, 128, 128, 0.5, 3},
            {1, 256, 2, 1, 128, 128, 1.0, 1},  {1, 192, 2, 2, 128, 192, 0.5, 1},
            {1, 128, 1, 1, 64, 64, 0.25, 3},   {1, 128, 1, 1, 256, 256, 0.25, 1},
            {1, 256, 2, 2, 128, 128, 1.0, 1}};  // the dense time of the first
  }
  std::vector<BenchCase> cases;
  for (int64_t seq_len : {4096, 16384}) {
    for (int64_t docs : {1, 20}) {
      for (double density : {0.05, 0.25, 0.5, 1.0}) {
        cases.push_back({16384 / seq_len, seq_len, 16, 16, 128, 128, density, docs});
      }
    }
  }
  cases.push_back({1, 16384, 16, 4, 128, 128, 0.25, 20});  // grouped-query heads
  cases.push_back({1, 16384, 16, 16, 64, 64, 0.25, 20});
  // The paper's HAM layer: 10 heads of q/k 128 and v 192, T = 16384 (one sequence a GPU),
  // its KV target rho = 0.5, and 0.25; dense for the time <= 1.2 rho dense goal.
  for (double density : {1.0, 0.5, 0.25}) cases.push_back({1, 16384, 10, 10, 128, 192, density, 1});
  // Head dims of 256 (the dK/dV pass in two kernels, cuda/routed_attention.cu).
  for (double density : {1.0, 0.25}) cases.push_back({1, 16384, 8, 8, 256, 256, density, 1});
  return cases;
}

constexpr uint64_t kMaskSeed = 12345;

std::vector<uint8_t> make_select(const BenchCase& c) {
  std::vector<uint8_t> s(size_t(c.batch * c.seq_len));
  const uint64_t threshold = uint64_t(c.density * double(1 << 24));
  for (int64_t n = 0; n < c.batch * c.seq_len; ++n) {
    s[size_t(n)] = c.density >= 1.0 || (bench::splitmix64(kMaskSeed + uint64_t(n)) >> 40) < threshold;
  }
  return s;
}

std::vector<int64_t> make_docs(const BenchCase& c) {
  std::vector<int64_t> d(size_t(c.batch * c.seq_len));
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t t = 0; t < c.seq_len; ++t) d[size_t(b * c.seq_len + t)] = t * c.docs / c.seq_len;
  }
  return d;
}

// sum over (b, t) of |S(b, t)|.
double visible_pairs(const BenchCase& c, const std::vector<uint8_t>& select,
                     const std::vector<int64_t>& docs) {
  double pairs = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t in_doc = 0;
    for (int64_t t = 0; t < c.seq_len; ++t) {
      const size_t n = size_t(b * c.seq_len + t);
      if (t > 0 && docs[n] != docs[n - 1]) in_doc = 0;
      in_doc += select[n];
      pairs += double(in_doc);
    }
  }
  return pairs;
}

// Milliseconds of `reps` calls of `step` (after 3 untimed ones): min, median, max.
bench::Spread time_ms(int reps, const std::function<void()>& step) {
  return bench::spread_of(bench::sorted_event_times_ms(reps, 3, [&](int) { step(); }));
}

struct Timing {
  bench::Spread compact, forward, backward;
  // With kernel.autotune on (cuda/autotune.h); NaN where not timed (under --set).
  bench::Spread forward_tuned, backward_tuned;
  double pairs;
};

// A case's inputs on the GPU (bf16, value-scaled) and its selection.
struct CaseInputs {
  std::vector<uint8_t> select_host;
  std::vector<int64_t> docs_host;
  Tensor select, docs, q, k, v, p, dout;
  CompactSelection selection;

  explicit CaseInputs(const BenchCase& c)
      : select_host(make_select(c)), docs_host(make_docs(c)) {
    const DType dtype = DType::BF16;
    const Device gpu = Device::cuda();
    select = Tensor::from_vector(select_host, {c.batch, c.seq_len}).to(gpu);
    docs = Tensor::from_vector(docs_host, {c.batch, c.seq_len}).to(gpu);
    q = bench::uniform_on_gpu({c.batch, c.seq_len, c.q_heads, c.key_dim}, dtype, 1, -1.f, 1.f);
    k = bench::uniform_on_gpu({c.batch, c.seq_len, c.kv_heads, c.key_dim}, dtype, 2, -1.f, 1.f);
    v = bench::uniform_on_gpu({c.batch, c.seq_len, c.kv_heads, c.value_dim}, dtype, 3, -1.f, 1.f);
    p = bench::uniform_on_gpu({c.batch, c.seq_len}, dtype, 4, 0.2f, 1.5f);
    dout = bench::uniform_on_gpu({c.batch, c.seq_len, c.q_heads, c.value_dim}, dtype, 5, -1.f, 1.f);
  }
};

// With `tuned`, the forward and the backward with kernel.autotune on too.
Timing run_case(const BenchCase& c, int reps, bool tuned) {
  CaseInputs in(c);
  Timing t{};
  t.compact = time_ms(reps, [&] { in.selection = ops::compact_selection(in.select, in.docs); });
  ops::RoutedAttentionOutput forward;
  t.forward = time_ms(reps, [&] {
    forward = ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
  });
  t.backward = time_ms(reps, [&] {
    ops::routed_attention_backward(in.dout, in.q, in.k, in.v, in.selection, forward.out,
                                   forward.lse, in.p);
  });
  const double none = std::numeric_limits<double>::quiet_NaN();
  t.forward_tuned = t.backward_tuned = bench::Spread{none, none, none};
  if (tuned) {  // each first warm-up call times the pass's bit-equal variants at this shape
    const bool was_on = cuda::set_autotune(true);
    ops::RoutedAttentionOutput tuned_forward;
    t.forward_tuned = time_ms(reps, [&] {
      tuned_forward = ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
    });
    t.backward_tuned = time_ms(reps, [&] {
      ops::routed_attention_backward(in.dout, in.q, in.k, in.v, in.selection, tuned_forward.out,
                                     tuned_forward.lse, in.p);
    });
    cuda::set_autotune(was_on);
  }
  t.pairs = visible_pairs(c, in.select_host, in.docs_host);
  return t;
}

// The forward's ms (min, median, max) with `rows`-row tensor-core blocks and `keys`-key
// tiles (the latter for 128-row blocks with value heads of 128; cuda/routed_attention.h).
bench::Spread forward_ms_with(CaseInputs& in, int rows, int keys, int reps) {
  const int previous_wgmma = cuda::set_attention_forward_wgmma(0);  // rows and keys: mma.sync's
  const int previous_rows = cuda::set_attention_forward_rows(rows);
  const int previous_keys = cuda::set_attention_forward_keys(keys);
  const bench::Spread ms = time_ms(reps, [&] {
    ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
  });
  cuda::set_attention_forward_keys(previous_keys);
  cuda::set_attention_forward_rows(previous_rows);
  cuda::set_attention_forward_wgmma(previous_wgmma);
  return ms;
}

// The forward's ms (min, median, max) with a tuning setter of cuda/routed_attention.h set
// to `value`, restored after: set_attention_forward_wgmma (0: mma.sync; 1 or 2 warpgroups a
// block).
bench::Spread forward_ms_set(CaseInputs& in, int (*set)(int), int value, int reps) {
  const int previous = set(value);
  const bench::Spread ms = time_ms(reps, [&] {
    ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
  });
  set(previous);
  return ms;
}

// The backward's ms (min, median, max) with a tuning setter of cuda/routed_attention.h set
// to `value`, restored after.
template <class Value>
bench::Spread backward_ms_set(CaseInputs& in, const ops::RoutedAttentionOutput& forward,
                              Value (*set)(Value), Value value, int reps) {
  const Value previous = set(value);
  const bench::Spread ms = time_ms(reps, [&] {
    ops::routed_attention_backward(in.dout, in.q, in.k, in.v, in.selection, forward.out,
                                   forward.lse, in.p);
  });
  set(previous);
  return ms;
}

// The backward's ms with its kernels set to mma.sync (0) or wgmma with 1 or 2 warpgroups a
// block.
bench::Spread backward_ms_with(CaseInputs& in, const ops::RoutedAttentionOutput& forward,
                               int wgmma, int reps) {
  return backward_ms_set(in, forward, &cuda::set_attention_backward_wgmma, wgmma, reps);
}

// The backward's ms on one warpgroup a block with a setter of its wgmma dQ kernel
// (set_attention_backward_dq_keys, set_attention_backward_dq_records) set to `value`,
// restored after.
template <class Value>
bench::Spread backward_ms_on_one_warpgroup(CaseInputs& in,
                                           const ops::RoutedAttentionOutput& forward,
                                           Value (*set)(Value), Value value, int reps) {
  const Value previous = set(value);
  const bench::Spread ms = backward_ms_with(in, forward, 1, reps);
  set(previous);
  return ms;
}

// A row of a table of two variants: each one's ms at min / median / max, then the ratios
// first / second at each.
void print_spread_pair(const std::string& name, const bench::Spread& first,
                       const bench::Spread& second) {
  std::printf("%-40s", name.c_str());
  for (const bench::Spread& t : {first, second}) {
    std::printf(" %7.3f %8.3f %8.3f", t.min, t.median, t.max);
  }
  std::printf(" %5.2f %5.2f %5.2f\n", first.min / second.min, first.median / second.median,
              first.max / second.max);
  std::fflush(stdout);
}

// A table of the backward with a setting of it off and on (`what`: "off vs on"), over the
// cases (matching `filter`) that `takes` keeps, those of one document at rho 0.25 only
// (short blocks): ms at min / median / max, and the ratios off / on at each (above 1:
// `on_faster`). A case where the setting took no effect (`launches`, its calls, did not
// count the call on) says so (`why_not`) instead.
template <class Takes>
void backward_setting_table(const char* what, const char* off, const char* on,
                            const char* on_faster, const char* why_not,
                            const std::string& filter, int reps, bool (*set)(bool),
                            int64_t (*launches)(), const Takes& takes) {
  std::printf("\nbackward, %s\n(ms at min / median / max; the ratios %s / %s at each, above 1: "
              "%s)\n%-40s %26s %26s %18s\n",
              what, off, on, on_faster, "case", off, on, "ratio");
  for (const BenchCase& c : bench_cases()) {
    if (!takes(c) || (c.docs == 1 && c.density != 0.25)) continue;
    if (!bench::matches_filter(filter, c.name())) continue;
    CaseInputs in(c);
    in.selection = ops::compact_selection(in.select, in.docs);
    const ops::RoutedAttentionOutput forward =
        ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
    const int64_t before = launches();
    const bench::Spread with = backward_ms_set(in, forward, set, true, reps);
    if (launches() == before) {
      std::printf("%-40s (%s)\n", c.name().c_str(), why_not);
      continue;
    }
    print_spread_pair(c.name(), backward_ms_set(in, forward, set, false, reps), with);
  }
}

// A table of the backward on one warpgroup a block with its wgmma dQ kernel in two
// settings (`what`: "first vs second"), over the cases (matching `filter`) with heads up to
// 128: ms at min / median / max from backward_ms(inputs, forward, false) and (..., true),
// and the ratios first / second at each (above 1: `second_faster`).
template <class BackwardMs>
void dq_setting_table(const char* what, const char* first, const char* second,
                      const char* second_faster, const std::string& filter,
                      BackwardMs backward_ms) {
  std::printf("\nbackward on one warpgroup a block, %s\n(ms at min / median / max; the ratios "
              "%s / %s at each, above 1: %s)\n",
              what, first, second, second_faster);
  std::printf("%-40s %26s %26s %18s\n", "case", first, second, "ratio");
  for (const BenchCase& c : bench_cases()) {
    if (c.key_dim > 128 || c.value_dim > 128) continue;
    if (!bench::matches_filter(filter, c.name())) continue;
    CaseInputs in(c);
    in.selection = ops::compact_selection(in.select, in.docs);
    const ops::RoutedAttentionOutput forward =
        ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
    print_spread_pair(c.name(), backward_ms(in, forward, false), backward_ms(in, forward, true));
  }
}

// A table of `pass` on mma.sync and on wgmma with 1 and 2 warpgroups a block, over the
// cases (matching `filter`) whose head dims the wgmma kernels have: ms at min / median / max
// from ms_on(inputs, 0, 1 or 2), and the ratios mma / wgmma at each.
template <class MsOn>
void wgmma_table(const char* pass, const std::string& filter, MsOn ms_on) {
  std::printf("\n%s, kernels mma.sync vs wgmma with 1 and 2 warpgroups a block (ms at min / "
              "median / max;\nthe ratios mma / wgmma at each, above 1: wgmma faster)\n",
              pass);
  std::printf("%-40s %26s %26s %26s %18s %18s\n", "case", "mma.sync", "wgmma x1", "wgmma x2",
              "ratio x1", "ratio x2");
  for (const BenchCase& c : bench_cases()) {
    if (!bench::matches_filter(filter, c.name())) continue;
    if (!cuda::attention_wgmma_takes_head_dims(c.key_dim, c.value_dim)) continue;
    CaseInputs in(c);
    in.selection = ops::compact_selection(in.select, in.docs);
    const bench::Spread mma = ms_on(in, 0), one = ms_on(in, 1), two = ms_on(in, 2);
    std::printf("%-40s", c.name().c_str());
    for (const bench::Spread& t : {mma, one, two}) {
      std::printf(" %7.3f %8.3f %8.3f", t.min, t.median, t.max);
    }
    for (const bench::Spread& t : {one, two}) {
      std::printf(" %5.2f %5.2f %5.2f", mma.min / t.min, mma.median / t.median, mma.max / t.max);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

// A pass's block timeline once more with a setting of it set to `value` (restored after),
// titled `pass`; where the setting's launch counter did not move, the line `why_not` says
// the kernel that takes it did not run.
template <class Value, class Run>
void timeline_with(const char* pass, const std::string& case_name, Value (*set)(Value),
                   Value value, int64_t (*launches)(), const char* why_not, const Run& run_pass,
                   std::ofstream& csv) {
  const Value previous = set(value);
  const int64_t before = launches();
  timeline_rows(pass, case_name, run_pass, csv);
  if (launches() == before) std::printf("(%s)\n", why_not);
  set(previous);
}

// --timeline: each case's forward and backward, timed by events and by the host's issue,
// then once more with the kernels' block stamps recorded, one row per kernel launch (and,
// with a CSV, one row per block there).
void timeline_tables(const std::string& filter, int reps, const std::string& csv_path) {
  std::ofstream csv = bench::open_csv(csv_path, bench::kBlockTimelineCsvHeader);
  std::printf("block timelines (cuda/block_timeline.h): us at p10 / median / p90 over the "
              "blocks that visited a tile;\nfixed and a tile: least squares over all blocks; "
              "gaps and tail: the SMs' idle shares of the span\n");
  for (const BenchCase& c : bench_cases()) {
    if (!bench::matches_filter(filter, c.name())) continue;
    CaseInputs in(c);
    in.selection = ops::compact_selection(in.select, in.docs);
    ops::RoutedAttentionOutput forward;
    auto run_forward = [&] {
      forward = ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
    };
    auto run_backward = [&] {
      ops::routed_attention_backward(in.dout, in.q, in.k, in.v, in.selection, forward.out,
                                     forward.lse, in.p);
    };
    const bench::Spread forward_ms = time_ms(reps, run_forward);
    const bench::Spread backward_ms = time_ms(reps, run_backward);
    const double forward_host = host_issue_us(reps, run_forward);
    const double backward_host = host_issue_us(reps, run_backward);
    std::printf("\n%s: forward %.1f us (host issue %.1f), backward %.1f us (host issue %.1f), "
                "event medians\n%s\n",
                c.name().c_str(), forward_ms.median * 1e3, forward_host,
                backward_ms.median * 1e3, backward_host, cuda::timeline_summary_header().c_str());
    timeline_rows("forward", c.name(), run_forward, csv);
    timeline_rows("backward", c.name(), run_backward, csv);
    // The backward again with the unselected keys' zeros from its first pass, on the second
    // stream beside the others (set_attention_backward_zeros_in_dq off, the default until
    // the seventieth session), then with that pass in order (set_attention_backward_overlap
    // off): what its blocks cost when they run under no others'.
    const bool zeros_in_dq = cuda::set_attention_backward_zeros_in_dq(false);
    const int64_t beside_before = cuda::attention_overlapped_prologues();
    timeline_rows("backward, the unselected keys' zeros from its first pass",
                  c.name() + " first pass", run_backward, csv);
    if (cuda::attention_overlapped_prologues() != beside_before) {
      const bool overlap = cuda::set_attention_backward_overlap(false);
      timeline_rows("backward, its first pass in order", c.name() + " in order", run_backward,
                    csv);
      cuda::set_attention_backward_overlap(overlap);
    } else {
      std::printf("(the first pass forms D here: it runs in order)\n");
    }
    cuda::set_attention_backward_zeros_in_dq(zeros_in_dq);
    // And with the dQ kernel's blocks started from the query tiles' records
    // (set_attention_backward_dq_records): its prologue, against the default's above.
    timeline_with("backward, the dQ blocks from the query tiles' records",
                  c.name() + " records", &cuda::set_attention_backward_dq_records, true,
                  &cuda::attention_backward_dq_record_launches,
                  "the dQ kernel here is not the one-warpgroup wgmma kernel: no records",
                  run_backward, csv);
    // And with the dQ kernel in 16-key tiles (set_attention_backward_dq_keys): four blocks
    // an SM at 128 x 128 where 32-key tiles fit three, each with twice the tiles.
    timeline_with("backward, the dQ kernel in 16-key tiles", c.name() + " dq16",
                  &cuda::set_attention_backward_dq_keys, 16,
                  &cuda::attention_backward_dq_16_key_launches,
                  "the dQ kernel here is not the one-warpgroup wgmma kernel: its own tiles",
                  run_backward, csv);
    // And the persistent forward, dQ and dK/dV kernels (set_attention_forward_persistent,
    // set_attention_backward_dq_persistent, set_attention_backward_dkdv_persistent), an
    // entry a query tile (key tile): the prologue a tile then shows what of it the work
    // under the tile before did not hide.
    timeline_with("forward, persistent", c.name() + " persistent",
                  &cuda::set_attention_forward_persistent, -1,
                  &cuda::attention_forward_persistent_launches,
                  "the forward here is not the one-warpgroup wgmma kernel: not persistent",
                  run_forward, csv);
    timeline_with("backward, its dQ kernel persistent", c.name() + " dq persistent",
                  &cuda::set_attention_backward_dq_persistent, -1,
                  &cuda::attention_backward_dq_persistent_launches,
                  "the dQ kernel here is not the one-warpgroup wgmma kernel in 32-key tiles: "
                  "not persistent",
                  run_backward, csv);
    timeline_with("backward, its dK/dV kernel persistent", c.name() + " dkdv persistent",
                  &cuda::set_attention_backward_dkdv_persistent, -1,
                  &cuda::attention_backward_dkdv_persistent_launches,
                  "the dK/dV kernel here is not the one-warpgroup wgmma kernel: not persistent",
                  run_backward, csv);
    // And with the dK/dV blocks' key tiles by work (set_attention_backward_key_order): the
    // dK/dV kernel's span and tail against the rank order's above.
    const bool previous_order = cuda::set_attention_backward_key_order(true);
    timeline_rows("backward, the dK/dV blocks' key tiles by work", c.name() + " by work",
                  run_backward, csv);
    cuda::set_attention_backward_key_order(previous_order);
    // And as dependent launches (set_dependent_launches): the gaps between its kernels.
    const bool previous_dependent = cuda::set_dependent_launches(true);
    const int64_t dependent_before = cuda::dependent_launch_count();
    timeline_rows("backward, its kernels as dependent launches", c.name() + " dependent",
                  run_backward, csv);
    if (cuda::dependent_launch_count() == dependent_before) {
      std::printf("(no launch went out as a dependent one: compute capability below 9.0, or "
                  "no sm_90 code)\n");
    } else {
      std::printf("(the wgmma dQ and dK/dV blocks run their prologue before their wait: there "
                  "their prologue includes the wait for the kernel ahead)\n");
    }
    cuda::set_dependent_launches(previous_dependent);
    std::fflush(stdout);
  }
}

// Whether `dense` is the dense case of `c`: the same shape and documents, every key selected
// (the time / (rho x dense time) goal's denominator).
bool is_dense_case_of(const BenchCase& dense, const BenchCase& c) {
  BenchCase same = c;
  same.density = 1.0;
  return dense.name() == same.name();
}

// The first table: each case's compaction, forward and backward, under the kernel settings
// --set applied (`settings`, "defaults" without), into the CSV too (its `settings` field),
// with `tuned` (no --set) each pass with kernel.autotune on too; then #8's goal against our
// own dense time: for each case below rho 1 whose dense case (the same shape and documents)
// ran too, time / (rho x dense time), forward and backward, at min / median / max (each the
// ratio of the two at that rank; goal: at most 1.2).
void main_table(const std::string& filter, int reps, const std::string& csv_path,
                const std::string& settings, bool tuned) {
  std::ofstream csv = bench::open_csv(
      csv_path, "name,batch,seq_len,q_heads,kv_heads,key_dim,value_dim,density,docs,mask_seed,reps,"
                "visible_pairs,compact_ms,forward_ms,backward_ms,forward_tflops,backward_tflops,"
                "forward_ms_min,forward_ms_max,backward_ms_min,backward_ms_max,"
                "forward_tuned_ms,forward_tuned_ms_min,forward_tuned_ms_max,"
                "backward_tuned_ms,backward_tuned_ms_min,backward_tuned_ms_max,settings");
  std::printf("kernel settings: %s\n", settings.c_str());
  std::printf("%-40s %12s %10s %10s %11s %9s %9s %11s %11s\n", "case (bf16, value-scaled)",
              "pairs", "compact", "forward", "backward", "fwd TF/s", "bwd TF/s", "fwd tuned",
              "bwd tuned");
  // A tuned time in the table ("-" where not timed) and in the CSV (empty there).
  auto tuned_cell = [](double ms) {
    char text[32];
    std::snprintf(text, sizeof text, "%9.3fms", ms);
    return std::isnan(ms) ? std::string("        -  ") : std::string(text);
  };
  auto tuned_field = [](double ms) {
    std::ostringstream field;
    if (!std::isnan(ms)) field << ms;  // as the stream writes the other times
    return field.str();
  };
  struct Row {
    BenchCase c;
    bench::Spread forward, backward, forward_tuned, backward_tuned;
  };
  std::vector<Row> rows;
  for (const BenchCase& c : bench_cases()) {
    if (!bench::matches_filter(filter, c.name())) continue;
    Timing t = run_case(c, reps, tuned);
    rows.push_back({c, t.forward, t.backward, t.forward_tuned, t.backward_tuned});
    const double flops = 2.0 * t.pairs * double(c.q_heads) * double(c.key_dim + c.value_dim);
    const double fwd_tflops = flops / (t.forward.median * 1e-3) / 1e12;
    const double bwd_tflops = 2.5 * flops / (t.backward.median * 1e-3) / 1e12;
    std::printf("%-40s %12.0f %8.3fms %8.3fms %9.3fms %9.1f %9.1f %s %s\n", c.name().c_str(),
                t.pairs, t.compact.median, t.forward.median, t.backward.median, fwd_tflops,
                bwd_tflops, tuned_cell(t.forward_tuned.median).c_str(),
                tuned_cell(t.backward_tuned.median).c_str());
    std::fflush(stdout);
    if (csv.is_open()) {
      csv << c.name() << ',' << c.batch << ',' << c.seq_len << ',' << c.q_heads << ','
          << c.kv_heads << ',' << c.key_dim << ',' << c.value_dim << ',' << c.density << ','
          << c.docs << ',' << kMaskSeed << ',' << reps << ',' << t.pairs << ','
          << t.compact.median << ',' << t.forward.median << ',' << t.backward.median << ','
          << fwd_tflops << ',' << bwd_tflops << ',' << t.forward.min << ',' << t.forward.max
          << ',' << t.backward.min << ',' << t.backward.max;
      for (const bench::Spread& spread : {t.forward_tuned, t.backward_tuned}) {
        for (double ms : {spread.median, spread.min, spread.max}) csv << ',' << tuned_field(ms);
      }
      csv << ',' << settings << '\n';
    }
  }
  bench::print_autotune_choices();
  std::printf("\ntime / (rho x dense time) at min / median / max, against the dense case of "
              "the same shape and documents (#8's goal: at most 1.2); tuned: both with "
              "kernel.autotune on\n%-40s %20s %20s%s\n",
              "case", "forward", "backward", tuned ? "     tuned forward    tuned backward" : "");
  for (const Row& row : rows) {
    if (row.c.density >= 1.0) continue;
    const double rho = row.c.density;
    auto ratios = [rho](const bench::Spread& t, const bench::Spread& d) {
      char text[32];
      std::snprintf(text, sizeof text, "%.2f/%.2f/%.2f", t.min / (rho * d.min),
                    t.median / (rho * d.median), t.max / (rho * d.max));
      return std::string(text);
    };
    for (const Row& dense : rows) {
      if (!is_dense_case_of(dense.c, row.c)) continue;
      std::printf("%-40s %20s %20s", row.c.name().c_str(),
                  ratios(row.forward, dense.forward).c_str(),
                  ratios(row.backward, dense.backward).c_str());
      if (tuned) {
        std::printf(" %20s %20s", ratios(row.forward_tuned, dense.forward_tuned).c_str(),
                    ratios(row.backward_tuned, dense.backward_tuned).c_str());
      }
      std::printf("\n");
    }
  }
  std::fflush(stdout);
}

// A pass on one warpgroup a block (wgmma, head dims 64 and 128) with a block a query tile
// against persistent blocks (`set` to 0 and to -1; `launches` counts the persistent calls),
// over the cases (matching `filter`) it takes: ms at min / median / max and the ratios at
// each; then, for each rho below 1 in one document whose dense case ran too,
// time / (rho x dense time), each variant against its own dense time (#8's goal: at most
// 1.2). ms(inputs, forward) times the pass as the settings have it.
template <class PassMs>
void persistent_table(const char* pass, const std::string& filter, int (*set)(int),
                      int64_t (*launches)(), PassMs ms) {
  std::printf("\n%s, a block a tile vs persistent blocks\n(ms at min / median / max; "
              "the ratios a block a tile / persistent at each, above 1: persistent faster)\n"
              "%-40s %26s %26s %18s\n",
              pass, "case", "a block a tile", "persistent", "ratio");
  struct Row {
    BenchCase c;
    double a_block_a_tile, persistent;  // medians
  };
  std::vector<Row> rows;
  for (const BenchCase& c : bench_cases()) {
    if ((c.key_dim != 64 && c.key_dim != 128) || (c.value_dim != 64 && c.value_dim != 128)) {
      continue;
    }
    if (!bench::matches_filter(filter, c.name())) continue;
    CaseInputs in(c);
    in.selection = ops::compact_selection(in.select, in.docs);
    const ops::RoutedAttentionOutput forward =
        ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
    const int previous = set(0);
    const bench::Spread own = ms(in, forward);
    set(-1);
    const int64_t before = launches();
    const bench::Spread persistent = ms(in, forward);
    const bool ran = launches() != before;
    set(previous);
    if (!ran) {
      std::printf("%-40s (the persistent kernel did not run)\n", c.name().c_str());
      continue;
    }
    print_spread_pair(c.name(), own, persistent);
    rows.push_back({c, own.median, persistent.median});
  }
  std::printf("\n%s, time / (rho x dense time), medians, one document (#8's goal: at most "
              "1.2)\n%-40s %15s %11s\n", pass, "case", "a block a tile", "persistent");
  for (const Row& row : rows) {
    if (row.c.docs != 1 || row.c.density >= 1.0) continue;
    for (const Row& dense : rows) {
      if (!is_dense_case_of(dense.c, row.c)) continue;
      std::printf("%-40s %15.3f %11.3f\n", row.c.name().c_str(),
                  row.a_block_a_tile / (row.c.density * dense.a_block_a_tile),
                  row.persistent / (row.c.density * dense.persistent));
    }
  }
  std::fflush(stdout);
}

// The persistent forward and dQ kernels (seventy-second session) and dK/dV kernel
// (seventy-eighth), untimed on a GPU when written, each against its kernel of a block a tile;
// skipped, saying so, without wgmma.
void persistent_tables(const std::string& filter, int reps) {
  if (!cuda::attention_wgmma_available()) {
    std::printf("\nthe persistent kernels: skipped (this build has no sm_90a code, or the GPU "
                "is not of compute capability 9.0)\n");
    return;
  }
  const int forward_groups = cuda::set_attention_forward_wgmma(1);
  persistent_table("forward on one warpgroup a block", filter,
                   &cuda::set_attention_forward_persistent,
                   &cuda::attention_forward_persistent_launches,
                   [&](CaseInputs& in, const ops::RoutedAttentionOutput&) {
                     return time_ms(reps, [&] {
                       ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
                     });
                   });
  cuda::set_attention_forward_wgmma(forward_groups);
  const int backward_groups = cuda::set_attention_backward_wgmma(1);
  auto backward_ms = [&](CaseInputs& in, const ops::RoutedAttentionOutput& forward) {
    return time_ms(reps, [&] {
      ops::routed_attention_backward(in.dout, in.q, in.k, in.v, in.selection, forward.out,
                                     forward.lse, in.p);
    });
  };
  const int dq_keys = cuda::set_attention_backward_dq_keys(32);
  persistent_table("backward on one warpgroup a block, its dQ kernel", filter,
                   &cuda::set_attention_backward_dq_persistent,
                   &cuda::attention_backward_dq_persistent_launches, backward_ms);
  cuda::set_attention_backward_dq_keys(dq_keys);
  persistent_table("backward on one warpgroup a block, its dK/dV kernel", filter,
                   &cuda::set_attention_backward_dkdv_persistent,
                   &cuda::attention_backward_dkdv_persistent_launches, backward_ms);
  cuda::set_attention_backward_wgmma(backward_groups);
}

// The tables after the first: the kernels' variants against each other.
void variant_tables(const std::string& filter, int reps) {
  // First, as the newest.
  persistent_tables(filter, reps);
  // First, as the newest: the unselected keys' zeros from the backward's first pass (on the
  // second stream, the dQ kernel starting 25-30 us into the backward after it on the
  // H200's timelines) or written by the dQ blocks, with no first pass (the default since
  // the seventieth session: 1.00-1.02x).
  backward_setting_table(
      "the unselected keys' zeros from the first pass vs from the dQ blocks", "first pass",
      "dQ blocks", "dQ blocks faster", "the dQ kernel does not form D here: the first pass zeroes",
      filter, reps, &cuda::set_attention_backward_zeros_in_dq,
      &cuda::attention_backward_zeros_in_dq_launches,
      [](const BenchCase& c) { return c.density != 1.0; });  // at 1 nothing to zero
  std::printf("\nforward, block rows 64 vs 128 and, at 128 rows, key tiles of 32 vs 64\n"
              "(median ms; ratios above 1: 128 rows faster than 64, 64 keys than 32)\n");
  std::printf("%-40s %11s %11s %11s %6s %6s\n", "case", "64 x 64", "128 x 32", "128 x 64",
              "rows", "keys");
  for (const BenchCase& c : bench_cases()) {
    // With 20 documents too: there a block visits one to five key tiles, and 64-row
    // blocks, twice as many, show a block's fixed cost (scripts/attention_block_cost.py).
    if (c.key_dim != 128 || c.value_dim != 128 || c.q_heads != c.kv_heads) continue;
    if (!bench::matches_filter(filter, c.name())) continue;
    CaseInputs in(c);
    in.selection = ops::compact_selection(in.select, in.docs);
    const double ms_64 = forward_ms_with(in, 64, 64, reps).median;
    const double ms_128_32 = forward_ms_with(in, 128, 32, reps).median;
    const double ms_128 = forward_ms_with(in, 128, 64, reps).median;
    std::printf("%-40s %9.3fms %9.3fms %9.3fms %6.2f %6.2f\n", c.name().c_str(), ms_64,
                ms_128_32, ms_128, ms_64 / ms_128, ms_128_32 / ms_128);
    std::fflush(stdout);
  }
  // Value heads of 192 (the paper's HAM layer) on mma.sync: 64-row blocks against the
  // default 128-row ones (1.32-1.35x faster on the H200, 2026-11-27; 32-key tiles either
  // way). With wgmma they take forward_wgmma.
  std::printf("\nforward at value heads of 192, block rows 64 vs 128 (ms at min / median / "
              "max; the ratios 64 / 128 at each, above 1: 128 rows faster)\n");
  std::printf("%-40s %26s %26s %18s\n", "case", "64 rows", "128 rows", "ratio");
  for (const BenchCase& c : bench_cases()) {
    if (c.value_dim != 192) continue;
    if (!bench::matches_filter(filter, c.name())) continue;
    CaseInputs in(c);
    in.selection = ops::compact_selection(in.select, in.docs);
    print_spread_pair(c.name(), forward_ms_with(in, 64, 64, reps),
                      forward_ms_with(in, 128, 64, reps));
  }
  if (!cuda::attention_wgmma_available()) {
    std::printf("\nthe wgmma kernels: skipped (this build has no sm_90a code, or the GPU is "
                "not of compute capability 9.0)\n");
  } else {
    wgmma_table("backward", filter, [&](CaseInputs& in, int wgmma) {
      const ops::RoutedAttentionOutput forward =
          ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
      return backward_ms_with(in, forward, wgmma, reps);
    });
    wgmma_table("forward (mma.sync in its default 128-row blocks)", filter,
                [&](CaseInputs& in, int wgmma) {
                  return forward_ms_set(in, &cuda::set_attention_forward_wgmma, wgmma, reps);
                });
    // 32-key tiles take the 128 x 128 dQ kernel from 187 registers and 98 KB of shared
    // memory to 142 and 67 KB (ptxas, sm_90a): three blocks an SM where two fit, for the
    // short blocks of packed documents, at twice the tiles' bookkeeping. 32 is the default
    // (timed faster at rho 0.25 and with packed documents); the one-document cases at
    // rho 0.5 and 1, whose blocks see the most keys, say whether it should stay so there.
    dq_setting_table("the wgmma dQ kernel's key tiles 64 vs 32", "64 keys", "32 keys",
                     "32 faster", filter,
                     [&](CaseInputs& in, const ops::RoutedAttentionOutput& forward,
                         bool second) {
                       return backward_ms_on_one_warpgroup(
                           in, forward, &cuda::set_attention_backward_dq_keys,
                           second ? 32 : 64, reps);
                     });
    // 16-key tiles take the 128 x 128 dQ kernel to 49 KB of shared memory, bound to 128
    // registers: four blocks an SM where 32-key tiles fit three, for blocks of packed
    // documents that see two or three 32-key tiles, at twice the tiles' bookkeeping again.
    dq_setting_table("the wgmma dQ kernel's key tiles 32 vs 16", "32 keys", "16 keys",
                     "16 faster", filter,
                     [&](CaseInputs& in, const ops::RoutedAttentionOutput& forward,
                         bool second) {
                       return backward_ms_on_one_warpgroup(
                           in, forward, &cuda::set_attention_backward_dq_keys,
                           second ? 16 : 32, reps);
                     });
    // The dQ blocks' prologue: from their own rows' ranges (two barriers, then the first
    // key positions) or from the query tiles' records (one load before the first copies).
    dq_setting_table("the wgmma dQ kernel's blocks from their rows' ranges vs from the "
                     "query tiles' records",
                     "ranges", "records", "records faster", filter,
                     [&](CaseInputs& in, const ops::RoutedAttentionOutput& forward,
                         bool second) {
                       return backward_ms_on_one_warpgroup(
                           in, forward, &cuda::set_attention_backward_dq_records, second,
                           reps);
                     });
    // Where the dQ kernel forms D, the first pass only zeroes the unselected rows of dk,
    // dv and dp (at rho 0.25, 101 MB at B4 T4096 H16 D128): bound by HBM, it may run
    // under the latency-bound tensor-core passes.
    // (With the zeros in the dQ blocks, the default, no first pass runs: off here.)
    const bool zeros_in_dq = cuda::set_attention_backward_zeros_in_dq(false);
    backward_setting_table(
        "its first pass (zeroing the unselected rows) in order vs beside the others on a "
        "second stream",
        "in order", "beside", "beside faster", "the first pass forms D here: it stays in order",
        filter, reps, &cuda::set_attention_backward_overlap,
        &cuda::attention_overlapped_prologues,
        [](const BenchCase& c) { return c.density != 1.0; });  // at 1 nothing to zero
    cuda::set_attention_backward_zeros_in_dq(zeros_in_dq);
    // With packed documents the dK/dV blocks' work rises and falls with each document, so
    // by rank heavy blocks start in the last wave (scripts/attention_block_order.py
    // --documents: 1.05-1.09x heaviest first's time at T16384 rho 0.25, in a model).
    backward_setting_table("the dK/dV blocks' key tiles by rank vs by work, heaviest first",
                           "by rank", "by work", "by work faster",
                           "the key tiles kept their rank order", filter, reps,
                           &cuda::set_attention_backward_key_order,
                           &cuda::attention_backward_key_order_launches,
                           [](const BenchCase&) { return true; });
  }
  // Each kernel of the backward may start before the one ahead of it ends, its blocks
  // placed and waiting at griddepcontrol.wait (cuda/dependent_launch.h): the about 4 us
  // between kernels that the block timelines showed.
  backward_setting_table("its kernels as plain vs dependent launches", "plain", "dependent",
                         "dependent faster",
                         "no launch went out as a dependent one: compute capability below 9.0, "
                         "or no sm_90 code",
                         filter, reps, &cuda::set_dependent_launches,
                         &cuda::dependent_launch_count, [](const BenchCase&) { return true; });
}

}  // namespace

int main(int argc, char** argv) {
  // --timeline and --part are this program's own; the rest are parse_cuda_bench_args'.
  std::vector<char*> shared_args;
  bool timeline = false;
  std::string part = "all";
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string(argv[i]) == "--timeline") {
      timeline = true;
    } else if (i > 0 && std::string(argv[i]) == "--part" && i + 1 < argc) {
      part = argv[++i];
      if (part != "main" && part != "variants" && part != "persistent" && part != "all") {
        std::fprintf(stderr, "bench_routed_attention_cuda: --part '%s': expected main, "
                     "variants, persistent or all\n", part.c_str());
        return 2;
      }
    } else {
      shared_args.push_back(argv[i]);
    }
  }
  const bench::CudaBenchArgs args =
      bench::parse_cuda_bench_args(int(shared_args.size()), shared_args.data(), 10,
                                   /*takes_smoke=*/true);
  const int reps = args.reps;
  const std::string& csv_path = args.csv_path;
  const std::string& filter = args.filter;
  try {
    if (!bench::gpu_available("bench_routed_attention_cuda")) return 1;
    smoke_cases = args.smoke;
    if (args.smoke) bench::shorten_autotune_for_smoke();
    if (timeline) {
      timeline_tables(filter, reps, csv_path);
      return 0;
    }
    if (part == "persistent") {  // the first of the variant tables alone
      persistent_tables(filter, reps);
      return 0;
    }
    if (part != "variants") {
      main_table(filter, reps, csv_path, args.settings_text(), args.settings.empty());
    }
    if (part == "main") return 0;
    variant_tables(filter, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_routed_attention_cuda: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Time of ham's CUDA gated delta rule (cuda/gated_delta_rule.cu), forward and backward,
// for comparison with flash-linear-attention's chunk_gated_delta_rule on the same shapes
// (bench/bench_gated_delta_rule_fla.py reads this program's CSV and adds FLA's times).
//
// Run (on a GPU machine; scripts/gpu_check.sh does this):
//   ./build/bench/bench_gated_delta_rule_cuda --csv gdr_ham.csv [--reps 5] [--filter T4096]
//   ./build/bench/bench_gated_delta_rule_cuda --timeline [--filter T16384] [--csv blocks.csv]
//   python3 bench/bench_gated_delta_rule_fla.py gdr_ham.csv --out gdr_ratio.csv
// --smoke (with either) runs small cases that take every table's path instead, on the SIMT
// emulator in CI (bench_gated_delta_rule_cuda_on_emulated_gpu, bench/smoke_on_emulated_gpu.sh),
// so that no GPU session is the first to run a table; the times mean nothing there.
//
// Each case calls the kernel tables directly on preallocated outputs (no autograd, no
// argument checks): "fwd" is the chunked forward (o, h_final, fit_error), "bwd" the
// backward of o and h_final with every gradient wanted. Each call is timed on its own with
// CUDA events after one warm-up call; the CSV has the min, median and max in milliseconds.
// "fwd" and "bwd" are the pair a training step runs by default: the forward keeping each
// chunk's A (GatedDeltaRuleKeep::Inverses, as FLA's forward keeps A) and the backward reading
// it. "fwd_no_fit" is that forward without the fit error (want_fit_error false: a GDN
// layer's forward, and the outputs FLA's forward computes). For bf16 the "tuned" columns time
// the same three with kernel.autotune on (cuda/autotune.h: each pass's bit-equal variants
// timed at the shape in the first warm-up call, the fastest kept); a table after the first
// gives default / tuned and each choice with every combination's time.
// Inputs follow the layer: q and k L2-normalised (q then scaled by K^-1/2), v normal,
// g = -softplus(normal) (log decay), beta = sigmoid(normal); "docs" cases pack that many
// equal documents into each row (doc_ids; FLA gets the same as cu_seqlens).
// The last tables time the bf16 forward and backward with their state passes forced to 32-
// and to 64-column tiles (cuda/gated_delta_rule.h), the backward with its P^T dO kernel
// after the recomputed state pass against beside it (the default; the state pass on a
// high-priority second stream: set_gated_delta_rule_backward_overlap), at K = 256 the
// backward's state pass with one slot against K and dvl a chunk ahead
// (set_gated_delta_rule_backward_keys_ahead), where the default state passes take them,
// v_new and du in one partial sum over K against two
// (set_gated_delta_rule_state_partial_sums), and the forward and the backward with their
// state passes in 2, 4 and 8 windows of chunks, the per-chunk kernels of each window beside
// the pass over the next, against one launch (set_gated_delta_rule_forward_windows,
// ..._backward_windows; the backward with its recompute of the forward's state pass in
// such windows, ..._recompute_windows), the forward in those windows with its prepare
// kernel by the same windows (the default) against once before the passes
// (set_gated_delta_rule_forward_prepare_windows), and the forward and the backward with the
// prepare kernel in 4 warps against 8 (set_gated_delta_rule_prepare_warps), and the forward
// and the backward as plain against dependent launches (set_dependent_launches), in the
// same run; the CSV has the defaults. For bf16 the CSV also
// has the two other pairs (f32 keeps nothing: empty): "fwd_bare" keeping nothing and
// "bwd_recompute" recomputing every chunk term, and "fwd_keep" keeping every chunk state and
// "bwd_kept" reading them.
//
// --timeline (with --filter, --reps, --csv) instead prints where the blocks of each bf16
// case's passes spend their time (timeline_tables below; the columns as
// bench_routed_attention_cuda --timeline prints them, its --csv's too), the forward and
// the backward last as dependent launches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/cuda_bench.h"
#include "core/ops/gated_delta_rule.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/dependent_launch.h"
#include "cuda/gated_delta_rule.h"
#include "cuda/stream.h"

namespace {

using namespace ham;

struct BenchCase {
  std::string name;
  std::string dtype;  // bf16, f32
  int64_t batch, seq_len, heads, key_dim, value_dim, docs;
};

std::vector<BenchCase> bench_cases(bool smoke) {
  std::vector<BenchCase> cases;
  if (smoke) {  // --smoke: every table's path on the emulator in seconds
    for (std::string dtype : {"bf16", "f32"}) {
      // 32-column state passes at K = 128, which take two partial sums; 3 chunks, so that
      // 2 to 8 windows each run their state pass in windows.
      cases.push_back({"smoke_T130_H1_D128", dtype, 1, 130, 1, 128, 128, 0});
    }
    cases.push_back({"smoke_T70_H1_K256_V64", "bf16", 1, 70, 1, 256, 64, 0});  // keys ahead
    cases.push_back({"smoke_T150_docs3", "bf16", 1, 150, 1, 64, 64, 3});
    return cases;
  }
  for (std::string dtype : {"bf16", "f32"}) {
    cases.push_back({"T4096_H16_D128", dtype, 4, 4096, 16, 128, 128, 0});
    cases.push_back({"T16384_H16_D128", dtype, 2, 16384, 16, 128, 128, 0});
    cases.push_back({"T4096_H5_K256_V384", dtype, 2, 4096, 5, 256, 384, 0});
    // The paper's HAM layer at its training length: one sequence of 16384 a GPU.
    cases.push_back({"T16384_H5_K256_V384", dtype, 1, 16384, 5, 256, 384, 0});
    cases.push_back({"T16384_docs20", dtype, 1, 16384, 16, 128, 128, 20});
  }
  return cases;
}

using bench::normal_values;
using bench::unit_rows_on_gpu;

using bench::Spread;

// A forward keeping something else than the default, and the backward reading it.
struct KeepPair {
  Spread fwd, bwd;
};

struct Timing {
  Spread fwd, bwd, fwd_no_fit;
  // bf16 only: the same with kernel.autotune on (each pass's variants timed at the shape
  // first: cuda/autotune.h)
  Spread fwd_tuned, bwd_tuned, fwd_no_fit_tuned;
  bool kept = false;  // bf16: the forward kept its chunk terms (the pairs below were timed)
  KeepPair bare, states;  // GatedDeltaRuleKeep::Nothing, ::ChunkStates
  // bf16 only: forward and backward with forced state-pass tiles
  Spread fwd_state_32, fwd_state_64, bwd_state_32, bwd_state_64;
  // bf16 only: the backward with P^T dO after the recomputed state pass, and beside it
  Spread bwd_in_order, bwd_beside;
  // bf16 at K = 256 only: the backward's state pass with one slot, and with the keys ahead
  Spread bwd_one_slot, bwd_keys_ahead;
  bool keys_ahead_timed = false;
  // bf16 where the default state passes take them: one partial sum against two
  Spread fwd_one_sum, fwd_two_sums, bwd_one_sum, bwd_two_sums;
  bool partial_sums_timed = false;
  // bf16 only: the prepare kernel in 4 warps against 8
  Spread fwd_prepare_4, fwd_prepare_8, bwd_prepare_4, bwd_prepare_8;
  // bf16 only: the forward and the backward with their state passes in kWindowCounts windows
  // (and the backward with its recompute of the forward's state pass in such windows)
  std::vector<std::pair<int, Spread>> fwd_windows, bwd_windows, recompute_windows;
  // bf16 only: the forward in those windows (past 1) with its prepare kernel once, not by windows
  std::vector<std::pair<int, Spread>> fwd_windows_prepare_once;
  // bf16 only: plain launches against dependent ones (set_dependent_launches), timed in turn
  Spread fwd_plain, fwd_dependent, bwd_plain, bwd_dependent;
  bool dependent_timed = false;
};

constexpr int kWindowCounts[] = {1, 2, 4, 8};

// Milliseconds of `reps` calls of fn (after one untimed call).
template <class Fn>
Spread time_ms(int reps, Fn&& fn) {
  return bench::spread_of(bench::sorted_event_times_ms(reps, 1, [&](int) { fn(); }));
}

// One row of a table of A against B: the case, the pass (where `pass` is not null), A's and
// B's medians, then A / B at the min, median and max (above 1: B is faster).
void print_against(const std::string& name, const char* pass, const Spread& a, const Spread& b) {
  std::printf("%-22s ", name.c_str());
  if (pass) std::printf("%-4s ", pass);
  std::printf("%12.3f %12.3f %6.2f/%5.2f/%5.2f\n", a.median, b.median, a.min / b.min,
              a.median / b.median, a.max / b.max);
}

DType dtype_of_case(const BenchCase& c) { return c.dtype == "bf16" ? DType::BF16 : DType::F32; }

// The case's inputs on the GPU, drawn from rng.
GatedDeltaRuleArgs case_args(const BenchCase& c, std::mt19937_64& rng) {
  const DType dtype = dtype_of_case(c);
  const int64_t B = c.batch, T = c.seq_len, H = c.heads, K = c.key_dim, V = c.value_dim;
  GatedDeltaRuleArgs a;
  a.q = unit_rows_on_gpu({B, T, H, K}, 1.0 / std::sqrt(double(K)), dtype, rng);
  a.k = unit_rows_on_gpu({B, T, H, K}, 1.0, dtype, rng);
  a.v = Tensor::from_vector(normal_values(B * T * H * V, rng), {B, T, H, V}).to(dtype).to(Device::cuda());
  std::vector<double> g = normal_values(B * T * H, rng), beta = normal_values(B * T * H, rng);
  for (double& x : g) x = -std::log1p(std::exp(x));
  for (double& x : beta) x = 1.0 / (1.0 + std::exp(-x));
  a.g = Tensor::from_vector(g, {B, T, H}).to(dtype).to(Device::cuda());
  a.beta = Tensor::from_vector(beta, {B, T, H}).to(dtype).to(Device::cuda());
  if (c.docs > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(B * T));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) ids[size_t(b * T + t)] = int32_t(t * c.docs / T);
    }
    a.doc_ids = Tensor::from_vector(ids, {B, T}).to(Device::cuda());
  }
  ops::check_gated_delta_rule_args("bench_gated_delta_rule_cuda", a);
  return a;
}

// The gradients the backward writes, every one wanted.
GatedDeltaRuleGrads grads_for(const GatedDeltaRuleArgs& a) {
  const DType dtype = a.q.dtype();
  return {Tensor::empty(a.q.shape(), dtype, Device::cuda()),
          Tensor::empty(a.k.shape(), dtype, Device::cuda()),
          Tensor::empty(a.v.shape(), dtype, Device::cuda()),
          Tensor::empty(a.g.shape(), dtype, Device::cuda()),
          Tensor::empty(a.beta.shape(), dtype, Device::cuda()), Tensor()};
}

Timing run_case(const BenchCase& c, int reps) {
  const DType dtype = dtype_of_case(c);
  const int64_t B = c.batch, T = c.seq_len, H = c.heads, K = c.key_dim, V = c.value_dim;
  std::mt19937_64 rng(1234);
  const GatedDeltaRuleArgs a = case_args(c, rng);

  GatedDeltaRuleResult out{Tensor::empty({B, T, H, V}, dtype, Device::cuda()),
                           Tensor::empty({B, H, K, V}, dtype, Device::cuda()),
                           Tensor::empty({B, T, H}, dtype, Device::cuda())};
  GatedDeltaRuleArgs training = a;
  training.keep = GatedDeltaRuleKeep::Inverses;
  auto forward = [&] { gated_delta_rule_chunked_kernels()(Device::cuda(), training, out); };
  Timing t;
  // fn's times with the state passes forced to 32 and to 64 columns (bf16 only).
  auto at_both_widths = [&](auto&& fn, Spread& at_32, Spread& at_64) {
    if (dtype != DType::BF16) return;
    const int previous = cuda::set_gated_delta_rule_state_columns(32);
    at_32 = time_ms(reps, fn);
    cuda::set_gated_delta_rule_state_columns(64);
    at_64 = time_ms(reps, fn);
    cuda::set_gated_delta_rule_state_columns(previous);
  };
  // fn's times with its state pass in each of kWindowCounts windows (bf16 only; `set` the
  // setting, `windowed` its count of calls that took it).
  auto in_windows = [&](auto&& fn, int (*set)(int), int64_t (*windowed)(), const char* pass,
                        std::vector<std::pair<int, Spread>>& times) {
    if (dtype != DType::BF16) return;
    for (int windows : kWindowCounts) {
      const int previous = set(windows);
      const int64_t before = windowed();
      times.emplace_back(windows, time_ms(reps, fn));
      set(previous);
      if (windows > 1 && windowed() == before) {
        throw std::runtime_error(c.name + ": the " + pass + " never ran its state pass in windows");
      }
    }
  };
  // The forward without the fit error (a GDN layer's), keeping as `training` does here.
  GatedDeltaRuleArgs no_fit_args = training;
  no_fit_args.want_fit_error = false;
  GatedDeltaRuleResult no_fit{out.o, out.h_final, Tensor()};
  auto forward_no_fit = [&] {
    gated_delta_rule_chunked_kernels()(Device::cuda(), no_fit_args, no_fit);
  };
  t.fwd = time_ms(reps, forward);
  t.fwd_no_fit = time_ms(reps, forward_no_fit);
  at_both_widths(forward, t.fwd_state_32, t.fwd_state_64);
  in_windows(forward, &cuda::set_gated_delta_rule_forward_windows,
             &cuda::gated_delta_rule_windowed_forwards, "forward", t.fwd_windows);
  if (dtype == DType::BF16) {  // those windows with the prepare kernel once, before the passes
    const bool by_windows = cuda::set_gated_delta_rule_forward_prepare_windows(false);
    for (int windows : kWindowCounts) {
      if (windows == 1) continue;
      const int previous = cuda::set_gated_delta_rule_forward_windows(windows);
      t.fwd_windows_prepare_once.emplace_back(windows, time_ms(reps, forward));
      cuda::set_gated_delta_rule_forward_windows(previous);
    }
    cuda::set_gated_delta_rule_forward_prepare_windows(by_windows);
  }

  Tensor grad_o = Tensor::from_vector(normal_values(B * T * H * V, rng), {B, T, H, V}).to(dtype).to(Device::cuda());
  Tensor grad_h = Tensor::zeros({B, H, K, V}, dtype, Device::cuda());
  GatedDeltaRuleGrads grads = grads_for(a);
  // The backward reads what the last forward call kept (it only reads it).
  auto backward = [&] {
    gated_delta_rule_backward_kernels()(Device::cuda(), a, grad_o, grad_h, out.saved.get(),
                                        grads);
  };
  t.bwd = time_ms(reps, backward);
  if (dtype == DType::BF16) {  // each warm-up call tunes its pass at this shape
    const bool was_on = cuda::set_autotune(true);
    t.fwd_tuned = time_ms(reps, forward);
    t.bwd_tuned = time_ms(reps, backward);
    t.fwd_no_fit_tuned = time_ms(reps, forward_no_fit);
    cuda::set_autotune(was_on);
    forward();  // what the backward below reads, kept by an untuned forward
  }
  at_both_widths(backward, t.bwd_state_32, t.bwd_state_64);
  if (dtype == DType::BF16) {
    const bool previous = cuda::set_gated_delta_rule_backward_overlap(false);
    t.bwd_in_order = time_ms(reps, backward);
    cuda::set_gated_delta_rule_backward_overlap(true);
    t.bwd_beside = time_ms(reps, backward);
    cuda::set_gated_delta_rule_backward_overlap(previous);
  }
  in_windows(backward, &cuda::set_gated_delta_rule_backward_windows,
             &cuda::gated_delta_rule_windowed_backwards, "backward", t.bwd_windows);
  in_windows(backward, &cuda::set_gated_delta_rule_recompute_windows,
             &cuda::gated_delta_rule_windowed_recomputes, "backward's recompute",
             t.recompute_windows);
  if (dtype == DType::BF16 && K == 256) {  // where two slots of chunk tiles do not fit
    const bool previous = cuda::set_gated_delta_rule_backward_keys_ahead(false);
    t.bwd_one_slot = time_ms(reps, backward);
    const int64_t before = cuda::gated_delta_rule_keys_ahead_passes();
    cuda::set_gated_delta_rule_backward_keys_ahead(true);
    t.bwd_keys_ahead = time_ms(reps, backward);
    cuda::set_gated_delta_rule_backward_keys_ahead(previous);
    if (cuda::gated_delta_rule_keys_ahead_passes() == before) {
      throw std::runtime_error(c.name + ": the backward never copied the keys ahead");
    }
    t.keys_ahead_timed = true;
  }
  if (dtype == DType::BF16) {  // where the passes the defaults pick take two partial sums
    const int previous = cuda::set_gated_delta_rule_state_partial_sums(2);
    const int64_t before = cuda::gated_delta_rule_partial_sum_passes();
    forward();
    backward();
    if (cuda::gated_delta_rule_partial_sum_passes() != before) {
      cuda::set_gated_delta_rule_state_partial_sums(1);
      t.fwd_one_sum = time_ms(reps, forward);
      t.bwd_one_sum = time_ms(reps, backward);
      cuda::set_gated_delta_rule_state_partial_sums(2);
      t.fwd_two_sums = time_ms(reps, forward);
      t.bwd_two_sums = time_ms(reps, backward);
      t.partial_sums_timed = true;
    }
    cuda::set_gated_delta_rule_state_partial_sums(previous);
  }
  if (dtype == DType::BF16) {
    const int previous = cuda::set_gated_delta_rule_prepare_warps(4);
    t.fwd_prepare_4 = time_ms(reps, forward);
    t.bwd_prepare_4 = time_ms(reps, backward);
    const int64_t before = cuda::gated_delta_rule_eight_warp_prepares();
    cuda::set_gated_delta_rule_prepare_warps(8);
    t.fwd_prepare_8 = time_ms(reps, forward);
    t.bwd_prepare_8 = time_ms(reps, backward);
    cuda::set_gated_delta_rule_prepare_warps(previous);
    if (cuda::gated_delta_rule_eight_warp_prepares() == before) {
      throw std::runtime_error(c.name + ": no prepare kernel ran in 8 warps");
    }
    // Plain launches, then dependent ones (cuda/dependent_launch.h), each kernel's blocks
    // placed before the one ahead of it ends; not timed where none goes out so.
    const bool dependent = cuda::set_dependent_launches(false);
    t.fwd_plain = time_ms(reps, forward);
    t.bwd_plain = time_ms(reps, backward);
    const int64_t dependent_before = cuda::dependent_launch_count();
    cuda::set_dependent_launches(true);
    t.fwd_dependent = time_ms(reps, forward);
    t.bwd_dependent = time_ms(reps, backward);
    cuda::set_dependent_launches(dependent);
    t.dependent_timed = cuda::dependent_launch_count() != dependent_before;
  }

  // bf16: the other pairs. f32 keeps nothing.
  t.kept = out.saved != nullptr;
  if (!t.kept) return t;
  auto pair_keeping = [&](GatedDeltaRuleKeep keep) {
    training.keep = keep;
    KeepPair pair;
    pair.fwd = time_ms(reps, forward);
    pair.bwd = time_ms(reps, backward);
    return pair;
  };
  t.bare = pair_keeping(GatedDeltaRuleKeep::Nothing);
  t.states = pair_keeping(GatedDeltaRuleKeep::ChunkStates);
  out.saved.reset();
  return t;
}

// --timeline: each bf16 case's forward (keeping A, with the fit error), that forward
// without the fit error, and the backward, timed by events and by the host's issue, then
// once more each with the kernels' block stamps recorded (cuda/block_timeline.h): a row per
// launch, its first block start and last end after the pass's first block start, so that
// the gaps between kernels and the kernels beside each other show. Then the forward and the
// backward with their state passes in 4 windows of chunks, whose per-chunk kernels run on
// the current stream beside the next window's pass on the second.
void timeline_tables(const std::string& filter, int reps, const std::string& csv_path,
                     bool smoke) {
  std::ofstream csv = bench::open_csv(csv_path, bench::kBlockTimelineCsvHeader);
  std::printf("block timelines (cuda/block_timeline.h): us at p10 / median / p90 over the "
              "blocks that visited a chunk\n(prologue: the block's start to its chunk loop; a "
              "tile: a chunk); fixed and a tile: least squares over all blocks; gaps and tail:\n"
              "the SMs' idle shares of the span\n");
  for (const BenchCase& c : bench_cases(smoke)) {
    const std::string label = c.name + "_" + c.dtype;
    if (c.dtype != "bf16" || !bench::matches_filter(filter, label)) {
      continue;
    }
    std::mt19937_64 rng(1234);
    GatedDeltaRuleArgs a = case_args(c, rng);
    a.keep = GatedDeltaRuleKeep::Inverses;
    const int64_t B = c.batch, T = c.seq_len, H = c.heads, K = c.key_dim, V = c.value_dim;
    GatedDeltaRuleResult out{Tensor::empty({B, T, H, V}, DType::BF16, Device::cuda()),
                             Tensor::empty({B, H, K, V}, DType::BF16, Device::cuda()),
                             Tensor::empty({B, T, H}, DType::BF16, Device::cuda())};
    auto forward = [&] { gated_delta_rule_chunked_kernels()(Device::cuda(), a, out); };
    GatedDeltaRuleArgs no_fit_args = a;
    no_fit_args.want_fit_error = false;
    GatedDeltaRuleResult no_fit{out.o, out.h_final, Tensor()};
    auto forward_no_fit = [&] {
      gated_delta_rule_chunked_kernels()(Device::cuda(), no_fit_args, no_fit);
    };
    const Tensor grad_o =
        Tensor::from_vector(normal_values(B * T * H * V, rng), {B, T, H, V}).to(DType::BF16).to(
            Device::cuda());
    const Tensor grad_h = Tensor::zeros({B, H, K, V}, DType::BF16, Device::cuda());
    GatedDeltaRuleGrads grads = grads_for(a);
    // The backward reads what the last forward call kept (it only reads it).
    auto backward = [&] {
      gated_delta_rule_backward_kernels()(Device::cuda(), a, grad_o, grad_h, out.saved.get(),
                                          grads);
    };
    const Spread forward_ms = time_ms(reps, forward);
    const Spread no_fit_ms = time_ms(reps, forward_no_fit);
    const Spread backward_ms = time_ms(reps, backward);
    std::printf("\n%s: forward %.1f us (host issue %.1f), without the fit error %.1f us (host "
                "issue %.1f), backward %.1f us (host issue %.1f), event medians\n%s\n",
                label.c_str(), forward_ms.median * 1e3, bench::host_issue_us(reps, forward),
                no_fit_ms.median * 1e3, bench::host_issue_us(reps, forward_no_fit),
                backward_ms.median * 1e3, bench::host_issue_us(reps, backward),
                cuda::timeline_summary_header().c_str());
    bench::timeline_rows("forward", label, forward, csv);
    bench::timeline_rows("forward without the fit error", label + " no fit", forward_no_fit, csv);
    bench::timeline_rows("backward", label, backward, csv);
    const int forward_windows = cuda::set_gated_delta_rule_forward_windows(4);
    const int backward_windows = cuda::set_gated_delta_rule_backward_windows(4);
    bench::timeline_rows("forward, its state pass in 4 windows", label + " 4 windows", forward,
                         csv);
    bench::timeline_rows("backward, its state pass in 4 windows", label + " 4 windows", backward,
                         csv);
    cuda::set_gated_delta_rule_forward_windows(forward_windows);
    cuda::set_gated_delta_rule_backward_windows(backward_windows);
    // And as dependent launches (set_dependent_launches): the gaps between the kernels.
    const bool dependent = cuda::set_dependent_launches(true);
    const int64_t dependent_before = cuda::dependent_launch_count();
    bench::timeline_rows("forward, its kernels as dependent launches", label + " dependent",
                         forward, csv);
    bench::timeline_rows("backward, its kernels as dependent launches", label + " dependent",
                         backward, csv);
    cuda::set_dependent_launches(dependent);
    if (cuda::dependent_launch_count() == dependent_before) {
      std::printf("(no launch went out as a dependent one: compute capability below 9.0, or no "
                  "sm_90 code)\n");
    }
    out.saved.reset();
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --timeline is this program's own; the rest are parse_cuda_bench_args'.
  std::vector<char*> shared_args;
  bool timeline = false;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string(argv[i]) == "--timeline") timeline = true;
    else shared_args.push_back(argv[i]);
  }
  const ham::bench::CudaBenchArgs args =
      ham::bench::parse_cuda_bench_args(int(shared_args.size()), shared_args.data(), 5,
                                        /*takes_smoke=*/true);
  const int reps = args.reps;
  const std::string& csv_path = args.csv_path;
  const std::string& filter = args.filter;
  try {
    if (!ham::bench::gpu_available("bench_gated_delta_rule_cuda")) return 1;
    if (args.smoke) ham::bench::shorten_autotune_for_smoke();
    if (timeline) {
      timeline_tables(filter, reps, csv_path, args.smoke);
      return 0;
    }
    std::ofstream csv = ham::bench::open_csv(
        csv_path, "name,dtype,batch,seq_len,heads,key_dim,value_dim,docs,fwd_ms_min,fwd_ms_median,"
                  "fwd_ms_max,bwd_ms_min,bwd_ms_median,bwd_ms_max,fwd_bare_ms_min,"
                  "fwd_bare_ms_median,fwd_bare_ms_max,bwd_recompute_ms_min,"
                  "bwd_recompute_ms_median,bwd_recompute_ms_max,fwd_keep_ms_min,"
                  "fwd_keep_ms_median,fwd_keep_ms_max,bwd_kept_ms_min,bwd_kept_ms_median,"
                  "bwd_kept_ms_max,fwd_no_fit_ms_min,fwd_no_fit_ms_median,fwd_no_fit_ms_max,"
                  "fwd_tuned_ms_min,fwd_tuned_ms_median,fwd_tuned_ms_max,bwd_tuned_ms_min,"
                  "bwd_tuned_ms_median,bwd_tuned_ms_max,fwd_no_fit_tuned_ms_min,"
                  "fwd_no_fit_tuned_ms_median,fwd_no_fit_tuned_ms_max");
    std::printf("%-22s %-5s %12s %12s %12s %12s %12s %12s %12s %12s\n", "case", "dtype",
                "fwd min ms", "fwd med ms", "bwd min ms", "bwd med ms", "fwd bare med",
                "bwd recomp", "fwd keep med", "bwd kept med");
    std::vector<std::pair<std::string, Timing>> bf16_timings;
    for (const BenchCase& c : bench_cases(args.smoke)) {
      const std::string label = c.name + "_" + c.dtype;
      if (!bench::matches_filter(filter, label)) continue;
      const Timing t = run_case(c, reps);
      if (c.dtype == "bf16") bf16_timings.emplace_back(c.name, t);
      std::printf("%-22s %-5s %12.3f %12.3f %12.3f %12.3f", c.name.c_str(), c.dtype.c_str(),
                  t.fwd.min, t.fwd.median, t.bwd.min, t.bwd.median);
      if (t.kept) {
        std::printf(" %12.3f %12.3f %12.3f %12.3f", t.bare.fwd.median, t.bare.bwd.median,
                    t.states.fwd.median, t.states.bwd.median);
      }
      std::printf("\n");
      std::fflush(stdout);
      if (csv.is_open()) {
        csv << c.name << ',' << c.dtype << ',' << c.batch << ',' << c.seq_len << ',' << c.heads
            << ',' << c.key_dim << ',' << c.value_dim << ',' << c.docs << ',' << t.fwd.min << ','
            << t.fwd.median << ',' << t.fwd.max << ',' << t.bwd.min << ',' << t.bwd.median << ','
            << t.bwd.max;
        if (t.kept) {
          for (const Spread& s : {t.bare.fwd, t.bare.bwd, t.states.fwd, t.states.bwd}) {
            csv << ',' << s.min << ',' << s.median << ',' << s.max;
          }
        } else {
          csv << ",,,,,,,,,,,,";
        }
        csv << ',' << t.fwd_no_fit.min << ',' << t.fwd_no_fit.median << ',' << t.fwd_no_fit.max;
        if (c.dtype == "bf16") {
          for (const Spread& s : {t.fwd_tuned, t.bwd_tuned, t.fwd_no_fit_tuned}) {
            csv << ',' << s.min << ',' << s.median << ',' << s.max;
          }
        } else {
          csv << ",,,,,,,,,";  // the three tuned spreads
        }
        csv << '\n';
      }
    }
    std::printf("\nbf16 with kernel.autotune on (cuda/autotune.h: each pass's bit-equal "
                "variants timed at the shape, the fastest kept; defaults / tuned above 1: tuned "
                "is faster; nfit: the forward without the fit error)\n%-22s %-4s %12s %12s "
                "%18s\n", "case", "pass", "default med",
                "tuned med", "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      print_against(name, "fwd", t.fwd, t.fwd_tuned);
      print_against(name, "bwd", t.bwd, t.bwd_tuned);
      print_against(name, "nfit", t.fwd_no_fit, t.fwd_no_fit_tuned);
    }
    bench::print_autotune_choices();
    std::printf("\nbf16 forward without the fit error (want_fit_error false: a GDN layer's "
                "forward; with / without above 1: without is faster)\n%-22s %12s %12s %18s\n",
                "case", "with med ms", "without med", "min/med/max");
    for (const auto& [name, t] : bf16_timings) print_against(name, nullptr, t.fwd, t.fwd_no_fit);
    std::printf("\nbf16, state passes forced to 64 / 32 columns (ms; 64/32 above 1: 32 is "
                "faster; K = 256 keeps 32 in the backward)\n%-22s %-4s %12s %12s %18s\n", "case",
                "pass", "64 med ms", "32 med ms", "64/32 min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      print_against(name, "fwd", t.fwd_state_64, t.fwd_state_32);
      print_against(name, "bwd", t.bwd_state_64, t.bwd_state_32);
    }
    std::printf("\nbf16 backward, P^T dO beside the recomputed state pass against after it "
                "(set_gated_delta_rule_backward_overlap; in order / beside above 1: beside is "
                "faster)\n%-22s %12s %12s %18s\n", "case", "order med ms", "beside med ms",
                "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      print_against(name, nullptr, t.bwd_in_order, t.bwd_beside);
    }
    std::printf("\nbf16 backward at K = 256, its state pass with one slot against K and dvl a "
                "chunk ahead (set_gated_delta_rule_backward_keys_ahead; one / ahead above 1: "
                "ahead is faster)\n%-22s %12s %12s %18s\n", "case", "one med ms",
                "ahead med ms", "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      if (t.keys_ahead_timed) print_against(name, nullptr, t.bwd_one_slot, t.bwd_keys_ahead);
    }
    std::printf("\nbf16 state passes, v_new and du in one partial sum over K against two "
                "(set_gated_delta_rule_state_partial_sums; where the default passes take them: "
                "32 columns, K >= 128; one / two above 1: two are faster)\n%-22s %-4s %12s "
                "%12s %18s\n", "case", "pass", "one med ms", "two med ms", "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      if (!t.partial_sums_timed) continue;
      print_against(name, "fwd", t.fwd_one_sum, t.fwd_two_sums);
      print_against(name, "bwd", t.bwd_one_sum, t.bwd_two_sums);
    }
    std::printf("\nbf16 prepare kernel (gates' cumsum, A, W, U) in 4 warps against 8 "
                "(set_gated_delta_rule_prepare_warps; 4/8 above 1: 8 are faster)\n%-22s %-4s "
                "%12s %12s %18s\n", "case", "pass", "4 med ms", "8 med ms", "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      print_against(name, "fwd", t.fwd_prepare_4, t.fwd_prepare_8);
      print_against(name, "bwd", t.bwd_prepare_4, t.bwd_prepare_8);
    }
    std::printf("\nbf16 kernels as plain launches against dependent ones, each kernel's "
                "blocks placed before the one ahead of it ends (set_dependent_launches; "
                "plain/dependent above 1: dependent faster)\n%-22s %-4s %12s %12s %18s\n",
                "case", "pass", "plain med ms", "dep med ms", "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      if (!t.dependent_timed) {
        std::printf("%-22s (no launch went out as a dependent one: compute capability below "
                    "9.0, or no sm_90 code)\n", name.c_str());
        continue;
      }
      print_against(name, "fwd", t.fwd_plain, t.fwd_dependent);
      print_against(name, "bwd", t.bwd_plain, t.bwd_dependent);
    }
    std::printf("\nbf16 state passes in windows of chunks, the per-chunk kernels of each "
                "window beside the pass over the next (set_gated_delta_rule_forward_windows, "
                "..._backward_windows; rec: the backward with its recompute of the forward's "
                "pass in windows, ..._recompute_windows; one launch / windows above 1: the "
                "windows are faster)"
                "\n%-22s %-4s %8s %12s %18s\n", "case", "pass", "windows", "med ms",
                "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      for (const auto& [pass, timed] :
           {std::pair{"fwd", &t.fwd_windows}, std::pair{"bwd", &t.bwd_windows},
            std::pair{"rec", &t.recompute_windows}}) {
        if (timed->empty()) continue;
        const Spread& one = timed->front().second;
        for (const auto& [windows, s] : *timed) {
          std::printf("%-22s %-4s %8d %12.3f %6.2f/%5.2f/%5.2f\n", name.c_str(), pass, windows,
                      s.median, one.min / s.min, one.median / s.median, one.max / s.max);
        }
      }
    }
    std::printf("\nbf16 forward in windows, its prepare kernel once before the passes against "
                "by the same windows (set_gated_delta_rule_forward_prepare_windows; once / by "
                "windows above 1: by windows is faster)\n%-22s %8s %12s %12s %18s\n", "case",
                "windows", "once med ms", "by win med", "min/med/max");
    for (const auto& [name, t] : bf16_timings) {
      for (const auto& [windows, once] : t.fwd_windows_prepare_once) {
        for (const auto& [timed_windows, by_windows] : t.fwd_windows) {
          if (timed_windows != windows) continue;
          std::printf("%-22s %8d %12.3f %12.3f %6.2f/%5.2f/%5.2f\n", name.c_str(), windows,
                      once.median, by_windows.median, once.min / by_windows.min,
                      once.median / by_windows.median, once.max / by_windows.max);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gated_delta_rule_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}

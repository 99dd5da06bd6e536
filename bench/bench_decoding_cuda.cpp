// Time of ham's CUDA decoding kernels, one generated token: gated_delta_rule_decode (the
// state advanced in place) and routed_attention_decode (one query over a KV cache), as GB/s
// of the bytes each must move against the device-to-device copy measured in the same run.
// bench/bench_decoding_torch.py reads the CSV and times flash-linear-attention's
// fused_recurrent_gated_delta_rule and PyTorch's SDPA on the same shapes.
//
// A last table times the attention kernel at 16, 32 and 64 keys a tile against the host's
// automatic choice (set_attention_decode_keys).
//
// Run (on a GPU machine; scripts/gpu_check.sh does this):
//   ./build/bench/bench_decoding_cuda --csv decoding_ham.csv [--reps 20] [--filter gdr]
//   python3 bench/bench_decoding_torch.py decoding_ham.csv --out decoding_ratio.csv
// --smoke runs small cases that take both tables' paths instead (a 4 MiB copy for the
// reference), on the SIMT emulator in CI (bench_decoding_cuda_on_emulated_gpu,
// bench/smoke_on_emulated_gpu.sh); the times there mean nothing.
//
// A decoding step is small (microseconds), so each rep times kCallsPerRep calls issued back
// to back between two CUDA events and reports the time per call: launch costs count, as
// they do when a model decodes. Inputs are bf16 (random, never zeros): for the gated delta
// rule q, k L2-normalised, g = -softplus(normal), beta = sigmoid(normal), an f32 state of
// N(0, 0.1); for attention a cache holding `context` visible tokens (the selected ones, for
// HAM), q, k, v uniform in [-1, 1].
//   bytes: gdr = the f32 state read and written, 8 B K V H B (the token's inputs are
//          negligible); attention = the cached keys and values read, 2 B (Dk + Dv) Hkv B L.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench.h"
#include "core/ops/gated_delta_rule_decode.h"
#include "core/ops/routed_attention_decode.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/routed_attention.h"
#include "cuda/stream.h"

namespace {

using namespace ham;

constexpr int kCallsPerRep = 20;

struct DecodeCase {
  std::string op;  // gdr, attn
  int64_t batch, heads, kv_heads, key_dim, value_dim, context;
  std::string label() const {
    char text[96];
    if (op == "attn") {
      std::snprintf(text, sizeof text, "attn_B%lld_H%lldx%lld_L%lld_K%lld_V%lld", (long long)batch,
                    (long long)heads, (long long)kv_heads, (long long)context, (long long)key_dim,
                    (long long)value_dim);
    } else {
      std::snprintf(text, sizeof text, "gdr_B%lld_H%lld_K%lld_V%lld", (long long)batch,
                    (long long)heads, (long long)key_dim, (long long)value_dim);
    }
    return text;
  }
};

std::vector<DecodeCase> decode_cases(bool smoke) {
  std::vector<DecodeCase> cases;
  if (smoke) {  // each op, the paper's head dims, grouped-query heads; the tiles' table
    cases.push_back({"gdr", 2, 2, 2, 64, 96, 0});
    cases.push_back({"attn", 1, 2, 2, 64, 64, 100});
    cases.push_back({"attn", 2, 2, 2, 128, 192, 70});
    cases.push_back({"attn", 1, 4, 2, 128, 128, 130});
    return cases;
  }
  for (int64_t B : {1, 8, 32}) cases.push_back({"gdr", B, 5, 5, 256, 384, 0});  // the paper's GDN heads
  for (int64_t B : {1, 16}) cases.push_back({"gdr", B, 16, 16, 128, 128, 0});
  for (int64_t L : {4096, 16384, 65536}) {
    cases.push_back({"attn", 1, 10, 10, 128, 192, L});  // the paper's HAM KV heads
    cases.push_back({"attn", 1, 16, 16, 128, 128, L});
  }
  cases.push_back({"attn", 8, 16, 16, 128, 128, 16384});
  cases.push_back({"attn", 1, 32, 8, 128, 128, 16384});  // grouped-query heads
  return cases;
}

using bench::Spread;  // milliseconds per call

template <class Fn>
Spread time_per_call(int reps, Fn&& call) {
  std::vector<double> ms = bench::sorted_event_times_ms(reps, 1, [&](int) {
    for (int i = 0; i < kCallsPerRep; ++i) call();
  });
  for (double& x : ms) x /= kCallsPerRep;
  return bench::spread_of(ms);
}

using bench::normal_values;
using bench::unit_rows_on_gpu;

// Returns the time per call and the bytes a call must move.
std::pair<Spread, double> run_case(const DecodeCase& c, int reps) {
  const int64_t B = c.batch, H = c.heads, K = c.key_dim, V = c.value_dim;
  std::mt19937_64 rng(4321);
  if (c.op == "gdr") {
    const Tensor q = unit_rows_on_gpu({B, 1, H, K}, 1.0 / std::sqrt(double(K)), DType::BF16, rng);
    const Tensor k = unit_rows_on_gpu({B, 1, H, K}, 1.0, DType::BF16, rng);
    const Tensor v = Tensor::from_vector(normal_values(B * H * V, rng, 1.0), {B, 1, H, V})
                         .to(DType::BF16).to(Device::cuda());
    std::vector<double> g = normal_values(B * H, rng, 1.0), beta = normal_values(B * H, rng, 1.0);
    for (double& x : g) x = -std::log1p(std::exp(x));
    for (double& x : beta) x = 1.0 / (1.0 + std::exp(-x));
    const Tensor gt = Tensor::from_vector(g, {B, 1, H}).to(DType::BF16).to(Device::cuda());
    const Tensor bt = Tensor::from_vector(beta, {B, 1, H}).to(DType::BF16).to(Device::cuda());
    Tensor state = Tensor::from_vector(normal_values(B * H * K * V, rng, 0.1), {B, H, K, V})
                       .to(DType::F32).to(Device::cuda());
    Tensor o = Tensor::empty({B, 1, H, V}, DType::BF16, Device::cuda());
    Tensor fit = Tensor::empty({B, 1, H}, DType::BF16, Device::cuda());
    const Spread t = time_per_call(reps, [&] {
      gated_delta_rule_decode_kernels()(Device::cuda(), q, k, v, gt, bt, state, o, fit);
    });
    return {t, 8.0 * double(B * H * K * V)};
  }
  const int64_t Hkv = c.kv_heads, L = c.context;
  const Tensor q = bench::uniform_on_gpu({B, 1, H, K}, DType::BF16, 11, -1.f, 1.f);
  const Tensor k = bench::uniform_on_gpu({B, L, Hkv, K}, DType::BF16, 12, -1.f, 1.f);
  const Tensor v = bench::uniform_on_gpu({B, L, Hkv, V}, DType::BF16, 13, -1.f, 1.f);
  const Tensor visible = Tensor::from_vector(std::vector<int64_t>(size_t(B), L), {B, 1});
  Tensor out = Tensor::empty({B, 1, H, V}, DType::BF16, Device::cuda());
  Tensor lse = Tensor::empty({B, 1, H}, DType::F32, Device::cuda());
  const double scale = 1.0 / std::sqrt(double(K));
  const Spread t = time_per_call(reps, [&] {
    routed_attention_decode_kernels()(Device::cuda(), q, k, v, Tensor(), visible, scale, out, lse);
  });
  return {t, 2.0 * double(B * L * Hkv * (K + V))};
}

}  // namespace

int main(int argc, char** argv) {
  const bench::CudaBenchArgs args =
      bench::parse_cuda_bench_args(argc, argv, 20, /*takes_smoke=*/true);
  try {
    if (!bench::gpu_available("bench_decoding_cuda")) return 1;
    // The reference: 1 GiB device to device (4 MiB with --smoke), twice that moved, median
    // of the reps.
    double copy_gbps = 0;
    {
      const int64_t floats = int64_t(1) << (args.smoke ? 20 : 28);
      Tensor src = bench::uniform_on_gpu({floats}, DType::F32, 1, -1.f, 1.f);
      Tensor dst = Tensor::empty(src.shape(), DType::F32, Device::cuda());
      const cudaStream_t stream = cuda::current_stream(0);
      std::vector<double> ms = bench::sorted_event_times_ms(args.reps, 1, [&](int) {
        HAM_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(),
                                       cudaMemcpyDeviceToDevice, stream));
      });
      copy_gbps = 2.0 * double(src.nbytes()) / (ms[ms.size() / 2] * 1e-3) / 1e9;
    }
    std::printf("copy bandwidth (median) %.1f GB/s; %d calls per timed rep\n", copy_gbps,
                kCallsPerRep);
    std::ofstream csv = bench::open_csv(
        args.csv_path, "name,op,batch,heads,kv_heads,key_dim,value_dim,context,bytes,ms_min,"
                       "ms_median,ms_max,gbps_median,copy_gbps,copy_fraction_median");
    std::printf("%-34s %10s %10s %10s %9s %8s\n", "case", "us min", "us median", "us max",
                "GB/s", "of copy");
    for (const DecodeCase& c : decode_cases(args.smoke)) {
      const std::string label = c.label();
      if (!bench::matches_filter(args.filter, label)) continue;
      const auto [t, bytes] = run_case(c, args.reps);
      const double gbps = bytes / (t.median * 1e-3) / 1e9;
      std::printf("%-34s %10.2f %10.2f %10.2f %9.1f %7.1f%%\n", label.c_str(), t.min * 1e3,
                  t.median * 1e3, t.max * 1e3, gbps, 100 * gbps / copy_gbps);
      std::fflush(stdout);
      if (csv.is_open()) {
        csv << label << ',' << c.op << ',' << c.batch << ',' << c.heads << ',' << c.kv_heads << ','
            << c.key_dim << ',' << c.value_dim << ',' << c.context << ',' << bytes << ',' << t.min
            << ',' << t.median << ',' << t.max << ',' << gbps << ',' << copy_gbps << ','
            << gbps / copy_gbps << '\n';
      }
    }
    // The attention kernel's tile against the host's automatic choice: time with the tile
    // set / automatic time, at min / median / max (below 1: the set tile is faster).
    std::printf("\nattention decode, keys a tile set against the automatic choice (set / auto)\n");
    std::printf("%-34s %5s %10s %10s %22s\n", "case", "keys", "us auto", "us set",
                "set/auto min/med/max");
    for (const DecodeCase& c : decode_cases(args.smoke)) {
      const std::string label = c.label();
      if (c.op != "attn") continue;
      if (!bench::matches_filter(args.filter, label)) continue;
      const Spread automatic = run_case(c, args.reps).first;
      for (int keys : {16, 32, 64}) {
        const int previous = cuda::set_attention_decode_keys(keys);
        Spread set{};
        try {
          set = run_case(c, args.reps).first;
        } catch (const std::exception& e) {  // a tile too large for these heads
          cuda::set_attention_decode_keys(previous);
          std::printf("%-34s %5d %s\n", label.c_str(), keys, e.what());
          continue;
        }
        cuda::set_attention_decode_keys(previous);
        std::printf("%-34s %5d %10.2f %10.2f %8.2f / %.2f / %.2f\n", label.c_str(), keys,
                    automatic.median * 1e3, set.median * 1e3, set.min / automatic.min,
                    set.median / automatic.median, set.max / automatic.max);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decoding_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}

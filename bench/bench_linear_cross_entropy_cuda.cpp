// Fused linear cross-entropy (nn/linear_cross_entropy.h: chunked cuBLASLt GEMMs and the
// cuda/cross_entropy.cu kernels) against the unfused LM head (the whole [N, V] logits from
// one GEMM, then cross_entropy) on the GPU, for comparison with PyTorch's
// F.cross_entropy(h @ W.T, t) on the same shapes
// (bench/bench_linear_cross_entropy_torch.py reads this program's CSV).
//
// Run (on a GPU machine; scripts/gpu_check.sh does this):
//   ./build/bench/bench_linear_cross_entropy_cuda --csv lce_ham.csv [--reps 10] [--filter bf16]
//   python3 bench/bench_linear_cross_entropy_torch.py lce_ham.csv
//
// Cases: hidden [N, D], weight [V, D], targets [N] (i64, none ignored), LM-head shapes of
// 16k-token steps; dtypes bf16, tf32 (f32 storage, TF32 tensor cores allowed) and f32 (full
// fp32 GEMMs). Each case runs the fused op with the default chunk (chunk_rows 0: at most
// 2^28 logits per chunk on CUDA) and with chunk_rows 4096. Timed, each on its own with CUDA events
// after 2 warm-ups (min / median / max ms over --reps):
//   fused_fb    nn::linear_cross_entropy with grad mode on, then autograd's gradients of
//               hidden and weight (3 GEMMs per chunk)
//   fused_fwd   the same loss under no-grad (1 GEMM per chunk)
//   unfused_fb  nn::matmul(h, W^T) -> nn::cross_entropy, then the same gradients (the
//               whole logits and dlogits exist at once; timed once per dtype and shape,
//               repeated on both chunk rows)
// "peak MiB" is the caching allocator's peak during one step minus what was allocated
// before it (the inputs): the gradients (fused: the forward's, and the scaled copies the
// backward returns), plus the logits chunk (fused) or the whole logits and dlogits
// (unfused). The fused and unfused losses are printed side by side as
// a check that both compute the same thing.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "bench/cuda_bench.h"
#include "core/ops/linear_cross_entropy.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/cublas.h"
#include "cuda/stream.h"
#include "nn/cross_entropy.h"
#include "nn/linear_cross_entropy.h"
#include "nn/matmul.h"

namespace {

using namespace ham;

struct BenchCase {
  std::string dtype;  // bf16, tf32, f32
  int64_t rows, dim, vocab, chunk_rows;
  std::string name() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "N%lld_D%lld_V%lld_chunk", (long long)rows, (long long)dim,
                  (long long)vocab);
    return std::string(buf) + (chunk_rows ? std::to_string(chunk_rows) : std::string("auto"));
  }
};

std::vector<BenchCase> bench_cases() {
  struct Shape3 {
    int64_t rows, dim, vocab;
  };
  const Shape3 shapes[] = {{16384, 2048, 32768}, {16384, 2048, 50304}, {8192, 4096, 128256}};
  std::vector<BenchCase> cases;
  for (std::string dtype : {"bf16", "tf32", "f32"}) {
    for (const Shape3& s : shapes) {
      for (int64_t chunk : {0, 4096}) cases.push_back({dtype, s.rows, s.dim, s.vocab, chunk});
    }
  }
  return cases;
}

Tensor random_targets(int64_t rows, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> t(static_cast<size_t>(rows));
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t& v : t) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    v = int64_t(state % uint64_t(vocab));
  }
  return Tensor::from_vector(t, {rows}).to(Device::cuda());
}

struct Stats {
  double min_ms = 0, median_ms = 0, max_ms = 0, peak_mib = 0;
};

Stats time_step(int reps, const std::function<void()>& step) {
  std::vector<double> ms = bench::sorted_event_times_ms(reps, 2, [&](int) { step(); });
  Stats s{ms.front(), ms[ms.size() / 2], ms.back(), 0};
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  const size_t before = cuda::memory_stats(0).allocated_bytes;
  cuda::device_allocator(0).reset_peaks();
  step();
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  s.peak_mib = double(cuda::memory_stats(0).peak_allocated_bytes - before) / double(1 << 20);
  return s;
}

struct CaseResult {
  Stats fused_fb, fused_fwd, unfused_fb;
  double fused_loss = 0, unfused_loss = 0;
  int64_t chunk_rows = 0;
};

// The unfused step does not depend on chunk_rows: timed once per (dtype, shape).
using UnfusedCache = std::map<std::string, std::pair<Stats, double>>;

CaseResult run_case(const BenchCase& c, int reps, UnfusedCache& unfused_cache) {
  const DType dtype = c.dtype == "bf16" ? DType::BF16 : DType::F32;
  cuda::set_matmul_allow_tf32(c.dtype == "tf32");
  Tensor hidden = bench::uniform_on_gpu({c.rows, c.dim}, dtype, 1, -1.0f, 1.0f);
  const float weight_scale = 1.0f / std::sqrt(float(c.dim));
  Tensor weight = bench::uniform_on_gpu({c.vocab, c.dim}, dtype, 2, -weight_scale, weight_scale);
  Tensor targets = random_targets(c.rows, c.vocab, 3);
  set_requires_grad(hidden);
  set_requires_grad(weight);

  CaseResult r;
  r.chunk_rows = ops::linear_cross_entropy_chunk_rows(c.rows, c.vocab, c.dim, c.chunk_rows,
                                                     Device::cuda());
  r.fused_fb = time_step(reps, [&] {
    Tensor loss = linear_cross_entropy(hidden, weight, targets, -100, c.chunk_rows);
    gradients({loss}, {hidden, weight});
  });
  const std::string shape_key = c.dtype + " " + std::to_string(c.rows) + " " +
                                std::to_string(c.dim) + " " + std::to_string(c.vocab);
  auto cached = unfused_cache.find(shape_key);
  if (cached == unfused_cache.end()) {
    Stats unfused = time_step(reps, [&] {
      Tensor loss = cross_entropy(matmul(hidden, weight, false, true), targets);
      gradients({loss}, {hidden, weight});
    });
    NoGradGuard no_grad;
    double loss = cross_entropy(matmul(hidden, weight, false, true), targets).item();
    cached = unfused_cache.emplace(shape_key, std::make_pair(unfused, loss)).first;
  }
  r.unfused_fb = cached->second.first;
  r.unfused_loss = cached->second.second;
  NoGradGuard no_grad;
  r.fused_fwd = time_step(reps, [&] {
    linear_cross_entropy(hidden, weight, targets, -100, c.chunk_rows);
  });
  r.fused_loss = linear_cross_entropy(hidden, weight, targets, -100, c.chunk_rows).item();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::CudaBenchArgs args = bench::parse_cuda_bench_args(argc, argv, 10);
  try {
    if (!bench::gpu_available("bench_linear_cross_entropy_cuda")) return 1;
    std::ofstream csv = bench::open_csv(
        args.csv_path, "name,dtype,rows,dim,vocab,chunk_rows,reps,"
                       "fused_fb_min_ms,fused_fb_median_ms,fused_fb_max_ms,fused_fb_peak_mib,"
                       "fused_fwd_min_ms,fused_fwd_median_ms,fused_fwd_max_ms,fused_fwd_peak_mib,"
                       "unfused_fb_min_ms,unfused_fb_median_ms,unfused_fb_max_ms,unfused_fb_peak_mib,"
                       "fused_loss,unfused_loss");
    std::printf("%-34s %-5s %6s  %-26s %-26s %-26s %9s %9s  %s\n", "case", "dtype", "chunk",
                "fused fwd+bwd ms min/med/max", "fused fwd ms min/med/max",
                "unfused fwd+bwd min/med/max", "fused MiB", "unfus MiB", "loss fused / unfused");
    UnfusedCache unfused_cache;
    for (const BenchCase& c : bench_cases()) {
      const std::string label = c.name() + " " + c.dtype;
      if (!bench::matches_filter(args.filter, label)) continue;
      const CaseResult r = run_case(c, args.reps, unfused_cache);
      auto triple = [](const Stats& s) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%8.2f %8.2f %8.2f", s.min_ms, s.median_ms, s.max_ms);
        return std::string(buf);
      };
      std::printf("%-34s %-5s %6lld  %-26s %-26s %-26s %9.0f %9.0f  %.5f / %.5f\n",
                  c.name().c_str(), c.dtype.c_str(), (long long)r.chunk_rows,
                  triple(r.fused_fb).c_str(), triple(r.fused_fwd).c_str(),
                  triple(r.unfused_fb).c_str(), r.fused_fb.peak_mib, r.unfused_fb.peak_mib,
                  r.fused_loss, r.unfused_loss);
      std::fflush(stdout);
      if (csv.is_open()) {
        csv << c.name() << ',' << c.dtype << ',' << c.rows << ',' << c.dim << ',' << c.vocab << ','
            << r.chunk_rows << ',' << args.reps;
        for (const Stats* s : {&r.fused_fb, &r.fused_fwd, &r.unfused_fb}) {
          csv << ',' << s->min_ms << ',' << s->median_ms << ',' << s->max_ms << ',' << s->peak_mib;
        }
        csv << ',' << r.fused_loss << ',' << r.unfused_loss << '\n';
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_linear_cross_entropy_cuda: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

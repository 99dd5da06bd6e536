// GEMM throughput of ham's CUDA matmul (cuBLASLt), for comparison with torch.matmul on the
// same shapes (bench/bench_matmul_torch.py reads this program's CSV and prints ratios).
//
// Run (on a GPU machine; scripts/gpu_check.sh does all of this):
//   ./build/bench/bench_matmul_cuda --csv matmul_ham.csv [--reps 30] [--filter bf16]
//   python3 bench/bench_matmul_torch.py matmul_ham.csv
//
// Each case is one ops::gemm into a preallocated output, C = op(A) op(B). Every product is
// timed on its own with CUDA events around it (after 5 warm-up products); the table gives
// the min, median and max of TFLOP/s = 2*M*N*K*batch / time. Inputs are normal random
// values (never zeros, which run faster), and when one input set is under 256 MiB, four
// sets are rotated so repeated products do not just re-read the L2 cache. "tf32" rows
// allow TF32 tensor cores for f32 (cuda/cublas.h); "f32" rows are full fp32.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/ops/matmul.h"
#include "core/tensor.h"
#include "bench/cuda_bench.h"
#include "cuda/check.h"
#include "cuda/cublas.h"
#include "cuda/stream.h"

namespace {

using namespace ham;

struct BenchCase {
  std::string name;
  std::string dtype;  // bf16, f32, tf32
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
};

// Shapes of an 800M-parameter model's training step (d_model 2048, 16k tokens) and
// plain squares.
std::vector<BenchCase> bench_cases() {
  std::vector<BenchCase> cases;
  for (std::string dtype : {"bf16", "tf32", "f32"}) {
    cases.push_back({"square4096", dtype, 1, 4096, 4096, 4096, false, false});
    if (dtype == "bf16") cases.push_back({"square8192", dtype, 1, 8192, 8192, 8192, false, false});
    cases.push_back({"linear_fwd", dtype, 1, 16384, 8192, 2048, false, true});   // x W^T
    cases.push_back({"linear_dgrad", dtype, 1, 16384, 2048, 8192, false, false});  // dy W
    cases.push_back({"linear_wgrad", dtype, 1, 8192, 2048, 16384, true, false});  // dy^T x
    cases.push_back({"batched_heads", dtype, 256, 1024, 1024, 128, false, true});  // q k^T
  }
  return cases;
}

struct Timing {
  double min_tflops, median_tflops, max_tflops;
};

Timing run_case(const BenchCase& c, int reps) {
  DType dtype = c.dtype == "bf16" ? DType::BF16 : DType::F32;
  cuda::set_matmul_allow_tf32(c.dtype == "tf32");
  Shape a_shape = c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k};
  Shape b_shape = c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n};
  Shape c_shape{c.m, c.n};
  if (c.batch > 1) {
    a_shape.insert(a_shape.begin(), c.batch);
    b_shape.insert(b_shape.begin(), c.batch);
    c_shape.insert(c_shape.begin(), c.batch);
  }
  size_t set_bytes = size_t(shape_numel(a_shape) + shape_numel(b_shape) + shape_numel(c_shape)) *
                     dtype_size(dtype);
  int sets = set_bytes < (size_t(256) << 20) ? 4 : 1;
  std::vector<Tensor> as, bs, cs;
  for (int i = 0; i < sets; ++i) {
    as.push_back(bench::uniform_on_gpu(a_shape, dtype, 3 * i + 1, -1.f, 1.f));
    bs.push_back(bench::uniform_on_gpu(b_shape, dtype, 3 * i + 2, -1.f, 1.f));
    cs.push_back(Tensor::empty(c_shape, dtype, Device::cuda()));
  }
  std::vector<double> ms = bench::sorted_event_times_ms(reps, 5, [&](int i) {
    ops::gemm(as[i % sets], bs[i % sets], cs[i % sets], c.trans_a, c.trans_b);
  });
  double flops = 2.0 * double(c.batch) * double(c.m) * double(c.n) * double(c.k);
  // The fastest call has the highest throughput: min time -> max TFLOP/s.
  std::vector<double> tflops;
  for (auto it = ms.rbegin(); it != ms.rend(); ++it) tflops.push_back(flops / (*it * 1e-3) / 1e12);
  return {tflops.front(), tflops[tflops.size() / 2], tflops.back()};
}

}  // namespace

int main(int argc, char** argv) {
  const bench::CudaBenchArgs args = bench::parse_cuda_bench_args(argc, argv, 30);
  const int reps = args.reps;
  const std::string& csv_path = args.csv_path;
  const std::string& filter = args.filter;
  try {
    if (!bench::gpu_available("bench_matmul_cuda")) return 1;
    std::ofstream csv = bench::open_csv(
        csv_path, "name,dtype,batch,m,n,k,trans_a,trans_b,reps,tflops_min,tflops_median,tflops_max");
    std::printf("%-14s %-5s %5s %6s %6s %6s %2s  %9s %9s %9s\n", "case", "dtype", "batch", "M",
                "N", "K", "op", "min", "median", "max");
    for (const BenchCase& c : bench_cases()) {
      std::string label = c.name + " " + c.dtype;
      if (!bench::matches_filter(filter, label)) continue;
      Timing t = run_case(c, reps);
      std::string op = std::string(c.trans_a ? "T" : "N") + (c.trans_b ? "T" : "N");
      std::printf("%-14s %-5s %5lld %6lld %6lld %6lld %2s  %9.1f %9.1f %9.1f TFLOP/s\n",
                  c.name.c_str(), c.dtype.c_str(), (long long)c.batch, (long long)c.m,
                  (long long)c.n, (long long)c.k, op.c_str(), t.min_tflops, t.median_tflops,
                  t.max_tflops);
      std::fflush(stdout);
      if (csv.is_open()) {
        csv << c.name << ',' << c.dtype << ',' << c.batch << ',' << c.m << ',' << c.n << ','
            << c.k << ',' << int(c.trans_a) << ',' << int(c.trans_b) << ',' << reps << ','
            << t.min_tflops << ',' << t.median_tflops << ',' << t.max_tflops << '\n';
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_matmul_cuda: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

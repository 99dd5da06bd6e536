// Memory-bound CUDA kernels against the device's copy bandwidth: elementwise add, scale,
// axpy, SwiGLU's gating, RMSNorm forward and backward, the causal depthwise conv1d forward
// and backward, and the multi-tensor AdamW step over a GPT-2-small (124.5M-parameter) list
// of tensors, in f32 and bf16. The target is >= 70% of the copy bandwidth measured in the
// same process.
//
// Run (on a GPU machine; scripts/gpu_check.sh does this):
//   ./build/bench/bench_memory_bound_cuda --csv memory_bound.csv [--reps 20] [--filter bf16]
//
// The reference is cudaMemcpyAsync device-to-device of 1 GiB, counted as 2 GiB moved (read
// + written). Every other case calls the op as the framework does (ops::..., outputs
// allocated by the caching allocator), and is counted by the bytes its kernel(s) must move
// at least, with N elements of s bytes (the formulas are next to each case below). Each call
// is timed on its own with CUDA events after 3 warm-ups; the table gives the min, median
// and max of GB/s = bytes / time / 1e9 over the repeats, and the same three divided by the
// copy's median GB/s. Inputs are random (never zeros); every tensor is far larger than the
// L2 cache (50 MiB), except AdamW's small vectors, which are part of the realistic list.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda_bench.h"
#include "core/ops/cast.h"
#include "core/ops/conv1d.h"
#include "core/ops/elementwise.h"
#include "core/ops/norm.h"
#include "core/ops/optim.h"
#include "core/ops/swiglu.h"
#include "core/ops/unary.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/conv1d.h"
#include "cuda/stream.h"

namespace {

using namespace ham;

constexpr double kTarget = 0.70;        // fraction of the copy bandwidth the issue asks for
constexpr int64_t kElements = 1 << 27;  // elementwise and norm cases: 512 MiB of f32 per tensor

struct Measured {
  std::string name, dtype;
  double bytes;
  std::vector<double> ms;  // sorted ascending
};

Measured measure(const std::string& name, const std::string& dtype, double bytes, int reps,
                 const std::function<void(int)>& step) {
  return {name, dtype, bytes, bench::sorted_event_times_ms(reps, 3, step)};
}

// GPT-2 small's parameter shapes (vocabulary padded to 50304, d 768, 1024 positions, 12
// layers): 124.5M parameters in 148 tensors, from the 38.6M-element embedding down to
// 768-element norm weights and biases.
std::vector<Shape> gpt2_small_shapes() {
  const int64_t d = 768, vocab = 50304, ctx = 1024, layers = 12;
  std::vector<Shape> shapes = {{vocab, d}, {ctx, d}};
  for (int64_t l = 0; l < layers; ++l) {
    for (Shape s : std::vector<Shape>{{d}, {d}, {3 * d, d}, {3 * d}, {d, d}, {d}, {d}, {d},
                                      {4 * d, d}, {4 * d}, {d, 4 * d}, {d}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({d});
  shapes.push_back({d});
  return shapes;
}

// Every case of one dtype ("f32" or "bf16"), passing `keep` (the --filter).
void run_dtype(const std::string& dtype_label, int reps,
               const std::function<bool(const std::string&)>& keep, std::vector<Measured>& out) {
  const DType dtype = dtype_label == "bf16" ? DType::BF16 : DType::F32;
  const double s = double(dtype_size(dtype));
  const double n = double(kElements);
  auto label = [&](const std::string& name) { return name + " " + dtype_label; };

  if (keep(label("add")) || keep(label("scale")) || keep(label("axpy"))) {
    Tensor a = bench::uniform_on_gpu({kElements}, dtype, 11, -1.f, 1.f);
    Tensor b = bench::uniform_on_gpu({kElements}, dtype, 12, -1.f, 1.f);
    if (keep(label("add"))) {
      // out = a + b: read a and b, write out: 3 N s.
      Tensor result;
      out.push_back(measure("add", dtype_label, 3 * n * s, reps,
                            [&](int) { result = ops::add(a, b); }));
    }
    if (keep(label("scale"))) {
      // x *= alpha in place: read x, write x: 2 N s. alpha alternates 2, 1/2 (exact).
      out.push_back(measure("scale", dtype_label, 2 * n * s, reps,
                            [&](int i) { ops::scale_(a, i % 2 ? 0.5 : 2.0); }));
    }
    if (keep(label("axpy"))) {
      // y += alpha x in place: read x and y, write y: 3 N s. alpha alternates +-1/2.
      out.push_back(measure("axpy", dtype_label, 3 * n * s, reps,
                            [&](int i) { ops::axpy_(i % 2 ? -0.5 : 0.5, a, b); }));
    }
  }

  // SwiGLU's gating silu(gate) * up (core/ops/swiglu.h) over N elements, against silu then
  // mul. Forward: read gate and up, write out: 3 N s. Backward: read dout, gate and up,
  // write dgate and dup: 5 N s. The two-op forms are counted by the same bytes (they move
  // more), so their fraction shows what fusing saves.
  if (keep(label("swiglu_fwd")) || keep(label("swiglu_bwd")) ||
      keep(label("silu_then_mul_fwd")) || keep(label("silu_then_mul_bwd"))) {
    Tensor gate = bench::uniform_on_gpu({kElements}, dtype, 41, -4.f, 4.f);
    Tensor up = bench::uniform_on_gpu({kElements}, dtype, 42, -1.f, 1.f);
    Tensor dout = bench::uniform_on_gpu({kElements}, dtype, 43, -1.f, 1.f);
    Tensor result;
    ops::SwigluGrads grads;
    if (keep(label("swiglu_fwd"))) {
      out.push_back(measure("swiglu_fwd", dtype_label, 3 * n * s, reps,
                            [&](int) { result = ops::swiglu(gate, up); }));
    }
    if (keep(label("silu_then_mul_fwd"))) {
      out.push_back(measure("silu_then_mul_fwd", dtype_label, 3 * n * s, reps, [&](int) {
        result = ops::binary(BinaryOp::Mul, ops::unary(UnaryOp::Silu, gate), up);
      }));
    }
    if (keep(label("swiglu_bwd"))) {
      out.push_back(measure("swiglu_bwd", dtype_label, 5 * n * s, reps, [&](int) {
        grads = ops::swiglu_backward(dout, gate, up, true, true);
      }));
    }
    if (keep(label("silu_then_mul_bwd"))) {
      const Tensor silu_gate = ops::unary(UnaryOp::Silu, gate);
      out.push_back(measure("silu_then_mul_bwd", dtype_label, 5 * n * s, reps, [&](int) {
        grads.dup = ops::binary(BinaryOp::Mul, dout, silu_gate);
        grads.dgate = ops::unary_backward(UnaryOp::Silu, ops::binary(BinaryOp::Mul, dout, up),
                                          gate);
      }));
    }
  }

  for (int64_t d : {int64_t(2048), int64_t(4096)}) {
    const int64_t rows = kElements / d;
    const std::string suffix = "_d" + std::to_string(d);
    const bool forward = keep(label("rms_norm_fwd" + suffix));
    const bool backward = keep(label("rms_norm_bwd" + suffix));
    if (!forward && !backward) continue;
    const double r = double(rows), dd = double(d);
    Tensor x = bench::uniform_on_gpu({rows, d}, dtype, 21, -2.f, 2.f);
    Tensor w = bench::uniform_on_gpu({d}, dtype, 22, 0.5f, 1.5f);
    Tensor dy = bench::uniform_on_gpu({rows, d}, dtype, 23, -1.f, 1.f);
    ops::NormResult fwd = ops::rms_norm("rms_norm", x, Tensor(), w, 1e-6);
    if (forward) {
      // y = x rstd w: read x [R, D] and w [D], write y [R, D] and rstd [R]:
      // (2 R D + D + R) s.
      out.push_back(measure("rms_norm_fwd" + suffix, dtype_label, (2 * r * dd + dd + r) * s,
                            reps, [&](int) { fwd = ops::rms_norm("rms_norm", x, Tensor(), w,
                                                                 1e-6); }));
    }
    if (backward) {
      // dx and dweight: read dy, x [R, D], w [D], rstd [R]; write dx [R, D], dweight [D]:
      // (3 R D + 2 D + R) s. Partial sums of dweight are scratch, not counted.
      ops::RmsNormGrads grads;
      out.push_back(measure("rms_norm_bwd" + suffix, dtype_label,
                            (3 * r * dd + 2 * dd + r) * s, reps, [&](int) {
                              grads = ops::rms_norm_backward(dy, x, Tensor(), w, fwd.rstd, true,
                                                             false, true);
                            }));
    }
  }

  // causal_conv1d at the paper HAM's q/k and v widths (1280 and 1920 channels, width 4), 8
  // sequences of 4096 tokens in documents of 512, so each tensor outgrows the L2 cache. The
  // span kernels, then the per-element kernels (set_conv1d_spans off) for comparison.
  // Forward: read x, write y: 2 N s (weight, bias and ids are small). Backward, all three
  // gradients: read x and dy, write dx: 3 N s (the f64 partial sums are scratch, not counted).
  // The models' form, conv1d_silu (Conv1dActivation::SiLU, y recomputed in the backward), is
  // counted by the same bytes, and so is conv1d_then_silu, the conv and the unary SiLU as
  // two ops (the backward: SiLU's from the kept y, then the conv's).
  for (int64_t channels : {int64_t(1280), int64_t(1920)}) {
    const int64_t batch = 8, tokens = 4096, width = 4;
    const std::string suffix = "_c" + std::to_string(channels);
    std::vector<std::string> names;
    for (const char* pass : {"conv1d_fwd", "conv1d_bwd"}) {
      for (const char* kind : {"", "_per_element"}) names.push_back(pass + suffix + kind);
    }
    for (const char* pass : {"conv1d_silu_fwd", "conv1d_silu_bwd", "conv1d_then_silu_fwd",
                             "conv1d_then_silu_bwd"}) {
      names.push_back(pass + suffix);
    }
    auto kept = [&](const std::string& name) { return keep(label(name)); };
    if (std::none_of(names.begin(), names.end(), kept)) continue;
    const double elements = double(batch * tokens * channels);
    Tensor x = bench::uniform_on_gpu({batch, tokens, channels}, dtype, 31, -1.f, 1.f);
    Tensor dy = bench::uniform_on_gpu({batch, tokens, channels}, dtype, 32, -1.f, 1.f);
    Tensor weight = bench::uniform_on_gpu({channels, width}, dtype, 33, -0.5f, 0.5f);
    Tensor bias = bench::uniform_on_gpu({channels}, dtype, 34, -0.5f, 0.5f);
    std::vector<int32_t> ids(size_t(batch * tokens));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i / 512);
    Tensor doc_ids = Tensor::from_vector(ids, {batch, tokens}).to(Device::cuda());
    for (bool spans : {true, false}) {
      const bool previous = cuda::set_conv1d_spans(spans);
      const std::string kind = spans ? "" : "_per_element";
      if (keep(label("conv1d_fwd" + suffix + kind))) {
        Tensor y;
        out.push_back(measure("conv1d_fwd" + suffix + kind, dtype_label, 2 * elements * s, reps,
                              [&](int) { y = ops::causal_conv1d(x, weight, bias, doc_ids); }));
      }
      if (keep(label("conv1d_bwd" + suffix + kind))) {
        ops::CausalConv1dGrads grads;
        out.push_back(measure("conv1d_bwd" + suffix + kind, dtype_label, 3 * elements * s, reps,
                              [&](int) {
                                grads = ops::causal_conv1d_backward(dy, x, weight, true, true,
                                                                    true, doc_ids);
                              }));
      }
      cuda::set_conv1d_spans(previous);
    }
    const Tensor no_bias;
    if (keep(label("conv1d_silu_fwd" + suffix))) {
      Tensor z;
      out.push_back(measure("conv1d_silu_fwd" + suffix, dtype_label, 2 * elements * s, reps,
                            [&](int) {
                              z = ops::causal_conv1d(x, weight, no_bias, doc_ids,
                                                     Conv1dActivation::SiLU);
                            }));
    }
    if (keep(label("conv1d_silu_bwd" + suffix))) {
      ops::CausalConv1dGrads grads;
      out.push_back(measure("conv1d_silu_bwd" + suffix, dtype_label, 3 * elements * s, reps,
                            [&](int) {
                              grads = ops::causal_conv1d_backward(dy, x, weight, true, true,
                                                                  false, doc_ids, no_bias,
                                                                  Conv1dActivation::SiLU);
                            }));
    }
    if (keep(label("conv1d_then_silu_fwd" + suffix))) {
      Tensor z;
      out.push_back(measure("conv1d_then_silu_fwd" + suffix, dtype_label, 2 * elements * s,
                            reps, [&](int) {
                              z = ops::unary(UnaryOp::Silu,
                                             ops::causal_conv1d(x, weight, no_bias, doc_ids));
                            }));
    }
    if (keep(label("conv1d_then_silu_bwd" + suffix))) {
      const Tensor y = ops::causal_conv1d(x, weight, no_bias, doc_ids);
      ops::CausalConv1dGrads grads;
      out.push_back(measure("conv1d_then_silu_bwd" + suffix, dtype_label, 3 * elements * s,
                            reps, [&](int) {
                              grads = ops::causal_conv1d_backward(
                                  ops::unary_backward(UnaryOp::Silu, dy, y), x, weight, true,
                                  true, false, doc_ids);
                            }));
    }
  }

  // AdamW over GPT-2 small's tensors, moments always f32. f32: f32 params and grads;
  // bf16: f32 master params with bf16 grads, and bf16 params with bf16 grads. Per element:
  // read p, g, m, v and write p, m, v: 2 s_p + s_g + 4 * 4 bytes. bf16 also times the
  // mixed-precision step, f32 masters with bf16 grads whose bf16 parameters take the update
  // rounded: adamw_multi_p32_rounded writes them in the update's launch (2 bytes more an
  // element), adamw_multi_p32_then_cast casts each master after it (as nn's AdamW did
  // before; counted by the same bytes, so its fraction shows what the second pass costs).
  struct AdamWCase {
    std::string name;
    DType param, grad;
  };
  std::vector<AdamWCase> adamw_cases;
  if (dtype == DType::F32) {
    adamw_cases = {{"adamw_multi_p32", DType::F32, DType::F32}};
  } else {
    adamw_cases = {{"adamw_multi_p32", DType::F32, DType::BF16},
                   {"adamw_multi_p16", DType::BF16, DType::BF16}};
  }
  for (const AdamWCase& c : adamw_cases) {
    const std::string per_tensor_name = "adamw_per_tensor" + c.name.substr(11);
    const bool multi = keep(label(c.name)), per_tensor = keep(label(per_tensor_name));
    if (!multi && !per_tensor) continue;
    std::vector<Tensor> params, grads, exp_avg, exp_avg_sq;
    double numel = 0;
    uint64_t seed = 100;
    for (const Shape& shape : gpt2_small_shapes()) {
      params.push_back(bench::uniform_on_gpu(shape, c.param, seed++, -0.1f, 0.1f));
      grads.push_back(bench::uniform_on_gpu(shape, c.grad, seed++, -1e-2f, 1e-2f));
      exp_avg.push_back(bench::uniform_on_gpu(shape, DType::F32, seed++, -1e-3f, 1e-3f));
      exp_avg_sq.push_back(bench::uniform_on_gpu(shape, DType::F32, seed++, 1e-6f, 1e-4f));
      numel += double(shape_numel(shape));
    }
    const double bytes =
        numel * (2 * double(dtype_size(c.param)) + double(dtype_size(c.grad)) + 4 * 4);
    auto hyper = [](int i) { return AdamWHyper{1e-4, 0.9, 0.95, 1e-8, 0.1, 1000 + i}; };
    if (multi) {
      out.push_back(measure(c.name, dtype_label, bytes, reps, [&](int i) {
        ops::adamw_step_multi(params, grads, exp_avg, exp_avg_sq, hyper(i));
      }));
    }
    if (per_tensor) {  // one launch per tensor, for comparison
      out.push_back(measure(per_tensor_name, dtype_label, bytes, reps, [&](int i) {
        for (size_t t = 0; t < params.size(); ++t) {
          ops::adamw_step(params[t], grads[t], exp_avg[t], exp_avg_sq[t], hyper(i));
        }
      }));
    }
    const bool rounded = keep(label("adamw_multi_p32_rounded")),
               then_cast = keep(label("adamw_multi_p32_then_cast"));
    if (c.param != DType::F32 || c.grad != DType::BF16 || (!rounded && !then_cast)) continue;
    std::vector<Tensor> copies;
    for (const Tensor& p : params) copies.push_back(ops::cast(p, DType::BF16));
    const double mixed_bytes = bytes + numel * double(dtype_size(DType::BF16));
    if (rounded) {
      out.push_back(measure("adamw_multi_p32_rounded", dtype_label, mixed_bytes, reps, [&](int i) {
        ops::adamw_step_multi(params, grads, exp_avg, exp_avg_sq, hyper(i), copies);
      }));
    }
    if (then_cast) {
      out.push_back(
          measure("adamw_multi_p32_then_cast", dtype_label, mixed_bytes, reps, [&](int i) {
            ops::adamw_step_multi(params, grads, exp_avg, exp_avg_sq, hyper(i));
            for (size_t t = 0; t < params.size(); ++t) ops::cast_into(params[t], copies[t]);
          }));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bench::CudaBenchArgs args = bench::parse_cuda_bench_args(argc, argv, 20);
  try {
    if (!bench::gpu_available("bench_memory_bound_cuda")) return 1;
    auto keep = [&](const std::string& label) {
      return bench::matches_filter(args.filter, label);
    };

    // The reference, always measured: 1 GiB device-to-device, 2 GiB moved.
    std::vector<Measured> results;
    {
      const int64_t copy_elements = int64_t(1) << 28;
      Tensor src = bench::uniform_on_gpu({copy_elements}, DType::F32, 1, -1.f, 1.f);
      Tensor dst = Tensor::empty({copy_elements}, DType::F32, Device::cuda());
      const size_t bytes = src.nbytes();
      const cudaStream_t stream = cuda::current_stream(0);
      results.push_back(measure("copy_d2d", "bytes", 2 * double(bytes), args.reps, [&](int) {
        HAM_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), bytes,
                                       cudaMemcpyDeviceToDevice, stream));
      }));
    }
    for (const std::string dtype : {"f32", "bf16"}) run_dtype(dtype, args.reps, keep, results);

    auto gbps = [](const Measured& m, double ms) { return m.bytes / (ms * 1e-3) / 1e9; };
    const Measured& copy = results.front();
    const double copy_gbps = gbps(copy, copy.ms[copy.ms.size() / 2]);

    std::ofstream csv = bench::open_csv(
        args.csv_path, "name,dtype,bytes,reps,ms_min,ms_median,ms_max,gbps_min,gbps_median,gbps_max,"
                       "copy_gbps_median,ratio_min,ratio_median,ratio_max");
    std::printf("%-22s %-5s %9s %9s  %8s %8s %8s GB/s  %6s %6s %6s of copy\n", "case", "dtype",
                "MB", "median", "min", "median", "max", "min", "median", "max");
    int below = 0;
    for (const Measured& m : results) {
      // The slowest repeat has the lowest bandwidth: max time -> min GB/s.
      const double lo = gbps(m, m.ms.back()), mid = gbps(m, m.ms[m.ms.size() / 2]),
                   hi = gbps(m, m.ms.front());
      const bool short_of_target = mid / copy_gbps < kTarget;
      below += short_of_target;
      std::printf("%-22s %-5s %9.1f %7.3fms  %8.1f %8.1f %8.1f GB/s  %5.1f%% %5.1f%% %5.1f%%%s\n",
                  m.name.c_str(), m.dtype.c_str(), m.bytes / 1e6, m.ms[m.ms.size() / 2], lo,
                  mid, hi, 100 * lo / copy_gbps, 100 * mid / copy_gbps, 100 * hi / copy_gbps,
                  short_of_target ? "  < target" : "");
      std::fflush(stdout);
      if (csv.is_open()) {
        csv << m.name << ',' << m.dtype << ',' << m.bytes << ',' << m.ms.size() << ','
            << m.ms.front() << ',' << m.ms[m.ms.size() / 2] << ',' << m.ms.back() << ',' << lo
            << ',' << mid << ',' << hi << ',' << copy_gbps << ',' << lo / copy_gbps << ','
            << mid / copy_gbps << ',' << hi / copy_gbps << '\n';
      }
    }
    std::printf("copy bandwidth (median) %.1f GB/s; %d of %zu cases below %.0f%% of it "
                "(median)\n",
                copy_gbps, below, results.size() - 1, 100 * kTarget);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory_bound_cuda: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

// One training step of every tiny model on the GPU against the same step on the CPU: the
// loss, every parameter's gradient, then the weights after the optimizer steps. Both are
// measured against the CPU in f64: the GPU's relative RMS error must be within the dtype's
// bound (1e-5 f32, 1e-2 bf16) or, where rounding in that dtype costs the CPU itself more,
// within kRoundingSlack times the CPU's own error. (The gate and router parameters'
// gradients are sums over every token of terms that cancel, and AdamW's first steps divide
// by |g|, so f32 on two devices can differ by more than 1e-5 while both are as accurate as
// f32 summed in their own orders allows: the GPU's tile partial sums, tree reductions and
// GEMM k-splits add in other orders than the CPU's loops.) A wrong kernel is off by orders
// of magnitude more. Skips,
// saying why, without a GPU. (tests/device runs the same comparison on an emulated device,
// exactly, on any machine.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#ifdef HAM_WITH_CUDA
#include "cuda/gated_delta_rule.h"
#endif
#include "tests/device_training.h"
#include "tests/testing.h"

namespace ham {
namespace {

// How much more rounding error than the CPU's the GPU may show on an ill-conditioned
// tensor. On the SIMT emulator, whose sums are the CPU's f64 ones, it was at most about 2x
// on one step's gradients and about 5x on single weights after two AdamW steps, whose first
// updates divide by |g|. On an H200 (2026-11-25), where the kernels add in their own f32
// orders with fused multiply-adds, the same results were deterministic run to run and
// larger: 11x and 18x on the gate parameters' gradients of the EDA model (A_log 3.0e-5
// against the CPU's 2.8e-6, dt_bias 2.9e-5 against 1.6e-6) and 23-33x on gdn-gsa's
// embedding after two steps (2.5e-5 against the CPU's 0.8-1.1e-6, which moves with the
// CPU's thread count), while every op's own GPU test held its tighter bound. A wrong kernel
// is off by orders of magnitude more.
constexpr double kRoundingSlack = 32;         // one step's gradients
constexpr double kRoundingSlackAdamW = 64;    // weights after AdamW steps
// In bf16 the GPU rounds more than the CPU reference does: its tensor-core kernels
// (routed attention, the gated delta rule's forward) feed bf16 operands to mma (P, the
// chunk's inverse A, the state, v_new), as flash-attention and flash-linear-attention do,
// while the CPU computes each op in f32 and rounds only its outputs. Their op-level errors
// stay within the bf16 bounds (measured 2-3e-3 against 5e-3), and HAM's routing turns the
// difference into a few tokens selected differently; measured up to 10x the CPU's error.
constexpr double kRoundingSlackBf16 = 16;

// The GPU's error against the f64 reference is within `bound` or `slack` times the CPU's
// error in the same precision.
void expect_as_accurate_as_the_cpu(const Tensor& gpu, const Tensor& cpu, const Tensor& reference,
                                   double bound, const std::string& what,
                                   double slack = kRoundingSlack) {
  const Tensor ref = reference.to(DType::F64);
  const double gpu_error = testing::relative_rms_error(gpu.to(Device::cpu()).to(DType::F64), ref);
  const double cpu_error = testing::relative_rms_error(cpu.to(DType::F64), ref);
  EXPECT_LE(gpu_error, std::max(bound, slack * cpu_error))
      << what << ": the CPU in the same precision is off by " << cpu_error;
}

TEST(DeviceTraining, CudaStepMatchesTheCpuStepForEveryTinyModel) {
  HAM_SKIP_UNLESS_CUDA();
  TokenBatch batch = testing::corpus_batch(2, 64, 11);
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string());
    ModelConfig config = ModelConfig::from_file(file.string());
    auto on_cpu = make_model(config), on_gpu = make_model(config), in_f64 = make_model(config);
    on_gpu->to(Device::cuda());
    in_f64->to(DType::F64);
    testing::StepResult cpu = testing::loss_and_gradients(*on_cpu, batch);
    testing::StepResult gpu = testing::loss_and_gradients(*on_gpu, batch);
    testing::StepResult ref = testing::loss_and_gradients(*in_f64, batch);
    EXPECT_LE(std::abs(gpu.loss - ref.loss),
              std::max(1e-5 * std::abs(ref.loss), kRoundingSlack * std::abs(cpu.loss - ref.loss)));
    ASSERT_EQ(gpu.gradients.size(), cpu.gradients.size());
    for (size_t i = 0; i < cpu.gradients.size(); ++i) {
      const std::string& name = cpu.gradients[i].first;
      ASSERT_EQ(gpu.gradients[i].second.defined(), cpu.gradients[i].second.defined()) << name;
      if (!cpu.gradients[i].second.defined()) continue;
      expect_as_accurate_as_the_cpu(gpu.gradients[i].second, cpu.gradients[i].second,
                                    ref.gradients[i].second, testing::gpu_tolerance(DType::F32),
                                    name);
    }
  }
}

// Two training steps of every tiny model on the GPU and on the CPU in `precision`, and on
// the CPU in f64: the losses and the final (f32 master) weights.
void expect_gpu_training_tracks_the_cpu(const std::string& precision, double bound) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string() + " " + precision);
    ModelConfig config = ModelConfig::from_file(file.string());
    auto on_cpu = make_model(config), on_gpu = make_model(config), in_f64 = make_model(config);
    in_f64->to(DType::F64);
    TrainOptions cpu_opt = testing::short_run("cpu", 2), gpu_opt = testing::short_run("cuda", 2);
    TrainOptions ref_opt = cpu_opt;
    cpu_opt.precision = gpu_opt.precision = precision;
    std::ostringstream cpu_log, gpu_log, ref_log;
    TrainResult cpu = train(*on_cpu, train_data, val_data, cpu_opt, cpu_log);
    TrainResult gpu = train(*on_gpu, train_data, val_data, gpu_opt, gpu_log);
    TrainResult ref = train(*in_f64, train_data, val_data, ref_opt, ref_log);
    ASSERT_EQ(gpu.step_losses.size(), cpu.step_losses.size()) << gpu_log.str();
    ASSERT_EQ(ref.step_losses.size(), cpu.step_losses.size()) << ref_log.str();
    for (size_t s = 0; s < cpu.step_losses.size(); ++s) {
      EXPECT_LE(std::abs(gpu.step_losses[s] - ref.step_losses[s]),
                std::max(bound * ref.step_losses[s],
                         kRoundingSlack * std::abs(cpu.step_losses[s] - ref.step_losses[s])))
          << "step " << s + 1;
    }
    auto cpu_params = on_cpu->named_parameters(), gpu_params = on_gpu->named_parameters();
    auto ref_params = in_f64->named_parameters();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_EQ(gpu_params[i].second.device(), Device::cuda()) << gpu_params[i].first;
      EXPECT_EQ(gpu_params[i].second.dtype(), DType::F32) << gpu_params[i].first;
      expect_as_accurate_as_the_cpu(gpu_params[i].second, cpu_params[i].second,
                                    ref_params[i].second, bound, gpu_params[i].first,
                                    precision == "bf16" ? kRoundingSlackBf16 : kRoundingSlackAdamW);
    }
  }
}

TEST(DeviceTraining, CudaTrainingStepsMatchTheCpuForEveryTinyModel) {
  HAM_SKIP_UNLESS_CUDA();
  expect_gpu_training_tracks_the_cpu("f32", testing::gpu_tolerance(DType::F32));
}

// bf16 mixed precision on the GPU against the same on the CPU (which computes bf16 ops in
// f32 and rounds as the GPU kernels do), within the bf16 bound.
TEST(DeviceTraining, CudaBf16TrainingTracksTheCpuBf16ForEveryTinyModel) {
  HAM_SKIP_UNLESS_CUDA();
  expect_gpu_training_tracks_the_cpu("bf16", testing::gpu_tolerance(DType::BF16));
}

// gdn_keep_chunk_states: a bf16 training step of a GDN and of a HAM model (the two layers
// that call the gated delta rule), its backward reading the chunk states its forward kept,
// gives the loss and weights of the step that recomputes them from the inputs and each
// chunk's A (the default: the forward keeps A, which the backward reads), to the bit.
TEST(DeviceTraining, Bf16TrainingWithKeptChunkStatesEqualsRecomputing) {
  HAM_SKIP_UNLESS_CUDA();
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  int models = 0;
  for (const auto& file : testing::tiny_config_files()) {
    const std::string name = file.filename().string();
    if (name != "gdn.json" && name != "ham-fixed-tau.json") continue;
    SCOPED_TRACE(name);
    ++models;
    ModelConfig config = ModelConfig::from_file(file.string());
    config.n_layers = 1;
    ModelConfig keeping = config;
    keeping.gdn_keep_chunk_states = true;
    auto recomputing_model = make_model(config), keeping_model = make_model(keeping);
    TrainOptions options = testing::short_run("cuda", 1);
    options.precision = "bf16";
    options.seq_len = 130;  // three chunks: the later two start from kept states
    std::ostringstream log;
#ifdef HAM_WITH_CUDA
    const int64_t reads = cuda::gated_delta_rule_kept_inverse_reads();
#endif
    TrainResult recomputed = train(*recomputing_model, train_data, val_data, options, log);
#ifdef HAM_WITH_CUDA
    EXPECT_GT(cuda::gated_delta_rule_kept_inverse_reads(), reads);  // A kept by default
    const int64_t reads_before_keeping = cuda::gated_delta_rule_kept_inverse_reads();
#endif
    TrainResult kept = train(*keeping_model, train_data, val_data, options, log);
#ifdef HAM_WITH_CUDA
    EXPECT_EQ(cuda::gated_delta_rule_kept_inverse_reads(), reads_before_keeping);
#endif
    EXPECT_EQ(kept.step_losses, recomputed.step_losses);
    auto want = recomputing_model->named_parameters(), got = keeping_model->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(testing::max_abs_diff(got[i].second.to(Device::cpu()),
                                      want[i].second.to(Device::cpu())),
                0.0)
          << want[i].first;
    }
  }
  EXPECT_EQ(models, 2);
}

}  // namespace
}  // namespace ham

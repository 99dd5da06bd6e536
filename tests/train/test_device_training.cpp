// One training step of every tiny model on the GPU against the same step on the CPU:
// the loss and every parameter's gradient, then the weights after the optimizer step,
// within the f32 bound (relative RMS error <= 1e-5). Skips, saying why, without a GPU.
// (tests/device runs the same comparison on an emulated device, exactly, on any machine.)
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "tests/device_training.h"
#include "tests/testing.h"

namespace ham {
namespace {

TEST(DeviceTraining, CudaStepMatchesTheCpuStepForEveryTinyModel) {
  HAM_SKIP_UNLESS_CUDA();
  TokenBatch batch = testing::corpus_batch(2, 64, 11);
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string());
    ModelConfig config = ModelConfig::from_file(file.string());
    auto on_cpu = make_model(config), on_gpu = make_model(config);
    on_gpu->to(Device::cuda());
    testing::StepResult cpu = testing::loss_and_gradients(*on_cpu, batch);
    testing::StepResult gpu = testing::loss_and_gradients(*on_gpu, batch);
    EXPECT_LE(std::abs(gpu.loss - cpu.loss), 1e-5 * std::abs(cpu.loss));
    ASSERT_EQ(gpu.gradients.size(), cpu.gradients.size());
    for (size_t i = 0; i < cpu.gradients.size(); ++i) {
      const std::string& name = cpu.gradients[i].first;
      ASSERT_EQ(gpu.gradients[i].second.defined(), cpu.gradients[i].second.defined()) << name;
      if (!cpu.gradients[i].second.defined()) continue;
      EXPECT_LE(testing::relative_rms_error(gpu.gradients[i].second, cpu.gradients[i].second),
                testing::gpu_tolerance(DType::F32))
          << name;
    }
  }
}

// Two training steps of every tiny model on the GPU and on the CPU in `precision`: the
// losses and the final (f32 master) weights within `bound` relative.
void expect_gpu_training_tracks_the_cpu(const std::string& precision, double bound) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string() + " " + precision);
    ModelConfig config = ModelConfig::from_file(file.string());
    auto on_cpu = make_model(config), on_gpu = make_model(config);
    TrainOptions cpu_opt = testing::short_run("cpu", 2), gpu_opt = testing::short_run("cuda", 2);
    cpu_opt.precision = gpu_opt.precision = precision;
    std::ostringstream cpu_log, gpu_log;
    TrainResult cpu = train(*on_cpu, train_data, val_data, cpu_opt, cpu_log);
    TrainResult gpu = train(*on_gpu, train_data, val_data, gpu_opt, gpu_log);
    ASSERT_EQ(gpu.step_losses.size(), cpu.step_losses.size()) << gpu_log.str();
    for (size_t s = 0; s < cpu.step_losses.size(); ++s) {
      EXPECT_LE(std::abs(gpu.step_losses[s] - cpu.step_losses[s]), bound * cpu.step_losses[s])
          << "step " << s + 1;
    }
    auto cpu_params = on_cpu->named_parameters(), gpu_params = on_gpu->named_parameters();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_EQ(gpu_params[i].second.device(), Device::cuda()) << gpu_params[i].first;
      EXPECT_EQ(gpu_params[i].second.dtype(), DType::F32) << gpu_params[i].first;
      EXPECT_LE(testing::relative_rms_error(gpu_params[i].second.to(Device::cpu()),
                                            cpu_params[i].second),
                bound)
          << gpu_params[i].first;
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

}  // namespace
}  // namespace ham

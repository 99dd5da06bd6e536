// Device plumbing, checked without a GPU: this binary does not link the CUDA backend and
// runs "cuda:0" on the CPU kernels behind a host-memory backend (emulate_device_on_cpu).
// Training there must keep every tensor on the device (ops refuse mixed devices) and give
// exactly the CPU's losses and weights, since the same kernels run in the same order.
#include <gtest/gtest.h>

#include <unistd.h>

#include <sstream>
#include <string>

#include "core/ops/matmul.h"
#include "models/ham.h"
#include "tests/device_training.h"
#include "tests/error_testing.h"
#include "tests/testing.h"
#include "train/checkpoint.h"

namespace ham {
namespace {

using testing::expect_error;

class EmulatedCuda : public ::testing::Test {
 protected:
  void SetUp() override { emulate_device_on_cpu(DeviceKind::CUDA); }
};

TEST_F(EmulatedCuda, OpsRunThereAndRefuseMixedDevices) {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor b = a.to(Device::cuda());
  ASSERT_EQ(b.device(), Device::cuda());
  Tensor c = ops::matmul(b, b);
  EXPECT_EQ(c.device(), Device::cuda());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{7, 10, 15, 22}));
  expect_error([&] { ops::matmul(a, b); }, {"cpu", "cuda:0"});
  // dtype conversion runs on the device (the cast op) and stays there.
  Tensor wide = b.to(DType::F64);
  EXPECT_EQ(wide.device(), Device::cuda());
  EXPECT_EQ(wide.to(Device::cpu()).to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));
}

TEST_F(EmulatedCuda, TheDeviceOptionIsCheckedAndResolvedByLocalRank) {
  EXPECT_EQ(resolve_training_device("cpu", 3), Device::cpu());
  EXPECT_EQ(resolve_training_device("cuda", 0), Device::cuda(0));
  EXPECT_EQ(resolve_training_device("cuda:0", 5), Device::cuda(0));
  // Local rank 2 asks for cuda:2; the emulated backend has any index, so only the name
  // is checked here (a real GPU count is checked when the tensor is made).
  EXPECT_EQ(resolve_training_device("cuda", 2), Device::cuda(2));
  TrainOptions o;
  expect_error([&] { o.update_from_json({{"device", "gpu"}}, "run.json"); },
               {"run.json", "device", "unknown device 'gpu'"});
}

// Every tiny model: three steps on the emulated device equal three on the CPU, loss for
// loss and weight for weight (HAM's thresholds and controller state included).
TEST_F(EmulatedCuda, EveryTinyModelTrainsThereExactlyAsOnTheCpu) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string());
    ModelConfig config = ModelConfig::from_file(file.string());
    auto on_cpu = make_model(config), on_device = make_model(config);
    std::ostringstream cpu_log, device_log;
    TrainResult cpu = train(*on_cpu, train_data, val_data, testing::short_run("cpu", 3), cpu_log);
    TrainResult dev =
        train(*on_device, train_data, val_data, testing::short_run("cuda", 3), device_log);
    EXPECT_EQ(dev.step_losses, cpu.step_losses) << device_log.str();
    EXPECT_EQ(dev.final_val_loss, cpu.final_val_loss);
    auto cpu_params = on_cpu->named_parameters(), device_params = on_device->named_parameters();
    ASSERT_EQ(cpu_params.size(), device_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_EQ(device_params[i].second.device(), Device::cuda()) << device_params[i].first;
      EXPECT_EQ(device_params[i].second.to(Device::cpu()).to_vector<float>(),
                cpu_params[i].second.to_vector<float>())
          << device_params[i].first;
    }
    for (const LayerRouting& r : on_device->routing()) {
      EXPECT_GT(r.kv_fraction, 0.0) << "layer " << r.layer;
    }
  }
}

// Mixed precision (bf16 compute, f32 masters) on the device equals it on the CPU too.
TEST_F(EmulatedCuda, Bf16MixedPrecisionTrainsThereExactlyAsOnTheCpu) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  for (const char* name : {"gdn-gsa.json", "ham-learned-router-eda.json"}) {
    SCOPED_TRACE(name);
    ModelConfig config =
        ModelConfig::from_file((testing::repository_dir() / "configs/tiny" / name).string());
    auto on_cpu = make_model(config), on_device = make_model(config);
    TrainOptions cpu_opt = testing::short_run("cpu", 3), device_opt = testing::short_run("cuda", 3);
    cpu_opt.precision = device_opt.precision = "bf16";
    std::ostringstream log;
    TrainResult cpu = train(*on_cpu, train_data, val_data, cpu_opt, log);
    TrainResult dev = train(*on_device, train_data, val_data, device_opt, log);
    EXPECT_EQ(dev.step_losses, cpu.step_losses) << log.str();
    auto cpu_params = on_cpu->named_parameters(), device_params = on_device->named_parameters();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_EQ(device_params[i].second.dtype(), DType::F32) << device_params[i].first;
      EXPECT_EQ(device_params[i].second.to(Device::cpu()).to_vector<float>(),
                cpu_params[i].second.to_vector<float>())
          << device_params[i].first;
    }
  }
}

// The gradient path alone: one backward on the device gives the CPU's gradients.
TEST_F(EmulatedCuda, OneStepsGradientsEqualTheCpus) {
  TokenBatch batch = testing::corpus_batch(2, 32, 7);
  for (const auto& file : testing::tiny_config_files()) {
    SCOPED_TRACE(file.filename().string());
    ModelConfig config = ModelConfig::from_file(file.string());
    auto on_cpu = make_model(config), on_device = make_model(config);
    on_device->to(Device::cuda());
    testing::StepResult cpu = testing::loss_and_gradients(*on_cpu, batch);
    testing::StepResult dev = testing::loss_and_gradients(*on_device, batch);
    EXPECT_EQ(dev.loss, cpu.loss);
    ASSERT_EQ(dev.gradients.size(), cpu.gradients.size());
    for (size_t i = 0; i < cpu.gradients.size(); ++i) {
      ASSERT_EQ(dev.gradients[i].second.defined(), cpu.gradients[i].second.defined())
          << cpu.gradients[i].first;
      if (!cpu.gradients[i].second.defined()) continue;
      EXPECT_EQ(dev.gradients[i].second.to_vector<float>(),
                cpu.gradients[i].second.to_vector<float>())
          << cpu.gradients[i].first;
    }
  }
}

// A checkpoint written by a device run holds CPU tensors and resumes on the CPU with the
// uninterrupted run's losses.
TEST_F(EmulatedCuda, ADeviceCheckpointResumesOnTheCpu) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  ModelConfig config =
      ModelConfig::from_file((testing::repository_dir() / "configs/tiny/ham-learned-tau.json").string());
  std::string dir = testing::fresh_temp_dir("emulated_device").string();
  std::ostringstream log;
  auto on_device = make_model(config);
  TrainOptions opt = testing::short_run("cuda:0", 4);
  opt.out_dir = dir;
  opt.checkpoint_every = 2;
  TrainResult uninterrupted = train(*on_device, train_data, val_data, opt, log);
  CheckpointContents saved = load_checkpoint(dir + "/step-00000002");
  for (const auto& [name, t] : saved.model) EXPECT_TRUE(t.device().is_cpu()) << name;
  for (const auto& [name, t] : saved.optimizer) EXPECT_TRUE(t.device().is_cpu()) << name;

  auto on_cpu = make_model(config);
  TrainResult resumed =
      train(*on_cpu, train_data, val_data, testing::short_run("cpu", 4), log, saved);
  EXPECT_EQ(resumed.step_losses, uninterrupted.step_losses) << log.str();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ham

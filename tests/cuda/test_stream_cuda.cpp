// Streams, events, device memory statistics and the out-of-memory error on a real GPU.
// Built only with the CUDA backend; each test skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "tests/testing.h"
#include "tests/error_testing.h"

#if HAM_WITH_CUDA
#include "core/ops/matmul.h"
#include "cuda/check.h"
#include "cuda/cublas.h"
#include "cuda/stream.h"

namespace ham::cuda {
namespace {

TEST(CudaMemory, TensorsComeFromTheCachingAllocator) {
  HAM_SKIP_UNLESS_CUDA();
  empty_cache(0);
  AllocatorStats before = memory_stats(0);
  {
    Tensor t = Tensor::empty({1000}, DType::F32, Device::cuda());
    AllocatorStats during = memory_stats(0);
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + 4096);
    EXPECT_EQ(during.requested_bytes, before.requested_bytes + 4000);
    EXPECT_GE(during.reserved_bytes, during.allocated_bytes);
  }
  AllocatorStats after_free = memory_stats(0);
  EXPECT_EQ(after_free.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after_free.peak_allocated_bytes, before.allocated_bytes + 4096);
  Tensor again = Tensor::empty({1000}, DType::F32, Device::cuda());
  EXPECT_EQ(memory_stats(0).device_allocations, after_free.device_allocations)
      << "the freed block was not reused";
  EXPECT_GT(memory_stats(0).cache_hits, after_free.cache_hits);
}

TEST(CudaMemory, OutOfMemoryIsAOneLineErrorWithByteCounts) {
  HAM_SKIP_UNLESS_CUDA();
  size_t free_bytes = 0, total_bytes = 0;
  HAM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  int64_t too_many = int64_t(total_bytes / 4) * 2;  // f32: twice the card's memory
  testing::expect_error([&] { Tensor::empty({too_many}, DType::F32, Device::cuda()); },
                        {"cuda:0", "out of memory", "requested " + std::to_string(too_many * 4),
                         "bytes free", "bytes cached"});
  // The device is still usable afterwards.
  EXPECT_EQ(Tensor::full({3}, 1.5, DType::F32, Device::cuda()).to_vector<float>(),
            (std::vector<float>{1.5f, 1.5f, 1.5f}));
}

TEST(CudaStreams, WorkOnAStreamIsOrderedAndEventsTimeIt) {
  HAM_SKIP_UNLESS_CUDA();
  Stream stream(0);
  Event start(0, /*timing=*/true), stop(0, /*timing=*/true);
  Tensor a = testing::random_tensor({256, 256}, DType::F32, Device::cpu(), 7);
  Tensor b = testing::random_tensor({256, 256}, DType::F32, Device::cpu(), 8);
  Tensor expected = ops::matmul(a, b);
  Tensor result;
  {
    StreamGuard guard(stream);
    EXPECT_EQ(current_stream(0), stream.handle());
    Tensor a_gpu = a.to(Device::cuda()), b_gpu = b.to(Device::cuda());
    start.record(stream.handle());
    result = ops::matmul(a_gpu, b_gpu);
    stop.record(stream.handle());
  }
  EXPECT_EQ(current_stream(0), nullptr) << "the guard did not restore the legacy stream";
  stop.synchronize();
  EXPECT_TRUE(stop.completed());
  EXPECT_GE(stop.elapsed_ms_since(start), 0.0f);
  stream.synchronize();
  EXPECT_LE(testing::relative_rms_error(result.to(Device::cpu()), expected), 1e-5);
}

TEST(CudaStreams, AStreamWaitsForAnotherStreamsEvent) {
  HAM_SKIP_UNLESS_CUDA();
  Stream producer(0), consumer(0);
  Event ready(0);
  Tensor filled;
  {
    StreamGuard guard(producer);
    filled = Tensor::full({1 << 20}, 3.0, DType::F32, Device::cuda());
    ready.record(producer.handle());
  }
  consumer.wait(ready);
  Tensor copy = Tensor::empty({1 << 20}, DType::F32, Device::cuda());
  {
    StreamGuard guard(consumer);
    copy.copy_(filled);
  }
  consumer.synchronize();
  std::vector<float> values = copy.to_vector<float>();
  EXPECT_EQ(values.front(), 3.0f);
  EXPECT_EQ(values.back(), 3.0f);
}

// ForkedStream: run() issues its work on the device's second stream (the same one each
// fork) while the current stream stays current outside it; that work comes after the
// current stream's earlier work (here a device copy into the same memory), and after join()
// the current stream's work sees what it wrote.
TEST(CudaStreams, ForkedWorkRunsOnTheSecondStreamAndJoins) {
  HAM_SKIP_UNLESS_CUDA();
  const int64_t n = 1 << 22;
  Tensor written = Tensor::empty({n}, DType::F32, Device::cuda());
  written.copy_(Tensor::full({n}, 1.0, DType::F32, Device::cuda()));
  cudaStream_t second = nullptr;
  {
    ForkedStream forked(0);
    forked.run([&] {
      second = current_stream(0);
      written.copy_(Tensor::full({n}, 5.0, DType::F32, Device::cuda()));
    });
    EXPECT_EQ(current_stream(0), nullptr) << "run() left the second stream current";
    forked.join();
  }
  EXPECT_NE(second, nullptr);
  const Tensor copy = written.clone();
  const std::vector<float> values = copy.to_vector<float>();
  EXPECT_EQ(values.front(), 5.0f);
  EXPECT_EQ(values.back(), 5.0f);
  cudaStream_t again = nullptr;
  ForkedStream(0).run([&] { again = current_stream(0); });
  EXPECT_EQ(again, second);
}

// StreamPriority::High: a stream of the device's greatest priority (a plain one has the
// least), and ForkedStream's high-priority second stream is another stream than its default
// one, ordered and joined the same way.
TEST(CudaStreams, HighPriorityStreamsAndForksTakeTheDevicesGreatestPriority) {
  HAM_SKIP_UNLESS_CUDA();
  int least = 0, greatest = 0;
  HAM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  ASSERT_LT(greatest, least) << "this device has one stream priority";
  const Stream plain(0), high(0, /*non_blocking=*/true, StreamPriority::High);
  EXPECT_EQ(plain.priority(), least);
  EXPECT_EQ(high.priority(), greatest);
  EXPECT_TRUE(has_greatest_priority(high.handle()));
  EXPECT_FALSE(has_greatest_priority(plain.handle()));
  EXPECT_FALSE(has_greatest_priority(nullptr)) << "the legacy stream";

  const int64_t n = 1 << 22;
  Tensor written = Tensor::empty({n}, DType::F32, Device::cuda());
  written.copy_(Tensor::full({n}, 1.0, DType::F32, Device::cuda()));
  cudaStream_t second = nullptr, second_high = nullptr;
  ForkedStream(0).run([&] { second = current_stream(0); });
  {
    ForkedStream forked(0, StreamPriority::High);
    forked.run([&] {
      second_high = current_stream(0);
      written.copy_(Tensor::full({n}, 7.0, DType::F32, Device::cuda()));
    });
    EXPECT_EQ(current_stream(0), nullptr) << "run() left the second stream current";
    forked.join();
  }
  EXPECT_NE(second_high, second);
  EXPECT_TRUE(has_greatest_priority(second_high));
  EXPECT_FALSE(has_greatest_priority(second));
  const std::vector<float> values = written.clone().to_vector<float>();
  EXPECT_EQ(values.front(), 7.0f);
  EXPECT_EQ(values.back(), 7.0f);
}

TEST(CudaStreams, CheckMacrosNameFileLineAndStatus) {
  HAM_SKIP_UNLESS_CUDA();
  testing::expect_error([] { HAM_CUDA_CHECK(cudaSetDevice(9999)); },
                        {"test_stream_cuda.cpp:", "cudaSetDevice(9999)", "cudaErrorInvalidDevice"});
  testing::expect_error(
      [] { HAM_CUBLAS_CHECK_CTX(cublasLtMatmulDescCreate(nullptr, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                "a null descriptor"); },
      {"test_stream_cuda.cpp:", "cublasLtMatmulDescCreate", "CUBLAS_STATUS_", "a null descriptor"});
}

TEST(CudaStreams, SelectLocalDeviceUsesTheRankFromTheEnvironment) {
  HAM_SKIP_UNLESS_CUDA();
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  EXPECT_EQ(select_local_device(), 0);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(device_count()).c_str(), 1);
  testing::expect_error([] { select_local_device(); }, {"local rank", "device(s) are visible"});
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(CudaMatmulPlans, OnePlanPerShapeIsCached) {
  HAM_SKIP_UNLESS_CUDA();
  Tensor a = testing::random_tensor({96, 80}, DType::F32, Device::cpu(), 11).to(Device::cuda());
  Tensor b = testing::random_tensor({80, 72}, DType::F32, Device::cpu(), 12).to(Device::cuda());
  ops::matmul(a, b);
  size_t plans = gemm_plan_cache_size();
  for (int i = 0; i < 3; ++i) ops::matmul(a, b);
  EXPECT_EQ(gemm_plan_cache_size(), plans);
  ops::matmul(b, a, true, true);
  EXPECT_EQ(gemm_plan_cache_size(), plans + 1);
}

TEST(CudaMatmulPlans, Tf32IsOptInAndStaysClose) {
  HAM_SKIP_UNLESS_CUDA();
  Tensor a = testing::random_tensor({512, 512}, DType::F32, Device::cpu(), 13);
  Tensor b = testing::random_tensor({512, 512}, DType::F32, Device::cpu(), 14);
  Tensor ref = ops::matmul(a, b);
  bool before = matmul_allows_tf32();
  set_matmul_allow_tf32(true);
  Tensor out = ops::matmul(a.to(Device::cuda()), b.to(Device::cuda()));
  set_matmul_allow_tf32(before);
  double error = testing::relative_rms_error(out.to(Device::cpu()), ref);
  EXPECT_LE(error, 5e-3);  // TF32: 10 mantissa bits per product
}

// act(x @ W^T + bias) fused in cuBLASLt against the CPU: matmul, bias, then the activation.
TEST(CudaMatmulEpilogue, BiasReluAndGeluMatchCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const int64_t m = 70, n = 48, k = 96;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (GemmEpilogue epilogue :
         {GemmEpilogue::kBias, GemmEpilogue::kReluBias, GemmEpilogue::kGeluBias}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " epilogue " + std::to_string(int(epilogue)));
      Tensor x = testing::random_tensor({2, m, k}, dtype, Device::cpu(), 21 + int(epilogue));
      Tensor w = testing::random_tensor({n, k}, dtype, Device::cpu(), 31 + int(epilogue));
      Tensor bias = testing::random_tensor({n}, dtype, Device::cpu(), 41 + int(epilogue));
      std::vector<double> product = ops::matmul(x.to(DType::F32), w.to(DType::F32), false, true)
                                        .to_vector<double>();
      std::vector<double> b = bias.to_vector<double>();
      std::vector<double> expected(product.size());
      for (size_t i = 0; i < product.size(); ++i) {
        double v = product[i] + b[i % size_t(n)];
        if (epilogue == GemmEpilogue::kReluBias) v = std::max(v, 0.0);
        if (epilogue == GemmEpilogue::kGeluBias) {
          v = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        }
        expected[i] = v;
      }
      Tensor out = Tensor::full({2, m, n}, NAN, dtype, Device::cuda());
      gemm_epilogue(x.to(Device::cuda()), w.to(Device::cuda()), bias.to(Device::cuda()), out,
                    false, true, epilogue);
      Tensor ref = Tensor::from_vector(expected, {2, m, n});
      EXPECT_LE(testing::relative_rms_error(out.to(Device::cpu()), ref),
                dtype == DType::F32 ? 1e-5 : 1e-2);
    }
  }
}

TEST(CudaMatmulEpilogue, WrongBiasShapeIsAOneLineError) {
  HAM_SKIP_UNLESS_CUDA();
  Tensor x = Tensor::zeros({4, 8}, DType::F32, Device::cuda());
  Tensor w = Tensor::zeros({6, 8}, DType::F32, Device::cuda());
  Tensor bias = Tensor::zeros({5}, DType::F32, Device::cuda());
  Tensor out = Tensor::empty({4, 6}, DType::F32, Device::cuda());
  testing::expect_error([&] { gemm_epilogue(x, w, bias, out, false, true, GemmEpilogue::kBias); },
                        {"matmul+epilogue", "bias must be [N]", "[4, 8]", "[6, 8]", "[5]"});
}

}  // namespace
}  // namespace ham::cuda
#endif  // HAM_WITH_CUDA

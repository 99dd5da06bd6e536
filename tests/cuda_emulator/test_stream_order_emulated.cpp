// The SIMT emulator's stream orders (HAM_EMULATOR_STREAMS): in the late order work on a
// created stream runs only once something must see it, so a reader that does not wait for
// a writer on another stream reads the old bytes, as it may on a GPU; default_late holds the
// default stream's work instead, so work forked onto a created stream without waiting for
// the default stream runs before it. Each test works out by hand what each read sees.
#include <gtest/gtest.h>

#include <cub/device/device_radix_sort.cuh>
#include <nccl.h>
#include <vector>

#include "core/tensor.h"
#include "core/address_sanitizer.h"
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/stream.h"
#include "tests/cuda_emulator/owned_stream.h"

namespace ham::cuda {
namespace {

using emulator::StreamOrder;

constexpr int kUnwritten = -1;  // fresh emulated memory is 0xff bytes

struct StreamOrderGuard {
  StreamOrder saved = emulator::stream_order();
  explicit StreamOrderGuard(StreamOrder order) { emulator::set_stream_order(order); }
  ~StreamOrderGuard() { emulator::set_stream_order(saved); }
};

struct DeviceInt {
  int* data = nullptr;
  DeviceInt() { HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), sizeof(int))); }
  ~DeviceInt() { cudaFree(data); }
  int read() const {  // on the legacy stream, which waits for no non-blocking stream
    // (a host-blocking copy: in default_late it runs the default stream's held work first)
    int value = 0;
    HAM_CUDA_CHECK(cudaMemcpy(&value, data, sizeof value, cudaMemcpyDeviceToHost));
    return value;
  }
  // What is there now, read by the host from the emulator's memory: no stream work, so the
  // racecheck (on in this binary) does not see it. A copy that raced with held work would
  // be reported, rightly.
  int peek() const { return *data; }
};

__global__ void store_value(int* out, int value) { *out = value; }
__global__ void copy_value(const int* in, int* out) { *out = *in; }
__global__ void trap_now() { __trap(); }

void store(cudaStream_t stream, const DeviceInt& out, int value) {
  HAM_LAUNCH(1, 1, 0, stream, store_value)(out.data, value);
  HAM_CUDA_CHECK_LAUNCH();
}

TEST(SimtEmulatorStreams, InOrderRunsWorkWhenIssued) {
  StreamOrderGuard order(StreamOrder::InOrder);
  OwnedStream stream;
  DeviceInt value;
  store(stream.handle, value, 7);
  EXPECT_EQ(value.read(), 7);
  EXPECT_EQ(cudaStreamQuery(stream.handle), cudaSuccess);
}

TEST(SimtEmulatorStreams, LateOrderHoldsAStreamsWorkUntilSomethingWaitsForIt) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream stream;
  OwnedEvent stored;
  DeviceInt value;
  store(stream.handle, value, 7);
  HAM_CUDA_CHECK(cudaEventRecord(stored.handle, stream.handle));
  EXPECT_EQ(value.read(), kUnwritten) << "the legacy stream waited for a non-blocking one";
  EXPECT_EQ(cudaStreamQuery(stream.handle), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(stored.handle), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not ready is an answer, not an error";
  HAM_CUDA_CHECK(cudaEventSynchronize(stored.handle));
  EXPECT_EQ(cudaEventQuery(stored.handle), cudaSuccess);
  EXPECT_EQ(value.read(), 7);
  EXPECT_EQ(cudaStreamQuery(stream.handle), cudaSuccess);
}

TEST(SimtEmulatorStreams, TheLegacyStreamWaitingForAnEventRunsOnlyTheWorkBeforeIt) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream stream;
  OwnedEvent first_done;
  DeviceInt first, second;
  store(stream.handle, first, 1);
  HAM_CUDA_CHECK(cudaEventRecord(first_done.handle, stream.handle));
  store(stream.handle, second, 2);
  HAM_CUDA_CHECK(cudaStreamWaitEvent(nullptr, first_done.handle, 0));
  EXPECT_EQ(first.read(), 1);
  EXPECT_EQ(second.read(), kUnwritten);
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream.handle));
  EXPECT_EQ(second.read(), 2);
}

TEST(SimtEmulatorStreams, AStreamWaitingForAnotherRunsItsWorkWhenItGetsThere) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream producer, consumer;
  OwnedEvent produced;
  DeviceInt made, copied, unwaited_copy;
  store(producer.handle, made, 5);
  HAM_CUDA_CHECK(cudaEventRecord(produced.handle, producer.handle));
  HAM_LAUNCH(1, 1, 0, consumer.handle, copy_value)(made.data, unwaited_copy.data);
  HAM_CUDA_CHECK(cudaStreamWaitEvent(consumer.handle, produced.handle, 0));
  HAM_CUDA_CHECK(cudaMemcpyAsync(copied.data, made.data, sizeof(int), cudaMemcpyDeviceToDevice,
                                 consumer.handle));
  EXPECT_EQ(made.read(), kUnwritten);
  HAM_CUDA_CHECK(cudaStreamSynchronize(consumer.handle));
  EXPECT_EQ(copied.read(), 5);
  EXPECT_EQ(unwaited_copy.read(), kUnwritten) << "a copy issued before the wait saw the write";
  EXPECT_EQ(cudaStreamQuery(producer.handle), cudaSuccess);
}

TEST(SimtEmulatorStreams, AnEventRecordedAgainLeavesEarlierWaitersOnTheEarlierWork) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream stream;
  OwnedEvent mark;
  DeviceInt first, second;
  store(stream.handle, first, 1);
  HAM_CUDA_CHECK(cudaEventRecord(mark.handle, stream.handle));
  HAM_CUDA_CHECK(cudaStreamWaitEvent(nullptr, mark.handle, 0));
  store(stream.handle, second, 2);
  HAM_CUDA_CHECK(cudaEventRecord(mark.handle, stream.handle));
  EXPECT_EQ(first.read(), 1);
  EXPECT_EQ(second.read(), kUnwritten);
  EXPECT_EQ(cudaEventQuery(mark.handle), cudaErrorNotReady);
  HAM_CUDA_CHECK(cudaStreamWaitEvent(nullptr, mark.handle, 0));
  EXPECT_EQ(second.read(), 2);
}

TEST(SimtEmulatorStreams, TheLegacyStreamWaitsForBlockingStreams) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream blocking(cudaStreamDefault);
  DeviceInt value, copied;
  HAM_CUDA_CHECK(cudaMemsetAsync(value.data, 0, sizeof(int), blocking.handle));
  HAM_LAUNCH(1, 1, 0, nullptr, copy_value)(value.data, copied.data);
  HAM_CUDA_CHECK_LAUNCH();
  EXPECT_EQ(copied.read(), 0);
}

TEST(SimtEmulatorStreams, CopiesFromOrToHostMemoryRunAtTheCallAfterTheStreamsWork) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream stream;
  DeviceInt value, later;
  int host = 3;
  store(stream.handle, value, 9);
  int read_back = 0;
  HAM_CUDA_CHECK(cudaMemcpyAsync(&read_back, value.data, sizeof(int), cudaMemcpyDeviceToHost,
                                 stream.handle));
  EXPECT_EQ(read_back, 9);
  HAM_CUDA_CHECK(cudaMemcpyAsync(later.data, &host, sizeof(int), cudaMemcpyHostToDevice,
                                 stream.handle));
  host = 4;  // the copy took its bytes at the call
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream.handle));
  EXPECT_EQ(later.read(), 3);
}

TEST(SimtEmulatorStreams, DeviceSynchronizeAndDestroyingAStreamRunItsWork) {
  StreamOrderGuard order(StreamOrder::Late);
  DeviceInt synced, destroyed;
  OwnedStream stream;
  store(stream.handle, synced, 1);
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(synced.read(), 1);
  {
    OwnedStream short_lived;
    store(short_lived.handle, destroyed, 2);
  }
  EXPECT_EQ(destroyed.read(), 2);
}

TEST(SimtEmulatorStreams, TimingAnUnfinishedEventIsNotReady) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream stream;
  OwnedEvent start(cudaEventDefault), stop(cudaEventDefault);
  DeviceInt value;
  HAM_CUDA_CHECK(cudaEventRecord(start.handle, stream.handle));
  store(stream.handle, value, 1);
  HAM_CUDA_CHECK(cudaEventRecord(stop.handle, stream.handle));
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start.handle, stop.handle), cudaErrorNotReady);
  HAM_CUDA_CHECK(cudaEventSynchronize(stop.handle));
  HAM_CUDA_CHECK(cudaEventElapsedTime(&ms, start.handle, stop.handle));
  EXPECT_GE(ms, 0.f);
}

TEST(SimtEmulatorStreams, HeldWorkThatFailsIsReportedByTheCallThatRunsIt) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream stream;
  HAM_LAUNCH(1, 1, 0, stream.handle, trap_now)();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the launch itself was well formed";
  EXPECT_EQ(cudaStreamSynchronize(stream.handle), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

TEST(SimtEmulatorStreams, LibraryCallsRunOnTheirStream) {
  StreamOrderGuard order(StreamOrder::Late);
  OwnedStream stream;
  const std::vector<int> keys = {3, 1, 2}, values = {30, 10, 20};
  int *buffers = nullptr, *scratch = nullptr;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&buffers), 12 * sizeof(int)));
  HAM_CUDA_CHECK(cudaMemcpy(buffers, keys.data(), 3 * sizeof(int), cudaMemcpyHostToDevice));
  HAM_CUDA_CHECK(cudaMemcpy(buffers + 3, values.data(), 3 * sizeof(int), cudaMemcpyHostToDevice));
  size_t scratch_bytes = 0;
  HAM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratch_bytes, buffers, buffers + 6,
                                                 buffers + 3, buffers + 9, 3));
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch), scratch_bytes));
  HAM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, scratch_bytes, buffers, buffers + 6,
                                                 buffers + 3, buffers + 9, 3, 0, 32,
                                                 stream.handle));
  std::vector<int> sorted(6);
  HAM_CUDA_CHECK(cudaMemcpy(sorted.data(), buffers + 6, 6 * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(sorted, std::vector<int>(6, kUnwritten));
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream.handle));
  HAM_CUDA_CHECK(cudaMemcpy(sorted.data(), buffers + 6, 6 * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(sorted, (std::vector<int>{1, 2, 3, 10, 20, 30}));
  cudaFree(scratch);
  cudaFree(buffers);
}

TEST(SimtEmulatorStreams, DefaultLateHoldsTheDefaultStreamsWorkUntilSomethingWaitsForIt) {
  StreamOrderGuard order(StreamOrder::DefaultLate);
  OwnedStream forked;
  DeviceInt value, copied;
  store(nullptr, value, 7);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);
  HAM_LAUNCH(1, 1, 0, forked.handle, copy_value)(value.data, copied.data);  // runs now
  HAM_CUDA_CHECK_LAUNCH();
  EXPECT_EQ(cudaStreamQuery(forked.handle), cudaSuccess);
  EXPECT_EQ(value.read(), 7);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaSuccess);
  EXPECT_EQ(copied.read(), kUnwritten) << "the forked copy waited for the default stream";
}

TEST(SimtEmulatorStreams, DefaultLateAStreamWaitingForTheDefaultStreamRunsItsWorkFirst) {
  StreamOrderGuard order(StreamOrder::DefaultLate);
  OwnedStream forked;
  OwnedEvent forked_here;
  DeviceInt value, copied, later;
  store(nullptr, value, 5);
  HAM_CUDA_CHECK(cudaEventRecord(forked_here.handle, nullptr));
  store(nullptr, later, 6);
  HAM_CUDA_CHECK(cudaStreamWaitEvent(forked.handle, forked_here.handle, 0));
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady) << "the wait ran past its record";
  HAM_LAUNCH(1, 1, 0, forked.handle, copy_value)(value.data, copied.data);
  HAM_CUDA_CHECK_LAUNCH();
  EXPECT_EQ(copied.read(), 5);
  EXPECT_EQ(later.read(), 6);
}

TEST(SimtEmulatorStreams, DefaultLateBlockingStreamsWaitForTheDefaultStream) {
  StreamOrderGuard order(StreamOrder::DefaultLate);
  OwnedStream blocking(cudaStreamDefault);
  DeviceInt value, copied;
  store(nullptr, value, 3);
  HAM_LAUNCH(1, 1, 0, blocking.handle, copy_value)(value.data, copied.data);
  HAM_CUDA_CHECK_LAUNCH();
  EXPECT_EQ(copied.read(), 3);
}

TEST(SimtEmulatorStreams, FreeingMemoryRunsTheHeldWorkFirst) {
  for (StreamOrder held : {StreamOrder::Late, StreamOrder::DefaultLate}) {
    StreamOrderGuard order(held);
    OwnedStream stream;
    DeviceInt value;
    auto* freed = new DeviceInt;
    store(stream.handle, value, 1);
    store(nullptr, value, 2);
    delete freed;  // cudaFree
    EXPECT_EQ(cudaStreamQuery(stream.handle), cudaSuccess);
    EXPECT_EQ(cudaStreamQuery(nullptr), cudaSuccess);
  }
}

// The NCCL stand-in exchanges at the call, after its stream's held work (its input), and
// writes the result in its stream's order: a reader that does not wait for the collective's
// end reads the output's old bytes.
TEST(SimtEmulatorStreams, ACollectiveReadsAfterItsStreamsWorkAndLandsInItsOrder) {
  StreamOrderGuard order(StreamOrder::Late);
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  OwnedStream stream;
  OwnedEvent reduced;
  DeviceInt input, output;
  store(stream.handle, input, 5);  // held until the collective's stream gets to it
  ASSERT_EQ(ncclAllReduce(input.data, output.data, 1, ncclInt32, ncclSum, comm, stream.handle),
            ncclSuccess);
  HAM_CUDA_CHECK(cudaEventRecord(reduced.handle, stream.handle));
  EXPECT_EQ(input.read(), 5) << "the collective ran before its stream's earlier work";
  EXPECT_EQ(output.peek(), kUnwritten) << "the result landed before its stream got there";
  HAM_CUDA_CHECK(cudaStreamWaitEvent(nullptr, reduced.handle, 0));
  EXPECT_EQ(output.read(), 5);
  DeviceInt gathered;
  ASSERT_EQ(ncclAllGather(input.data, gathered.data, 1, ncclInt32, comm, stream.handle),
            ncclSuccess);
  EXPECT_EQ(gathered.peek(), kUnwritten);
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream.handle));
  EXPECT_EQ(gathered.read(), 5);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Under AddressSanitizer the caching allocator poisons a freed tensor's bytes; in a held
// order it does so in the stream's order, after the kernels issued before the free, which
// may still write them (as on a GPU, where the next allocation from that stream's pool
// comes after them too).
TEST(SimtEmulatorStreams, AFreedTensorIsPoisonedAfterTheWorkIssuedBeforeItsFree) {
#if HAM_ADDRESS_SANITIZER
  for (StreamOrder held : {StreamOrder::Late, StreamOrder::DefaultLate}) {
    StreamOrderGuard order(held);
    OwnedStream created;
    StreamGuard current(0, held == StreamOrder::Late ? created.handle : nullptr);
    int* freed = nullptr;
    {
      Tensor tensor = Tensor::empty({64}, DType::I32, Device::cuda());
      freed = static_cast<int*>(tensor.raw_data());
      HAM_LAUNCH(1, 1, 0, current_stream(0), store_value)(freed, 1);
    }
    EXPECT_FALSE(__asan_address_is_poisoned(freed)) << "poisoned before the kernel ran";
    HAM_CUDA_CHECK(cudaStreamSynchronize(current_stream(0)));  // the kernel, then the poison
    EXPECT_TRUE(__asan_address_is_poisoned(freed));
  }
#else
  GTEST_SKIP() << "built without AddressSanitizer (scripts/sanitize.sh builds with it)";
#endif
}

}  // namespace
}  // namespace ham::cuda

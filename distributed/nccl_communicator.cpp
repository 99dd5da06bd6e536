// NCCL collectives on CUDA tensors, registered with ham_distributed when this library
// (ham_nccl) is linked. On the project's CI, which has no GPU, it runs on the SIMT
// emulator against an NCCL stand-in over MPI (ham_nccl_emulated, cuda/emulator/nccl.cpp).
#include "distributed/nccl_communicator.h"

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "cuda/check.h"
#include "distributed/watchdog.h"

#define HAM_NCCL_CHECK(call, context)                                                    \
  do {                                                                                   \
    ncclResult_t ham_nccl_status_ = (call);                                              \
    if (ham_nccl_status_ != ncclSuccess) {                                               \
      HAM_FAIL(__FILE__, ":", __LINE__, ": ", #call, " (", context, ") failed: ",        \
               ncclGetErrorString(ham_nccl_status_), " (", ncclGetLastError(nullptr), ")"); \
    }                                                                                    \
  } while (0)

namespace ham::dist {

namespace {

std::string unavailable_reason() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return std::string("no CUDA device: ") + cudaGetErrorString(status);
  }
  if (count == 0) return "no CUDA device: the driver reports 0 GPUs";
  return "";
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  HAM_FAIL("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  HAM_FAIL("nccl: unknown reduce op");
}

// The stream ham's kernels and copies run on.
cudaStream_t compute_stream() { return cudaStreamLegacy; }

// In-flight collectives, oldest first, watched by a thread: one unfinished past the
// timeout, or an asynchronous NCCL error, aborts the communicator and ends the process.
class NcclWatchdog {
 public:
  NcclWatchdog(ncclComm_t comm, int device, int world_rank, double timeout_s)
      : comm_(comm), device_(device), world_rank_(world_rank), timeout_s_(timeout_s) {
    thread_ = std::thread([this] { run(); });
  }
  ~NcclWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    for (auto& op : in_flight_) cudaEventDestroy(op.done);
  }
  // Takes ownership of `done`.
  void watch(cudaEvent_t done, std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back({done, std::move(what), std::chrono::steady_clock::now()});
  }

 private:
  struct InFlight {
    cudaEvent_t done;
    std::string what;
    std::chrono::steady_clock::time_point started;
  };
  void run() {
    cudaSetDevice(device_);
    auto poll = std::chrono::duration<double>(std::min(std::max(timeout_s_ / 20, 0.01), 1.0));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, poll);
      ncclResult_t async_error = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async_error) != ncclSuccess || async_error != ncclSuccess) {
        fail(std::string("NCCL reported an asynchronous error: ") +
             ncclGetErrorString(async_error));
      }
      while (!in_flight_.empty()) {
        InFlight& oldest = in_flight_.front();
        cudaError_t status = cudaEventQuery(oldest.done);
        if (status == cudaSuccess) {
          cudaEventDestroy(oldest.done);
          in_flight_.pop_front();
          continue;
        }
        if (status != cudaErrorNotReady) {
          fail(oldest.what + " failed on the device: " + cudaGetErrorString(status));
        }
        std::chrono::duration<double> waited = std::chrono::steady_clock::now() - oldest.started;
        if (waited.count() > timeout_s_) {
          fail(oldest.what + " did not complete within " + std::to_string(timeout_s_) +
               " s; a peer rank has probably died or hung (HAM_COLLECTIVE_TIMEOUT_S sets "
               "the limit)");
        }
        break;
      }
    }
  }
  [[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "rank %d: %s\n", world_rank_, why.c_str());
    std::fflush(stderr);
    ncclCommAbort(comm_);  // frees peers blocked on this communicator's kernels
    std::_Exit(kWatchdogExitCode);
  }

  ncclComm_t comm_;
  int device_, world_rank_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::deque<InFlight> in_flight_;
  std::thread thread_;
};

class NcclPending final : public PendingCollective {
 public:
  NcclPending(cudaEvent_t done, int device, Tensor a, Tensor b)
      : done_(done), device_(device), keep_alive_a_(std::move(a)), keep_alive_b_(std::move(b)) {}
  ~NcclPending() override {
    if (!waited_) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "nccl: %s\n", e.what());
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
    cudaEventDestroy(done_);
  }
  // Orders the compute stream after the collective; the host does not block.
  void wait() override {
    if (waited_) return;
    waited_ = true;
    HAM_CUDA_CHECK(cudaSetDevice(device_));
    HAM_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), done_, 0));
  }

 private:
  cudaEvent_t done_;
  int device_;
  Tensor keep_alive_a_, keep_alive_b_;  // freed only once the compute stream waits
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`: rank 0 makes the unique id, everyone receives it.
  NcclCommunicator(Communicator& bootstrap, int device_index, double timeout_s)
      : rank_(bootstrap.rank()), size_(bootstrap.size()), local_rank_(bootstrap.local_rank()),
        local_size_(bootstrap.local_size()), device_(device_index),
        name_("nccl:" + bootstrap.name()), timeout_s_(timeout_s) {
    std::string reason = unavailable_reason();
    HAM_CHECK(reason.empty(), "NCCL communicator on ", bootstrap.name(), ": ", reason);
    int devices = 0;
    HAM_CUDA_CHECK(cudaGetDeviceCount(&devices));
    HAM_CHECK(device_ < devices, "NCCL communicator on ", bootstrap.name(), ": rank ", rank_,
              " (local rank ", local_rank_, ") wants cuda:", device_, " but ", devices,
              " GPU(s) are visible; start at most one rank per GPU on each node");
    HAM_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (rank_ == 0) HAM_NCCL_CHECK(ncclGetUniqueId(&id), name_);
    Tensor id_bytes = Tensor::empty({int64_t(sizeof id)}, DType::U8);
    std::memcpy(id_bytes.raw_data(), &id, sizeof id);
    bootstrap.broadcast(id_bytes, 0);
    std::memcpy(&id, id_bytes.raw_data(), sizeof id);
    HAM_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), name_);
    finish_setup();
  }
  // A communicator from ncclCommSplit.
  NcclCommunicator(ncclComm_t comm, int local_rank, int local_size, int device,
                   std::string name, double timeout_s)
      : comm_(comm), local_rank_(local_rank), local_size_(local_size), device_(device),
        name_(std::move(name)), timeout_s_(timeout_s) {
    HAM_NCCL_CHECK(ncclCommUserRank(comm_, &rank_), name_);
    HAM_NCCL_CHECK(ncclCommCount(comm_, &size_), name_);
    finish_setup();
  }

  ~NcclCommunicator() override {
    watchdog_.reset();
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    ncclResult_t status = ncclCommDestroy(comm_);
    if (status != ncclSuccess) {
      std::fprintf(stderr, "%s: ncclCommDestroy failed: %s\n", name_.c_str(),
                   ncclGetErrorString(status));
    }
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return name_; }

  std::unique_ptr<PendingCollective> all_reduce_async(const Tensor& tensor,
                                                      ReduceOp op) override {
    check_all_reduce_args(*this, tensor, op);
    check_device("all_reduce", tensor);
    std::string what = describe("all_reduce", tensor);
    start();
    HAM_NCCL_CHECK(ncclAllReduce(tensor.raw_data(), tensor.raw_data(), size_t(tensor.numel()),
                                 nccl_type(tensor.dtype()), nccl_op(op), comm_, stream_),
                   what);
    return finish(what, tensor, Tensor());
  }

  std::unique_ptr<PendingCollective> reduce_scatter_async(const Tensor& input,
                                                          const Tensor& output,
                                                          ReduceOp op) override {
    check_reduce_scatter_args(*this, input, output, op);
    check_device("reduce_scatter", input);
    std::string what = describe("reduce_scatter", input);
    start();
    HAM_NCCL_CHECK(ncclReduceScatter(input.raw_data(), output.raw_data(), size_t(output.numel()),
                                     nccl_type(input.dtype()), nccl_op(op), comm_, stream_),
                   what);
    return finish(what, input, output);
  }

  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& input,
                                                      const Tensor& output) override {
    check_all_gather_args(*this, input, output);
    check_device("all_gather", input);
    std::string what = describe("all_gather", input);
    start();
    // In place when input is this rank's chunk of output (NCCL's own convention).
    HAM_NCCL_CHECK(ncclAllGather(input.raw_data(), output.raw_data(), size_t(input.numel()),
                                 nccl_type(input.dtype()), comm_, stream_),
                   what);
    return finish(what, input, output);
  }

  void broadcast(const Tensor& tensor, int root) override {
    check_broadcast_args(*this, tensor, root);
    check_device("broadcast", tensor);
    std::string what = describe("broadcast", tensor);
    start();
    HAM_NCCL_CHECK(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), size_t(tensor.numel()),
                                 nccl_type(tensor.dtype()), root, comm_, stream_),
                   what);
    finish(what, tensor, Tensor())->wait();
  }

  // A one-element all-reduce, waited on by the host.
  void barrier() override {
    Tensor token = Tensor::zeros({1}, DType::F32, Device::cuda(device_));
    all_reduce_async(token, ReduceOp::Sum)->wait();
    HAM_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    HAM_CHECK(color >= 0, "split on ", name_, ": color must be >= 0, got ", color);
    HAM_CUDA_CHECK(cudaSetDevice(device_));
    ncclComm_t sub = nullptr;
    HAM_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr), name_);
    return std::make_shared<NcclCommunicator>(sub, local_rank_, local_size_, device_,
                                              name_ + "/split(" + std::to_string(color) + ")",
                                              timeout_s_);
  }

  [[noreturn]] void abort_job(const std::string& what, int exit_code) override {
    std::fprintf(stderr, "rank %d failed: %s\n", rank_, what.c_str());
    std::fflush(stderr);
    ncclCommAbort(comm_);
    std::_Exit(exit_code);
  }

 private:
  void finish_setup() {
    HAM_CUDA_CHECK(cudaSetDevice(device_));
    HAM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    watchdog_ = std::make_unique<NcclWatchdog>(comm_, device_, rank_, timeout_s_);
  }
  void check_device(const char* op, const Tensor& t) const {
    HAM_CHECK(t.device() == Device::cuda(device_), op, " on ", name_, ": NCCL here takes cuda:",
              device_, " tensors, got ", t.str());
  }
  std::string describe(const char* op, const Tensor& t) const {
    return std::string(op) + " of " + t.str() + " on " + name_;
  }
  // The collective's stream waits for the compute stream's work so far.
  void start() {
    HAM_CUDA_CHECK(cudaSetDevice(device_));
    cudaEvent_t ready;
    HAM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    HAM_CUDA_CHECK(cudaEventRecord(ready, compute_stream()));
    HAM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    HAM_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait is satisfied
  }
  std::unique_ptr<PendingCollective> finish(const std::string& what, const Tensor& a,
                                            const Tensor& b) {
    cudaEvent_t done, watched;
    HAM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    HAM_CUDA_CHECK(cudaEventCreateWithFlags(&watched, cudaEventDisableTiming));
    HAM_CUDA_CHECK(cudaEventRecord(done, stream_));
    HAM_CUDA_CHECK(cudaEventRecord(watched, stream_));
    watchdog_->watch(watched, what);
    return std::make_unique<NcclPending>(done, device_, a, b);
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, device_ = 0;
  std::string name_;
  double timeout_s_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<NcclWatchdog> watchdog_;
};

std::shared_ptr<Communicator> make(Communicator& bootstrap, int device_index,
                                   double collective_timeout_s) {
  return std::make_shared<NcclCommunicator>(bootstrap, device_index, collective_timeout_s);
}

const bool registered = [] {
  register_nccl_backend({&unavailable_reason, &make});
  return true;
}();

}  // namespace

}  // namespace ham::dist

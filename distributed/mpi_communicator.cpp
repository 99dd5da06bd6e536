#include "distributed/mpi_communicator.h"

#ifndef HAM_WITH_MPI

#include "core/error.h"

namespace ham::dist {
bool built_with_mpi() { return false; }
std::shared_ptr<Communicator> make_mpi_world_communicator(double) {
  HAM_FAIL("MPI world communicator: this build has no MPI");
}
}  // namespace ham::dist

#else

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "core/ops/elementwise.h"
#include "distributed/watchdog.h"

namespace ham::dist {

bool built_with_mpi() { return true; }

namespace {

int world_rank_or_minus_one() {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, size_t(length));
}

// Throws "rank R: <call> (<context>) failed: <MPI's message>".
void check_mpi(int code, const char* call, const std::string& context) {
  if (code == MPI_SUCCESS) return;
  HAM_FAIL("rank ", world_rank_or_minus_one(), ": ", call, " (", context,
           ") failed: ", mpi_error_text(code));
}

#define HAM_MPI_CHECK(call, context) check_mpi((call), #call, (context))

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  int code = MPI_Finalize();
  if (code != MPI_SUCCESS) {
    std::fprintf(stderr, "MPI_Finalize failed: %s\n", mpi_error_text(code).c_str());
  }
}

// MPI may be initialised once per process: the first world communicator does it.
void initialize_mpi_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0, finalized = 0;
    HAM_MPI_CHECK(MPI_Initialized(&initialized), "startup");
    HAM_MPI_CHECK(MPI_Finalized(&finalized), "startup");
    HAM_CHECK(!finalized, "MPI world communicator: MPI was already finalised in this process");
    if (!initialized) {
      int provided = 0;
      HAM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
                    "startup");
      HAM_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI_Init_thread: asked for "
                "MPI_THREAD_FUNNELED, the library provides only level ", provided);
      std::atexit(finalize_mpi_at_exit);
    }
    HAM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "world");
  });
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// The MPI type a dtype travels as. bf16 moves as 16-bit words (no MPI reduction for it).
MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
  }
  HAM_FAIL("mpi: unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;  // avg = sum, then / size on completion
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
  }
  HAM_FAIL("mpi: unknown reduce op");
}

int mpi_count(const char* op, const std::string& comm, int64_t numel) {
  HAM_CHECK(numel <= INT_MAX, op, " on ", comm, ": ", numel,
            " elements exceed MPI's int count (split the tensor)");
  return int(numel);
}

// "f32[2, 3]": what a watchdog or error line says about a tensor.
std::string summary(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }

bool overlaps(const Tensor& a, const Tensor& b) {
  auto* a0 = static_cast<const char*>(a.raw_data());
  auto* b0 = static_cast<const char*>(b.raw_data());
  return a.nbytes() && b.nbytes() && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

class MpiPending final : public PendingCollective {
 public:
  MpiPending(MPI_Request request, std::string what, std::shared_ptr<CollectiveWatchdog> watchdog,
             Tensor keep_alive_a, Tensor keep_alive_b, Tensor scale_target, double scale)
      : request_(request), what_(std::move(what)), watchdog_(std::move(watchdog)),
        keep_alive_a_(std::move(keep_alive_a)), keep_alive_b_(std::move(keep_alive_b)),
        scale_target_(std::move(scale_target)), scale_(scale) {}

  ~MpiPending() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      // An unfinished request must not outlive its buffers: end the job loudly.
      std::fprintf(stderr, "rank %d failed: %s\n", world_rank_or_minus_one(), e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      std::_Exit(1);
    }
  }

  void wait() override {
    if (done_) return;
    done_ = true;
    {
      CollectiveWatchdog::Scope armed(*watchdog_, what_);
      HAM_MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE), what_);
    }
    if (scale_target_.defined()) ops::scale_(scale_target_, scale_);
  }

 private:
  MPI_Request request_;
  std::string what_;
  std::shared_ptr<CollectiveWatchdog> watchdog_;
  Tensor keep_alive_a_, keep_alive_b_;
  Tensor scale_target_;  // avg: divided by the size once the sum has arrived
  double scale_ = 1;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owns_comm, std::string name, int local_rank,
                  int local_size, std::shared_ptr<CollectiveWatchdog> watchdog)
      : comm_(comm), owns_comm_(owns_comm), name_(std::move(name)), local_rank_(local_rank),
        local_size_(local_size), watchdog_(std::move(watchdog)) {
    HAM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), name_);
    HAM_MPI_CHECK(MPI_Comm_size(comm_, &size_), name_);
  }

  ~MpiCommunicator() override {
    if (!owns_comm_ || mpi_finalized()) return;
    int code = MPI_Comm_free(&comm_);
    if (code != MPI_SUCCESS) {
      std::fprintf(stderr, "rank %d: MPI_Comm_free (%s) failed: %s\n", world_rank_or_minus_one(),
                   name_.c_str(), mpi_error_text(code).c_str());
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return name_; }

  std::unique_ptr<PendingCollective> all_reduce_async(const Tensor& tensor,
                                                      ReduceOp op) override {
    check_all_reduce_args(*this, tensor, op);
    check_cpu("all_reduce", tensor);
    check_reducible_here("all_reduce", tensor);
    std::string what = describe("all_reduce", op, tensor);
    MPI_Request request;
    HAM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, tensor.raw_data(),
                                 mpi_count("all_reduce", name_, tensor.numel()),
                                 mpi_type(tensor.dtype()), mpi_op(op), comm_, &request),
                  what);
    return pending(request, what, tensor, Tensor(), op == ReduceOp::Avg ? tensor : Tensor());
  }

  std::unique_ptr<PendingCollective> reduce_scatter_async(const Tensor& input,
                                                          const Tensor& output,
                                                          ReduceOp op) override {
    check_reduce_scatter_args(*this, input, output, op);
    check_cpu("reduce_scatter", input);
    check_reducible_here("reduce_scatter", input);
    HAM_CHECK(!overlaps(input, output), "reduce_scatter on ", name_, ": input ", input.str(),
              " and output ", output.str(), " share memory");
    std::string what = describe("reduce_scatter", op, input);
    MPI_Request request;
    HAM_MPI_CHECK(MPI_Ireduce_scatter_block(input.raw_data(), output.raw_data(),
                                            mpi_count("reduce_scatter", name_, output.numel()),
                                            mpi_type(input.dtype()), mpi_op(op), comm_,
                                            &request),
                  what);
    return pending(request, what, input, output, op == ReduceOp::Avg ? output : Tensor());
  }

  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& input,
                                                      const Tensor& output) override {
    check_all_gather_args(*this, input, output);
    check_cpu("all_gather", input);
    std::string what = describe("all_gather", std::nullopt, input);
    int count = mpi_count("all_gather", name_, input.numel());
    // In place when the input is this rank's chunk of the output.
    const char* own_chunk =
        static_cast<const char*>(output.raw_data()) + size_t(rank_) * input.nbytes();
    bool in_place = input.raw_data() == own_chunk;
    HAM_CHECK(in_place || !overlaps(input, output), "all_gather on ", name_, ": input ",
              input.str(), " overlaps output ", output.str(),
              " other than as this rank's chunk");
    MPI_Request request;
    HAM_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : input.raw_data(), count,
                                 mpi_type(input.dtype()), output.raw_data(), count,
                                 mpi_type(input.dtype()), comm_, &request),
                  what);
    return pending(request, what, input, output, Tensor());
  }

  void broadcast(const Tensor& tensor, int root) override {
    check_broadcast_args(*this, tensor, root);
    check_cpu("broadcast", tensor);
    std::string what = "broadcast of " + summary(tensor) + " from rank " + std::to_string(root) +
                       " on " + name_;
    CollectiveWatchdog::Scope armed(*watchdog_, what);
    HAM_MPI_CHECK(MPI_Bcast(tensor.raw_data(), mpi_count("broadcast", name_, tensor.numel()),
                            mpi_type(tensor.dtype()), root, comm_),
                  what);
  }

  void barrier() override {
    std::string what = "barrier on " + name_;
    CollectiveWatchdog::Scope armed(*watchdog_, what);
    HAM_MPI_CHECK(MPI_Barrier(comm_), what);
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    HAM_CHECK(color >= 0, "split on ", name_, ": color must be >= 0, got ", color);
    std::string what = "split of " + name_;
    MPI_Comm sub;
    {
      CollectiveWatchdog::Scope armed(*watchdog_, what);
      HAM_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub), what);
    }
    HAM_MPI_CHECK(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN), what);
    return std::make_shared<MpiCommunicator>(sub, true,
                                             name_ + "/split(" + std::to_string(color) + ")",
                                             local_rank_, local_size_, watchdog_);
  }

  [[noreturn]] void abort_job(const std::string& what, int exit_code) override {
    std::fprintf(stderr, "rank %d failed: %s\n", world_rank_or_minus_one(), what.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; if it did, still end the rank
  }

 private:
  void check_cpu(const char* op, const Tensor& t) const {
    HAM_CHECK(t.device().is_cpu(), op, " on ", name_, ": MPI takes cpu tensors, got ", t.str(),
              " (CUDA tensors go through NCCL: WorldOptions::use_nccl)");
  }
  void check_reducible_here(const char* op, const Tensor& t) const {
    HAM_CHECK(t.dtype() != DType::BF16, op, " on ", name_,
              ": MPI has no bf16 reduction; reduce in f32 (got ", t.str(), ")");
  }
  std::string describe(const char* op, std::optional<ReduceOp> rop, const Tensor& t) const {
    std::string what = std::string(op);
    if (rop) what += std::string("(") + reduce_op_name(*rop) + ")";
    return what + " of " + summary(t) + " on " + name_;
  }
  std::unique_ptr<PendingCollective> pending(MPI_Request request, const std::string& what,
                                             const Tensor& a, const Tensor& b,
                                             const Tensor& average_target) {
    return std::make_unique<MpiPending>(request, what, watchdog_, a, b, average_target,
                                        1.0 / double(size_));
  }

  MPI_Comm comm_;
  bool owns_comm_;
  std::string name_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::shared_ptr<CollectiveWatchdog> watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_world_communicator(double collective_timeout_s) {
  initialize_mpi_once();
  int rank = 0;
  HAM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "world");
  // The ranks sharing this node's memory give the local rank (which GPU to use).
  MPI_Comm node;
  HAM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                    &node),
                "world: ranks of this node");
  int local_rank = 0, local_size = 1;
  HAM_MPI_CHECK(MPI_Comm_rank(node, &local_rank), "world: ranks of this node");
  HAM_MPI_CHECK(MPI_Comm_size(node, &local_size), "world: ranks of this node");
  HAM_MPI_CHECK(MPI_Comm_free(&node), "world: ranks of this node");
  auto watchdog = std::make_shared<CollectiveWatchdog>(rank, collective_timeout_s);
  return std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, false, "world", local_rank,
                                           local_size, std::move(watchdog));
}

}  // namespace ham::dist

#endif  // HAM_WITH_MPI

#include "distributed/communicator.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "distributed/mpi_communicator.h"
#include "distributed/nccl_communicator.h"

namespace ham::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

double Communicator::all_reduce_scalar(double value, ReduceOp op) {
  Tensor t = Tensor::scalar(value, DType::F64);
  all_reduce(t, op);
  return t.item();
}

// ---- Argument checks ------------------------------------------------------------------

namespace {

void check_defined(const char* op, const Communicator& comm, const Tensor& t, const char* arg) {
  HAM_CHECK(t.defined(), op, " on ", comm.name(), ": ", arg, " is an undefined tensor");
}

void check_same_dtype_and_device(const char* op, const Communicator& comm, const Tensor& input,
                                 const Tensor& output) {
  HAM_CHECK(input.dtype() == output.dtype(), op, " on ", comm.name(), ": input ", input.str(),
            " and output ", output.str(), " differ in dtype");
  HAM_CHECK(input.device() == output.device(), op, " on ", comm.name(), ": input ",
            input.str(), " and output ", output.str(), " are on different devices");
}

void check_reducible(const char* op, const Communicator& comm, const Tensor& t, ReduceOp rop) {
  HAM_CHECK(rop != ReduceOp::Avg || is_floating(t.dtype()), op, " on ", comm.name(),
            ": avg needs a floating dtype, got ", t.str());
}

}  // namespace

void check_all_reduce_args(const Communicator& comm, const Tensor& tensor, ReduceOp op) {
  check_defined("all_reduce", comm, tensor, "tensor");
  check_reducible("all_reduce", comm, tensor, op);
}

void check_reduce_scatter_args(const Communicator& comm, const Tensor& input,
                               const Tensor& output, ReduceOp op) {
  check_defined("reduce_scatter", comm, input, "input");
  check_defined("reduce_scatter", comm, output, "output");
  check_same_dtype_and_device("reduce_scatter", comm, input, output);
  check_reducible("reduce_scatter", comm, input, op);
  HAM_CHECK(input.numel() == int64_t(comm.size()) * output.numel(), "reduce_scatter on ",
            comm.name(), ": input ", input.str(), " must hold size (", comm.size(),
            ") x output ", output.str(), " elements");
}

void check_all_gather_args(const Communicator& comm, const Tensor& input, const Tensor& output) {
  check_defined("all_gather", comm, input, "input");
  check_defined("all_gather", comm, output, "output");
  check_same_dtype_and_device("all_gather", comm, input, output);
  HAM_CHECK(output.numel() == int64_t(comm.size()) * input.numel(), "all_gather on ",
            comm.name(), ": output ", output.str(), " must hold size (", comm.size(),
            ") x input ", input.str(), " elements");
}

void check_broadcast_args(const Communicator& comm, const Tensor& tensor, int root) {
  check_defined("broadcast", comm, tensor, "tensor");
  HAM_CHECK(0 <= root && root < comm.size(), "broadcast on ", comm.name(), ": root ", root,
            " is not a rank of a communicator of size ", comm.size());
}

// ---- World of one --------------------------------------------------------------------

std::unique_ptr<PendingCollective> SingleProcessCommunicator::all_reduce_async(
    const Tensor& tensor, ReduceOp op) {
  check_all_reduce_args(*this, tensor, op);
  return std::make_unique<CompletedCollective>();  // the reduction of one value is itself
}

std::unique_ptr<PendingCollective> SingleProcessCommunicator::reduce_scatter_async(
    const Tensor& input, const Tensor& output, ReduceOp op) {
  check_reduce_scatter_args(*this, input, output, op);
  Tensor destination = output.reshape(input.shape());
  destination.copy_(input);
  return std::make_unique<CompletedCollective>();
}

std::unique_ptr<PendingCollective> SingleProcessCommunicator::all_gather_async(
    const Tensor& input, const Tensor& output) {
  check_all_gather_args(*this, input, output);
  Tensor destination = output.reshape(input.shape());
  destination.copy_(input);
  return std::make_unique<CompletedCollective>();
}

void SingleProcessCommunicator::broadcast(const Tensor& tensor, int root) {
  check_broadcast_args(*this, tensor, root);
}

std::shared_ptr<Communicator> SingleProcessCommunicator::split(int color, int key) {
  HAM_CHECK(color >= 0, "split on ", name_, ": color must be >= 0, got ", color);
  return std::make_shared<SingleProcessCommunicator>(name_ + "/split(" + std::to_string(color) +
                                                     ")");
}

void SingleProcessCommunicator::abort_job(const std::string& what, int exit_code) {
  std::fprintf(stderr, "rank 0 failed: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(exit_code);
}

// ---- MPI for CPU tensors, NCCL for CUDA tensors ---------------------------------------

namespace {

class DeviceDispatchCommunicator final : public Communicator {
 public:
  DeviceDispatchCommunicator(std::shared_ptr<Communicator> cpu, std::shared_ptr<Communicator> cuda)
      : cpu_(std::move(cpu)), cuda_(std::move(cuda)) {}
  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }
  int local_rank() const override { return cpu_->local_rank(); }
  int local_size() const override { return cpu_->local_size(); }
  std::string name() const override { return cpu_->name(); }
  std::unique_ptr<PendingCollective> all_reduce_async(const Tensor& tensor, ReduceOp op) override {
    return route(tensor).all_reduce_async(tensor, op);
  }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const Tensor& input,
                                                          const Tensor& output,
                                                          ReduceOp op) override {
    return route(input).reduce_scatter_async(input, output, op);
  }
  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& input,
                                                      const Tensor& output) override {
    return route(input).all_gather_async(input, output);
  }
  void broadcast(const Tensor& tensor, int root) override { route(tensor).broadcast(tensor, root); }
  void barrier() override { cpu_->barrier(); }
  std::shared_ptr<Communicator> split(int color, int key) override {
    auto cpu = cpu_->split(color, key);
    auto cuda = cuda_->split(color, key);
    return std::make_shared<DeviceDispatchCommunicator>(std::move(cpu), std::move(cuda));
  }
  [[noreturn]] void abort_job(const std::string& what, int exit_code) override {
    cpu_->abort_job(what, exit_code);
    std::_Exit(exit_code);  // not reached: the virtual call's noreturn is not visible here
  }

 private:
  Communicator& route(const Tensor& t) {
    HAM_CHECK(t.defined(), "collective on ", name(), ": undefined tensor");
    return t.device().is_cuda() ? *cuda_ : *cpu_;
  }
  std::shared_ptr<Communicator> cpu_, cuda_;
};

}  // namespace

bool launched_by_mpi() {
  for (const char* variable :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(variable)) return true;
  }
  return false;
}

double resolve_collective_timeout(double requested_s) {
  if (requested_s > 0) return requested_s;
  const char* text = std::getenv("HAM_COLLECTIVE_TIMEOUT_S");
  if (!text) return 600.0;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  HAM_CHECK(end != text && *end == '\0' && value > 0,
            "HAM_COLLECTIVE_TIMEOUT_S='", text, "': expected a positive number of seconds");
  return value;
}

std::shared_ptr<Communicator> make_world_communicator(const WorldOptions& options) {
  double timeout_s = resolve_collective_timeout(options.collective_timeout_s);
  if (!launched_by_mpi()) {
    // A world of one; CUDA tensors need no NCCL here (collectives are copies).
    if (!options.use_nccl || !options.nccl_in_a_world_of_one) {
      return std::make_shared<SingleProcessCommunicator>();
    }
    HAM_CHECK(built_with_nccl(),
              "world communicator: NCCL was asked for but this build has no NCCL");
    auto cpu = std::make_shared<SingleProcessCommunicator>();
    auto nccl = make_nccl_communicator(*cpu, 0, timeout_s);
    return std::make_shared<DeviceDispatchCommunicator>(std::move(cpu), std::move(nccl));
  }
  HAM_CHECK(built_with_mpi(), "world communicator: started by an MPI launcher but this build "
                              "has no MPI (reconfigure with MPI installed)");
  std::shared_ptr<Communicator> mpi = make_mpi_world_communicator(timeout_s);
  if (!options.use_nccl) return mpi;
  std::shared_ptr<Communicator> nccl;
  try {
    nccl = make_nccl_communicator(*mpi, mpi->local_rank(), timeout_s);
  } catch (const std::exception& e) {
    // The other ranks wait in NCCL's set-up, which has no timeout: end the job.
    mpi->abort_job(e.what(), 1);
  }
  return std::make_shared<DeviceDispatchCommunicator>(std::move(mpi), std::move(nccl));
}

ShardingGroups make_sharding_groups(const std::shared_ptr<Communicator>& world,
                                    int shard_group_size) {
  const int world_size = world->size(), rank = world->rank();
  HAM_CHECK(shard_group_size >= 1 && world_size % shard_group_size == 0,
            "sharding groups on ", world->name(), ": shard group size ", shard_group_size,
            " must divide the world size ", world_size);
  if (shard_group_size == world->local_size() && shard_group_size < world_size) {
    // Shard within a node: the shard group must be exactly this node's ranks.
    bool misplaced = rank % shard_group_size != world->local_rank();
    double any_misplaced = world->all_reduce_scalar(misplaced ? 1.0 : 0.0, ReduceOp::Max);
    HAM_CHECK(any_misplaced == 0, "sharding groups on ", world->name(),
              ": ranks are not placed node by node (rank ", rank, " has local rank ",
              world->local_rank(), " of ", world->local_size(),
              "); launch with consecutive ranks per node (mpirun --map-by slot)");
  }
  ShardingGroups groups;
  if (shard_group_size == world_size) {
    groups.shard = world;
    groups.replica = world->split(rank, 0);
  } else {
    groups.shard = world->split(rank / shard_group_size, rank);
    groups.replica = world->split(rank % shard_group_size, rank);
  }
  groups.shard_gradients = groups.shard->split(0, groups.shard->rank());
  return groups;
}

int run_or_abort_job(Communicator& world, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    world.abort_job(e.what(), 1);
  }
  std::_Exit(1);  // not reached: abort_job ends the process
}

std::function<double(double)> mean_over_ranks(std::shared_ptr<Communicator> comm) {
  return [comm = std::move(comm)](double local) {
    return comm->all_reduce_scalar(local, ReduceOp::Avg);
  };
}

namespace {
NcclBackend*& nccl_backend() {
  static NcclBackend* backend = nullptr;
  return backend;
}
}  // namespace

void register_nccl_backend(const NcclBackend& backend) {
  nccl_backend() = new NcclBackend(backend);
}

bool built_with_nccl() { return nccl_backend() != nullptr; }

std::string nccl_unavailable_reason() {
  if (!built_with_nccl()) {
    return "this build has no NCCL (configure with CUDA and NCCL to enable it)";
  }
  return nccl_backend()->unavailable_reason();
}

std::shared_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_index,
                                                     double collective_timeout_s) {
  HAM_CHECK(built_with_nccl(), "NCCL communicator on ", bootstrap.name(), " (cuda:", device_index,
            "): this build has no NCCL");
  return nccl_backend()->make(bootstrap, device_index, collective_timeout_s);
}

}  // namespace ham::dist

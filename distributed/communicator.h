#pragma once
// Collectives over the ranks of a job, on Tensors. One abstract Communicator, three
// backends: a world of one (no MPI at all: plain `ham train`), MPI for CPU tensors
// (`mpirun -np N ham train`), NCCL for CUDA tensors. Every collective is in place or
// writes into a caller-given output; every rank must call the same collectives in the
// same order with the same shapes and dtypes.
//
//   all_reduce(x, op):           x <- op over ranks r of x_r                  (in place)
//   reduce_scatter(in, out, op): out_r <- op over ranks s of chunk r of in_s,
//                                in.numel() == size() * out.numel()
//   all_gather(in, out):         chunk r of out <- in_r,  out.numel() == size() * in.numel()
//   broadcast(x, root):          x <- x_root
// Chunks are contiguous runs of the flattened tensor, chunk r at [r * n, (r + 1) * n).
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace ham::dist {

enum class ReduceOp : uint8_t { Sum, Avg, Min, Max };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "min", "max"

// A collective that was started and may still be running. wait() returns once the output
// may be read (CPU: the data is there; CUDA: the compute stream is ordered after it).
// Destroying it without wait() waits.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank among the processes of this node in the world (picks the GPU), and their count.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // "world", "world/split(1)", ... for error messages.
  virtual std::string name() const = 0;

  // Outputs are handles: the collective writes into their storage.
  virtual std::unique_ptr<PendingCollective> all_reduce_async(const Tensor& tensor,
                                                              ReduceOp op) = 0;
  virtual std::unique_ptr<PendingCollective> reduce_scatter_async(const Tensor& input,
                                                                  const Tensor& output,
                                                                  ReduceOp op) = 0;
  virtual std::unique_ptr<PendingCollective> all_gather_async(const Tensor& input,
                                                              const Tensor& output) = 0;
  virtual void broadcast(const Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;

  // Ranks calling with the same color form a new communicator, ordered by key (then by
  // rank here). Collective over this communicator.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // Prints "rank R failed: <what>" to stderr and ends the whole job with `exit_code`
  // (MPI_Abort under MPI), so no peer is left waiting in a collective.
  [[noreturn]] virtual void abort_job(const std::string& what, int exit_code) = 0;

  // Blocking forms.
  void all_reduce(const Tensor& tensor, ReduceOp op) { all_reduce_async(tensor, op)->wait(); }
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
    reduce_scatter_async(input, output, op)->wait();
  }
  void all_gather(const Tensor& input, const Tensor& output) {
    all_gather_async(input, output)->wait();
  }
  // One double through all_reduce (metrics, norms, HAM's threshold controller).
  double all_reduce_scalar(double value, ReduceOp op);
};

// ---- Shape and dtype checks every backend shares (the error names op, comm and shapes) ----
void check_all_reduce_args(const Communicator& comm, const Tensor& tensor, ReduceOp op);
void check_reduce_scatter_args(const Communicator& comm, const Tensor& input,
                               const Tensor& output, ReduceOp op);
void check_all_gather_args(const Communicator& comm, const Tensor& input, const Tensor& output);
void check_broadcast_args(const Communicator& comm, const Tensor& tensor, int root);

// A collective that finished before it was returned.
class CompletedCollective final : public PendingCollective {
 public:
  void wait() override {}
};

// The world of one: collectives are copies, split() returns another world of one. Works
// for tensors on any device. abort_job exits the process.
class SingleProcessCommunicator final : public Communicator {
 public:
  explicit SingleProcessCommunicator(std::string name = "world") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string name() const override { return name_; }
  std::unique_ptr<PendingCollective> all_reduce_async(const Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<PendingCollective> reduce_scatter_async(const Tensor& input,
                                                          const Tensor& output,
                                                          ReduceOp op) override;
  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& input,
                                                      const Tensor& output) override;
  void broadcast(const Tensor& tensor, int root) override;
  void barrier() override {}
  std::shared_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort_job(const std::string& what, int exit_code) override;

 private:
  std::string name_;
};

// ---- The world ----------------------------------------------------------------------

struct WorldOptions {
  // Route CUDA tensors through NCCL on cuda:<local_rank> under an MPI launcher (needs a
  // build with NCCL). A world of one needs no NCCL (collectives are copies) and ignores it
  // (so `ham train --device cuda` runs on builds without NCCL) unless told otherwise below.
  bool use_nccl = false;
  // A rank blocked this long in one collective decides a peer has failed and ends the
  // job. <= 0: HAM_COLLECTIVE_TIMEOUT_S from the environment, else 600 s.
  double collective_timeout_s = 0;
  // With use_nccl: a world of one also sends CUDA tensors through a one-rank NCCL
  // communicator (the NCCL path on a single GPU, for tests).
  bool nccl_in_a_world_of_one = false;
};

// True when an MPI launcher started this process (mpirun/mpiexec/srun set OMPI_COMM_WORLD_SIZE,
// PMI_SIZE, PMIX_RANK or MV2_COMM_WORLD_SIZE).
bool launched_by_mpi();
// The world of this job: MPI (plus NCCL when asked) under an MPI launcher, otherwise a
// world of one that never touches MPI. Throws when launched by mpirun in a build without
// MPI, or when NCCL is needed (see WorldOptions) in a build without it.
std::shared_ptr<Communicator> make_world_communicator(const WorldOptions& options = {});
// The timeout WorldOptions resolves to.
double resolve_collective_timeout(double requested_s);

// Hybrid sharding: parameters are sharded within a shard group and replicated across the
// replica group (the ranks that hold the same shard in the other shard groups).
// With shard_group_size consecutive ranks per shard group:
//   shard group of rank r:   ranks [g * s, (g + 1) * s), g = r / s
//   replica group of rank r: ranks {r % s + k * s}
struct ShardingGroups {
  std::shared_ptr<Communicator> shard;    // parameters and optimizer state are split here
  std::shared_ptr<Communicator> replica;  // gradients averaged here too (size 1: no hybrid)
  // The same ranks as `shard`, for gradient reduce-scatters only: those start from
  // backward hooks while parameter gathers start from the trainer, and two kinds of
  // collectives on one communicator must start in the same order on every rank.
  std::shared_ptr<Communicator> shard_gradients;
};
// shard_group_size: world.size() (plain sharding), world.local_size() (shard within a
// node, replicate across nodes; checked that ranks are placed node by node), or any
// divisor of world.size() (tests). Collective over `world`.
ShardingGroups make_sharding_groups(const std::shared_ptr<Communicator>& world,
                                    int shard_group_size);

// Runs `body`; if it throws, ends the job through world.abort_job naming this rank and
// the exception's message, with exit code 1. Returns body's result otherwise.
int run_or_abort_job(Communicator& world, const std::function<int()>& body);

// The cross-rank mean of one double, for HAMModel::set_threshold_all_reduce.
std::function<double(double)> mean_over_ranks(std::shared_ptr<Communicator> comm);

}  // namespace ham::dist

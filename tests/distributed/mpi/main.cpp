// Runs the gtest suite on every rank of `mpirun -np N test_distributed_mpi`. Rank 0
// prints the usual progress; every rank prints its own failures, prefixed with its rank.
// The exit code is non-zero when any rank failed.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/distributed/mpi/mpi_world.h"

namespace ham::dist::testing {

std::shared_ptr<Communicator>& world_slot() {
  static std::shared_ptr<Communicator> world;
  return world;
}

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace ham::dist::testing

int main(int argc, char** argv) {
  using ham::dist::Communicator;
  using ham::dist::ReduceOp;
  namespace dist_testing = ham::dist::testing;
  ::testing::InitGoogleTest(&argc, argv);
  if (!ham::dist::launched_by_mpi()) {
    std::fprintf(stderr, "test_distributed_mpi: run me under mpirun "
                         "(ctest does: distributed.mpi_np2, distributed.mpi_np4_hybrid)\n");
    return 1;
  }
  // A test that fails on one rank only may leave the others waiting: the watchdog ends
  // the job after 60 s instead of letting ctest time out.
  dist_testing::world_slot() =
      ham::dist::make_world_communicator(ham::dist::WorldOptions{false, 60.0});
  Communicator& world = dist_testing::world();
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new dist_testing::RankFailurePrinter(world.rank()));
  }
  int result = RUN_ALL_TESTS();
  bool any_failed = world.all_reduce_scalar(result != 0 ? 1.0 : 0.0, ReduceOp::Max) != 0;
  dist_testing::world_slot().reset();
  return any_failed ? 1 : 0;
}

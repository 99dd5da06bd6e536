// distributed_failure_probe MODE [FAILING_RANK]: all-reduces a small tensor every 20 ms,
// printing "rank R step S" (and "rank R pid P" first), so a test script can make one rank
// fail in the middle of a job:
//   loop   run until killed (the script SIGKILLs a rank)
//   throw  FAILING_RANK throws at step 5 (run_or_abort_job turns it into
//          "rank R failed: ..." and MPI_Abort)
//   hang   FAILING_RANK stops calling collectives at step 5 and sleeps; the others'
//          watchdog (HAM_COLLECTIVE_TIMEOUT_S) ends the job
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <unistd.h>

#include "distributed/communicator.h"

int main(int argc, char** argv) {
  using namespace ham;
  using namespace ham::dist;
  std::string mode = argc > 1 ? argv[1] : "";
  int failing_rank = argc > 2 ? std::stoi(argv[2]) : 1;
  if (mode != "loop" && mode != "throw" && mode != "hang") {
    std::fprintf(stderr, "usage: distributed_failure_probe loop|throw|hang [FAILING_RANK]\n");
    return 2;
  }
  auto world = make_world_communicator();
  return run_or_abort_job(*world, [&] {
    const int rank = world->rank();
    std::printf("rank %d pid %d\n", rank, int(::getpid()));
    std::fflush(stdout);
    for (int step = 0;; ++step) {
      if (rank == failing_rank && step == 5) {
        if (mode == "throw") HAM_FAIL("probe: rank ", rank, " throws at step ", step);
        if (mode == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
      }
      Tensor x = Tensor::full({4}, double(rank + step));
      world->all_reduce(x, ReduceOp::Sum);
      std::printf("rank %d step %d\n", rank, step);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  });
}

#pragma once
// NCCL for CUDA tensors (distributed/nccl_communicator.cu, built when CUDA and NCCL are
// found). The communicator's unique id is made on rank 0 and broadcast over `bootstrap`
// (MPI); the device is cuda:device_index (the trainer passes the local rank). Collectives
// run on the communicator's own stream: an event recorded on the compute stream (the
// legacy default stream, where ham's kernels and copies run) orders them after the work
// that produced their inputs, and wait() makes the compute stream wait on an event
// recorded after them. A watchdog thread ends the process when one stays unfinished past
// the timeout or NCCL reports an asynchronous error (after ncclCommAbort).
//
// Not run on this project's CI (no GPU): only compiled. The tests skip with the reason.
#include <memory>
#include <string>

#include "distributed/communicator.h"

namespace ham::dist {

// False in a build without CUDA or without NCCL.
bool built_with_nccl();
// Why NCCL collectives cannot run here ("" when they can): no NCCL in the build, or no GPU.
std::string nccl_unavailable_reason();
// Collective over `bootstrap`, whose ranks become this communicator's ranks.
std::shared_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_index,
                                                     double collective_timeout_s);

}  // namespace ham::dist

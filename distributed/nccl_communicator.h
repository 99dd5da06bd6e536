#pragma once
// NCCL for CUDA tensors. distributed/nccl_communicator.cpp implements it in its own library
// (ham_nccl, built when CUDA and NCCL are found; ham_nccl_emulated on the SIMT emulator,
// docs/cuda_emulator.md), which registers itself when linked, as the CUDA backend does;
// ham_distributed itself needs no NCCL. The communicator's unique id is made on rank 0 and
// broadcast over `bootstrap`
// (MPI); the device is cuda:device_index (the trainer passes the local rank). Collectives
// run on the communicator's own stream: an event recorded on the compute stream (the
// legacy default stream, where ham's kernels and copies run) orders them after the work
// that produced their inputs, and wait() makes the compute stream wait on an event
// recorded after them. A watchdog thread ends the process when one stays unfinished past
// the timeout or NCCL reports an asynchronous error (after ncclCommAbort).
//
#include <memory>
#include <string>

#include "distributed/communicator.h"

namespace ham::dist {

// What an NCCL implementation registers (register_nccl_backend, at load time).
struct NcclBackend {
  std::string (*unavailable_reason)();
  std::shared_ptr<Communicator> (*make)(Communicator& bootstrap, int device_index,
                                        double collective_timeout_s);
};
void register_nccl_backend(const NcclBackend& backend);

// False when no NCCL implementation is linked into this program.
bool built_with_nccl();
// Why NCCL collectives cannot run here ("" when they can): no NCCL in the build, or no GPU.
std::string nccl_unavailable_reason();
// Collective over `bootstrap`, whose ranks become this communicator's ranks.
std::shared_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_index,
                                                     double collective_timeout_s);

}  // namespace ham::dist

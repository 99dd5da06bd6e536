#pragma once
// The world communicator of the mpirun test binary (made once in main: MPI can be
// initialised only once per process).
#include <memory>

#include "distributed/communicator.h"

namespace ham::dist::testing {

std::shared_ptr<Communicator>& world_slot();
inline Communicator& world() { return *world_slot(); }

}  // namespace ham::dist::testing

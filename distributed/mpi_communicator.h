#pragma once
// MPI for CPU tensors. mpi.h stays inside mpi_communicator.cpp, so nothing else needs the
// MPI include path.
//
// MPI is initialised on first use (MPI_THREAD_FUNNELED: only the main thread calls MPI;
// the watchdog thread never does) and finalised at exit. Every communicator returns MPI
// errors (MPI_ERRORS_RETURN) and every return code is checked: the error names the rank,
// the call, the communicator and MPI's own message.
#include <memory>

#include "distributed/communicator.h"

namespace ham::dist {

// False in a build configured without MPI.
bool built_with_mpi();
// The MPI_COMM_WORLD communicator (initialises MPI). Only under an MPI launcher.
std::shared_ptr<Communicator> make_mpi_world_communicator(double collective_timeout_s);

}  // namespace ham::dist

// The NCCL stand-in of the SIMT emulator (include/nccl.h). A communicator is an MPI
// communicator: ncclCommInitRank splits MPI_COMM_WORLD by the unique id (every rank that
// passes the same id joins the same communicator), ncclCommSplit is MPI_Comm_split. A
// collective reads its input and exchanges when issued (after its stream's held work, in the
// held stream orders: held, the exchange could block one rank in a call its peers make
// elsewhere); its result lands in the output in stream order, like a kernel's, so in the
// held orders a reader that does not wait for the collective's end reads what was there
// before. It moves bytes only: every rank gathers every rank's input and reduces it itself,
// in rank order, in f64 (exact integers in i64), so all ranks get the same bits and no MPI
// type is needed for bf16. A one-rank communicator needs no MPI at all. Errors are returned
// as NCCL would and described by ncclGetLastError.
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/dtype.h"
#include "cuda/emulator/racecheck.h"

#ifdef HAM_WITH_MPI
#include <mpi.h>
#endif

struct ncclComm {
#ifdef HAM_WITH_MPI
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL: a one-rank communicator
#endif
  int rank = 0;
  int size = 1;
};

namespace {

thread_local std::string last_error;

ncclResult_t fail(ncclResult_t result, std::string why) {
  last_error = std::move(why);
  return result;
}

// A collective runs when issued, after what its stream holds (the held stream orders); the
// host is not ordered after it, as it is by cudaStreamSynchronize (for the racecheck).
ncclResult_t run_stream_before(cudaStream_t stream, const char* collective) {
  if (ham::cuda::emulator::run_held_work(stream) != cudaSuccess) {
    return fail(ncclUnhandledCudaError, std::string(collective) + ": its stream failed");
  }
  return ncclSuccess;
}

// Writes a collective's `result` to `recvbuff` as work issued to `stream`: held where the
// stream's work is held, so only a wait for the collective's end orders a reader after it.
// For the racecheck, that work also reads the `sent` bytes at `sendbuff`.
ncclResult_t land_in_stream_order(cudaStream_t stream, const void* sendbuff, size_t sent,
                                  void* recvbuff, std::vector<char> result,
                                  const char* collective) {
  if (result.empty()) return ncclSuccess;
  auto bytes = std::make_shared<const std::vector<char>>(std::move(result));
  auto land = [sendbuff, sent, recvbuff, bytes, collective] {
    namespace emulator = ham::cuda::emulator;
    if (emulator::racecheck_on()) {
      emulator::racecheck_work_accesses(
          collective, {{sendbuff, sent, emulator::MemoryAccess::Read},
                       {recvbuff, bytes->size(), emulator::MemoryAccess::Write}});
    }
    std::memcpy(recvbuff, bytes->data(), bytes->size());
  };
  const cudaError_t issued = ham::cuda::emulator::issue(stream, land);
  if (issued != cudaSuccess) {
    return fail(ncclUnhandledCudaError,
                std::string(collective) + ": writing its result on its stream failed");
  }
  return ncclSuccess;
}

size_t type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

bool is_integer(ncclDataType_t type) {
  return type == ncclInt8 || type == ncclUint8 || type == ncclInt32 || type == ncclUint32 ||
         type == ncclInt64 || type == ncclUint64;
}

double load_real(const char* p, ncclDataType_t type) {
  if (type == ncclFloat32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (type == ncclFloat64) {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  ham::BFloat16 v;
  std::memcpy(&v.bits, p, 2);
  return ham::bf16_to_float(v);
}

void store_real(char* p, ncclDataType_t type, double value) {
  if (type == ncclFloat32) {
    const float v = float(value);
    std::memcpy(p, &v, 4);
  } else if (type == ncclFloat64) {
    std::memcpy(p, &value, 8);
  } else {
    const ham::BFloat16 v = ham::float_to_bf16(float(value));
    std::memcpy(p, &v.bits, 2);
  }
}

int64_t load_integer(const char* p, ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return int64_t(*reinterpret_cast<const int8_t*>(p));
    case ncclUint8: return int64_t(*reinterpret_cast<const uint8_t*>(p));
    case ncclInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case ncclUint32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    default: { int64_t v; std::memcpy(&v, p, 8); return v; }
  }
}

void store_integer(char* p, ncclDataType_t type, int64_t value) {
  switch (type) {
    case ncclInt8: *reinterpret_cast<int8_t*>(p) = int8_t(value); break;
    case ncclUint8: *reinterpret_cast<uint8_t*>(p) = uint8_t(value); break;
    case ncclInt32: { int32_t v = int32_t(value); std::memcpy(p, &v, 4); break; }
    case ncclUint32: { uint32_t v = uint32_t(value); std::memcpy(p, &v, 4); break; }
    default: std::memcpy(p, &value, 8); break;
  }
}

template <class V>
V combine(V a, V b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg: return a + b;
    case ncclProd: return a * b;
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
  }
  return a;
}

// out[i] = op over ranks r of in[r][first + i], for i < count (in: size blocks of `stride`
// elements each).
void reduce_blocks(const std::vector<char>& in, int size, size_t stride, size_t first,
                   size_t count, ncclDataType_t type, ncclRedOp_t op, char* out) {
  const size_t bytes = type_size(type);
  for (size_t i = 0; i < count; ++i) {
    const char* x = &in[(first + i) * bytes];
    if (is_integer(type)) {
      int64_t acc = load_integer(x, type);
      for (int r = 1; r < size; ++r) {
        acc = combine(acc, load_integer(x + r * stride * bytes, type), op);
      }
      if (op == ncclAvg) acc /= size;
      store_integer(out + i * bytes, type, acc);
    } else {
      double acc = load_real(x, type);
      for (int r = 1; r < size; ++r) {
        acc = combine(acc, load_real(x + r * stride * bytes, type), op);
      }
      if (op == ncclAvg) acc /= size;
      store_real(out + i * bytes, type, acc);
    }
  }
}

ncclResult_t check_args(ncclComm_t comm, ncclDataType_t type, ncclRedOp_t op, const char* what) {
  if (!comm) return fail(ncclInvalidArgument, std::string(what) + ": null communicator");
  if (type_size(type) == 0 || type == ncclFloat16) {
    return fail(ncclInvalidArgument, std::string(what) + ": data type not emulated");
  }
  if (op < ncclSum || op > ncclAvg) {
    return fail(ncclInvalidArgument, std::string(what) + ": bad op");
  }
  return ncclSuccess;
}

// Every rank's `bytes` bytes of `send`, in rank order.
ncclResult_t gather_all(ncclComm_t comm, const void* send, size_t bytes, std::vector<char>& all,
                        const char* what) {
  all.resize(bytes * size_t(comm->size));
  if (comm->size == 1) {
    if (bytes) std::memcpy(all.data(), send, bytes);
    return ncclSuccess;
  }
#ifdef HAM_WITH_MPI
  std::vector<char> mine(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
  if (bytes > size_t(INT32_MAX)) return fail(ncclInvalidUsage, std::string(what) + ": too large");
  if (MPI_Allgather(mine.data(), int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE,
                    comm->mpi) != MPI_SUCCESS) {
    return fail(ncclSystemError, std::string(what) + ": MPI_Allgather failed");
  }
  return ncclSuccess;
#else
  return fail(ncclSystemError, std::string(what) + ": a multi-rank communicator needs MPI");
#endif
}

}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
  static uint64_t counter = 0;
  const uint64_t parts[3] = {uint64_t(getpid()), ++counter,
                             uint64_t(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, parts, sizeof parts);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, "ncclCommInitRank: bad rank or size");
  }
  auto* c = new ncclComm;
  c->rank = rank;
  c->size = nranks;
  if (nranks > 1) {
#ifdef HAM_WITH_MPI
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      delete c;
      return fail(ncclSystemError, "ncclCommInitRank: the emulated NCCL needs MPI initialised");
    }
    // Ranks passing the same id end up in one communicator, ordered by `rank`.
    uint64_t hash = 1469598103934665603ull;
    for (char byte : id.internal) hash = (hash ^ uint8_t(byte)) * 1099511628211ull;
    if (MPI_Comm_split(MPI_COMM_WORLD, int(hash & 0x3fffffff), rank, &c->mpi) != MPI_SUCCESS) {
      delete c;
      return fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
    }
    int size = 0;
    MPI_Comm_size(c->mpi, &size);
    if (size != nranks) {
      MPI_Comm_free(&c->mpi);
      delete c;
      return fail(ncclInvalidUsage, "ncclCommInitRank: " + std::to_string(size) +
                                        " ranks share the id, " + std::to_string(nranks) +
                                        " were announced");
    }
#else
    delete c;
    return fail(ncclSystemError, "ncclCommInitRank: a multi-rank communicator needs MPI");
#endif
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t*) {
  if (!comm || !newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: null communicator");
  *newcomm = nullptr;
  auto* c = new ncclComm;
  if (comm->size == 1) {
    if (color == NCCL_SPLIT_NOCOLOR) {
      delete c;
      return ncclSuccess;
    }
    *newcomm = c;
    return ncclSuccess;
  }
#ifdef HAM_WITH_MPI
  if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key,
                     &c->mpi) != MPI_SUCCESS) {
    delete c;
    return fail(ncclSystemError, "ncclCommSplit: MPI_Comm_split failed");
  }
  if (c->mpi == MPI_COMM_NULL) {
    delete c;
    return ncclSuccess;
  }
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  if (c->size == 1) {
    MPI_Comm_free(&c->mpi);
    c->mpi = MPI_COMM_NULL;
  }
  *newcomm = c;
  return ncclSuccess;
#else
  delete c;
  return fail(ncclSystemError, "ncclCommSplit: a multi-rank communicator needs MPI");
#endif
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
#ifdef HAM_WITH_MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm->mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm->mpi);
#endif
  delete comm;
  return ncclSuccess;
}

// Called from a watchdog thread while the process is about to end: no MPI call here.
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !async_error) return ncclInvalidArgument;
  *async_error = ncclSuccess;  // collectives exchange when issued and cannot fail later
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: null argument");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: null argument");
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = run_stream_before(stream, "ncclAllReduce"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(comm, datatype, op, "ncclAllReduce"); r != ncclSuccess) {
    return r;
  }
  std::vector<char> all;
  if (ncclResult_t r = gather_all(comm, sendbuff, count * type_size(datatype), all,
                                  "ncclAllReduce");
      r != ncclSuccess) {
    return r;
  }
  std::vector<char> result(count * type_size(datatype));
  reduce_blocks(all, comm->size, count, 0, count, datatype, op, result.data());
  return land_in_stream_order(stream, sendbuff, count * type_size(datatype), recvbuff,
                              std::move(result), "ncclAllReduce");
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (ncclResult_t r = run_stream_before(stream, "ncclReduceScatter"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(comm, datatype, op, "ncclReduceScatter"); r != ncclSuccess) {
    return r;
  }
  const size_t count = recvcount * size_t(comm->size);
  std::vector<char> all;
  if (ncclResult_t r = gather_all(comm, sendbuff, count * type_size(datatype), all,
                                  "ncclReduceScatter");
      r != ncclSuccess) {
    return r;
  }
  std::vector<char> result(recvcount * type_size(datatype));
  reduce_blocks(all, comm->size, count, recvcount * size_t(comm->rank), recvcount, datatype, op,
                result.data());
  return land_in_stream_order(stream, sendbuff, count * type_size(datatype), recvbuff,
                              std::move(result), "ncclReduceScatter");
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = run_stream_before(stream, "ncclAllGather"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(comm, datatype, ncclSum, "ncclAllGather"); r != ncclSuccess) {
    return r;
  }
  std::vector<char> all;
  if (ncclResult_t r = gather_all(comm, sendbuff, sendcount * type_size(datatype), all,
                                  "ncclAllGather");
      r != ncclSuccess) {
    return r;
  }
  return land_in_stream_order(stream, sendbuff, sendcount * type_size(datatype), recvbuff,
                              std::move(all), "ncclAllGather");
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = run_stream_before(stream, "ncclBroadcast"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(comm, datatype, ncclSum, "ncclBroadcast"); r != ncclSuccess) {
    return r;
  }
  if (root < 0 || root >= comm->size) {
    return fail(ncclInvalidArgument, "ncclBroadcast: bad root");
  }
  const size_t bytes = count * type_size(datatype);
  std::vector<char> all;
  // Every rank sends its buffer; only the root's is kept (simple, and collective for all).
  const void* mine = comm->rank == root ? sendbuff : recvbuff;
  if (ncclResult_t r = gather_all(comm, mine, bytes, all, "ncclBroadcast"); r != ncclSuccess) {
    return r;
  }
  const auto roots = all.begin() + std::ptrdiff_t(size_t(root) * bytes);
  return land_in_stream_order(stream, comm->rank == root ? sendbuff : nullptr,
                              comm->rank == root ? bytes : 0, recvbuff,
                              std::vector<char>(roots, roots + std::ptrdiff_t(bytes)),
                              "ncclBroadcast");
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

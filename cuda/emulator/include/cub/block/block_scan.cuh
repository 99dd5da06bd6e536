#pragma once
// cub::BlockScan for the SIMT emulator (the forms cuda/*.cu use): every thread of a
// BLOCK_THREADS-thread block posts its value to TempStorage, the block meets at a barrier,
// each thread scans the posted values up to its own, and the block meets again so that
// TempStorage can be reused, as cub requires between scans.
#include <cuda_runtime.h>

namespace cub {

template <class T, int BLOCK_THREADS>
class BlockScan {
 public:
  struct TempStorage {
    T values[BLOCK_THREADS];
  };

  explicit BlockScan(TempStorage& storage) : storage_(storage) {}

  template <class Op>
  void InclusiveScan(T input, T& output, Op op) {
    const int me = rank();
    post(input);
    T acc = storage_.values[0];
    for (int i = 1; i <= me; ++i) acc = op(acc, storage_.values[i]);
    __syncthreads();
    output = acc;
  }

  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    const int me = rank();
    post(input);
    T before = T(0), total = T(0);
    for (int i = 0; i < BLOCK_THREADS; ++i) {
      if (i < me) before = before + storage_.values[i];
      total = total + storage_.values[i];
    }
    __syncthreads();
    output = before;
    block_aggregate = total;
  }

  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }

 private:
  static int rank() {
    return int(threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y);
  }
  void post(T input) {
    if (int(blockDim.x * blockDim.y * blockDim.z) != BLOCK_THREADS) {
      __trap();  // cub's BlockScan needs exactly BLOCK_THREADS threads
    }
    storage_.values[rank()] = input;
    __syncthreads();
  }

  TempStorage& storage_;
};

}  // namespace cub

#pragma once
// cub::BlockScan for the SIMT emulator (the forms cuda/*.cu use): every thread of a
// BLOCK_THREADS-thread block posts its value to TempStorage, the block meets at a barrier,
// each thread scans the posted values up to its own, and the block meets again so that
// TempStorage can be reused, as cub requires between scans. In the forms over N items a
// thread (its items consecutive in the block's order), a thread posts their total.
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

  template <class Op, int N>
  void InclusiveScan(T (&input)[N], T (&output)[N], Op op) {
    const int me = rank();
    T local = input[0];
    for (int j = 1; j < N; ++j) local = op(local, input[j]);
    post(local);
    T acc = me > 0 ? storage_.values[0] : T();
    for (int i = 1; i < me; ++i) acc = op(acc, storage_.values[i]);
    __syncthreads();
    for (int j = 0; j < N; ++j) {  // input may be output: input[j] is read before it is written
      acc = me > 0 || j > 0 ? op(acc, input[j]) : input[j];
      output[j] = acc;
    }
  }

  template <int N>
  void ExclusiveSum(T (&input)[N], T (&output)[N], T& block_aggregate) {
    T local = T(0);
    for (int j = 0; j < N; ++j) local = local + input[j];
    T before;
    ExclusiveSum(local, before, block_aggregate);
    for (int j = 0; j < N; ++j) {  // input may be output
      const T x = input[j];
      output[j] = before;
      before = before + x;
    }
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

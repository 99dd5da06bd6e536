#pragma once
// Deterministic sums over the middle dim of an [outer, len, inner] view, shared by sum,
// sum_to, squared_norm, the RMSNorm weight gradient and the conv1d weight gradient:
//   total(o, i) = sum_{l < len} value(o, l, i),   then store(o * inner + i, total)
// `value` and `store` are functor structs with __device__ operator() (no extended
// lambdas). When the outputs alone cannot fill the GPU, len is cut into `splits` pieces
// whose partial sums go to a scratch buffer and are added in split order: the result
// depends on the GPU's SM count (through `splits`) but never on scheduling. Sums are taken
// in f64 whatever C is, as the CPU kernels take them (core/cpu/reduce.cpp): the gradient of a
// broadcast parameter (a gate's A_log, EDA's gamma) is a sum over every token of terms that
// cancel, where f32 accumulation would lose digits the CPU keeps. The reductions are memory
// bound, so the f64 adds cost nothing measurable.
#include <cstdint>

#include "cuda/launch.h"

namespace ham::cuda {

namespace reduce_detail {

using Acc = double;  // the accumulator of every sum here

constexpr int kColumnWidth = 32;  // columns per block in the inner > 1 case
constexpr int kColumnRows = 8;    // rows walked in parallel per column

// Rows [begin, end) of split `split` out of `splits` over `len`.
__device__ __forceinline__ void split_range(int64_t len, int64_t split, int64_t splits,
                                            int64_t& begin, int64_t& end) {
  int64_t per = (len + splits - 1) / splits;
  begin = split * per;
  end = min(len, begin + per);
}

// inner == 1: one row (o) per warp or per block, split blockIdx.y.
template <bool kWarp, class C, class Value, class Store>
__global__ void row_sums(int64_t outer, int64_t len, int64_t splits, Value value, Store store,
                         Acc* partial) {
  using Group = RowGroup<kWarp>;
  const int64_t o = kWarp ? int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32
                          : int64_t(blockIdx.x);
  if (kWarp && o >= outer) return;  // whole warps leave together
  int64_t begin, end;
  split_range(len, blockIdx.y, splits, begin, end);
  Acc acc = 0;
  for (int64_t l = begin + Group::lane(); l < end; l += Group::size()) acc += Acc(value(o, l, 0));
  acc = Group::sum(acc);
  if (Group::lane() != 0) return;
  if (splits == 1) store(o, C(acc));
  else partial[int64_t(blockIdx.y) * outer + o] = acc;
}

// inner > 1: blocks of kColumnWidth columns x kColumnRows row lanes; blockIdx.x walks
// (o, column tile), blockIdx.y the split.
template <class C, class Value, class Store>
__global__ void column_sums(int64_t outer, int64_t len, int64_t inner, int64_t splits,
                            Value value, Store store, Acc* partial) {
  HAM_STATIC_SHARED(Acc, tile, [kColumnRows][kColumnWidth + 1]);
  const int64_t tiles = (inner + kColumnWidth - 1) / kColumnWidth;
  const int64_t o = int64_t(blockIdx.x) / tiles;
  const int64_t i = (int64_t(blockIdx.x) % tiles) * kColumnWidth + threadIdx.x;
  int64_t begin, end;
  split_range(len, blockIdx.y, splits, begin, end);
  Acc acc = 0;
  if (i < inner) {
    for (int64_t l = begin + threadIdx.y; l < end; l += kColumnRows) acc += Acc(value(o, l, i));
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || i >= inner) return;
  Acc total = 0;
  for (int r = 0; r < kColumnRows; ++r) total += tile[r][threadIdx.x];  // fixed order
  const int64_t out = o * inner + i;
  if (splits == 1) store(out, C(total));
  else partial[int64_t(blockIdx.y) * outer * inner + out] = total;
}

// store(idx, sum over s of partial[s * count + idx]), s in order.
template <class C, class Store>
__global__ void add_splits(int64_t count, int64_t splits, const Acc* partial, Store store) {
  HAM_GRID_STRIDE_LOOP(idx, count) {
    Acc total = 0;
    for (int64_t s = 0; s < splits; ++s) total += partial[s * count + idx];
    store(idx, C(total));
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace reduce_detail

// The kernels a call site compiles: a site whose inner is always 1 (a sum of rows) needs
// only the row kernels; one whose inner is a width needs only the column kernel, which
// also takes a width of 1 (one live column a block: slower, but only for degenerate shapes).
enum class ReduceForms { RowsAndColumns, Rows, Columns };

// Runs the reduction on `device` (the current device must already be set).
template <class C, ReduceForms kForms = ReduceForms::RowsAndColumns, class Value, class Store>
void reduce_middle(Device device, int64_t outer, int64_t len, int64_t inner, Value value,
                   Store store) {
  using namespace reduce_detail;
  const int64_t count = outer * inner;
  if (count == 0) return;
  HAM_CHECK(kForms != ReduceForms::Rows || inner == 1, "reduce: a sum of rows given inner ",
            inner);
  const int64_t target_blocks = 4 * int64_t(multiprocessor_count());
  const bool rows = kForms != ReduceForms::Columns && inner == 1;
  const bool warp_rows = rows && len <= kWarpRowMax;
  const int64_t base_blocks = rows ? (warp_rows ? ceil_div(outer, kWarpRowsPerBlock) : outer)
                                   : outer * ceil_div(inner, kColumnWidth);
  const int64_t min_len_per_split = rows ? 8 * kThreads : 16 * kColumnRows;
  int64_t splits = std::min(ceil_div(target_blocks, base_blocks), ceil_div(len, min_len_per_split));
  splits = std::clamp<int64_t>(splits, 1, 65535);
  HAM_CHECK(base_blocks < (int64_t(1) << 31), "reduce: ", base_blocks, " blocks exceed the grid");

  Tensor scratch;
  Acc* partial = nullptr;
  if (splits > 1) {
    scratch = Tensor::empty({splits * count}, DType::F64, device);
    partial = ptr<Acc>(scratch);
  }
  const dim3 grid{unsigned(base_blocks), unsigned(splits)};
  if constexpr (kForms != ReduceForms::Columns) {
    if (warp_rows) {
      HAM_LAUNCH(grid, kThreads, 0, launch_stream(), row_sums<true, C>)(
          outer, len, splits, value, store, partial);
    } else if (rows) {
      HAM_LAUNCH(grid, kThreads, 0, launch_stream(), row_sums<false, C>)(
          outer, len, splits, value, store, partial);
    }
  }
  if constexpr (kForms != ReduceForms::Rows) {
    if (!rows) {
      HAM_LAUNCH(grid, dim3(kColumnWidth, kColumnRows), 0, launch_stream(), column_sums<C>)(
          outer, len, inner, splits, value, store, partial);
    }
  }
  HAM_CUDA_CHECK_LAUNCH();
  if (splits > 1) {
    HAM_LAUNCH(grid_for(count), kThreads, 0, launch_stream(), add_splits<C, Store>)(
        count, splits, partial, store);
    HAM_CUDA_CHECK_LAUNCH();
  }
}

// value(o, l, i) = in[(o * len + l) * inner + i] read through the compute type C.
template <class T, class C>
struct ReadMiddle {
  const T* in;
  int64_t len, inner;
  __device__ C operator()(int64_t o, int64_t l, int64_t i) const {
    return C(load(in[(o * len + l) * inner + i]));
  }
};

// out[idx] = scale * total, rounded to T.
template <class T, class C>
struct StoreScaled {
  T* out;
  C scale;
  __device__ void operator()(int64_t idx, C total) const { out[idx] = store<T>(total * scale); }
};

}  // namespace ham::cuda

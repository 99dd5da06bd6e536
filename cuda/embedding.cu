// CUDA kernels of core/ops/embedding.h: weight [V, D], ids (i32/i64, any shape):
//   out[p, :] = weight[ids[p], :]
//   dweight[v, :] += sum over positions p with ids[p] == v of dy[p, :], in position order
// The forward moves rows as the widest words (up to 16 bytes) the row size and alignment
// allow, so it serves every dtype. The backward is deterministic: (id, position) pairs are
// sorted by id with CUB's stable radix sort, then one block per run of equal ids adds
// that run's dy rows in position order (f32 accumulation; f64 for f64) into dweight.
// An id outside [0, V) is an error worded as on the CPU (one device pass and a wait).
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <string>

#include "core/ops/embedding.h"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

void check_ids_in_vocab(const char* op, const Tensor& ids, int64_t vocab) {
  check_index_range(op, "id", ids, vocab, "vocabulary size V = " + std::to_string(vocab));
}

// out row p = weight row ids[p], `words` words of type W per row.
template <class W, class I>
__global__ void gather_rows(const W* weight, const I* ids, W* out, int64_t positions,
                            int64_t words) {
  HAM_GRID_STRIDE_LOOP(k, positions * words) {
    const int64_t p = k / words, w = k % words;
    out[k] = weight[int64_t(ids[p]) * words + w];
  }
}

// Block b starts a run when sorted_ids[b] differs from its predecessor; it then sums the
// run's dy rows (positions in ascending order, as the stable sort left them).
template <class T, class I>
__global__ void add_sorted_runs(const T* dy, const I* sorted_ids, const int64_t* sorted_positions,
                                int64_t n, int64_t dim, T* dweight) {
  using C = compute_t<T>;
  const int64_t start = blockIdx.x;
  const I id = sorted_ids[start];
  if (start > 0 && sorted_ids[start - 1] == id) return;
  int64_t end = start + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    C acc = C(0);
    for (int64_t k = start; k < end; ++k) acc += load(dy[sorted_positions[k] * dim + c]);
    T* dst = dweight + int64_t(id) * dim + c;
    *dst = store<T>(C(load(*dst)) + acc);
  }
}

__global__ void iota(int64_t* values, int64_t n) {
  HAM_GRID_STRIDE_LOOP(i, n) values[i] = i;
}

int significant_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 63 && (int64_t(1) << bits) < vocab) ++bits;
  return bits;
}

void embedding(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const int64_t vocab = weight.size(0), dim = weight.size(1);
  use_device_of(weight);
  check_ids_in_vocab("embedding", ids, vocab);
  if (out.numel() == 0) return;
  const size_t row_bytes = size_t(dim) * dtype_size(weight.dtype());
  const auto alignment = uintptr_t(weight.raw_data()) | uintptr_t(out.raw_data()) | row_bytes;
  auto launch = [&]<class W>() {
    const int64_t words = int64_t(row_bytes / sizeof(W)), positions = ids.numel();
    dispatch_index("embedding", ids.dtype(), [&]<class I>() {
      HAM_LAUNCH(grid_for(positions * words), kThreads, 0, launch_stream(), gather_rows)(
          ptr<const W>(weight), ptr<const I>(ids), ptr<W>(out), positions, words);
      HAM_CUDA_CHECK_LAUNCH();
    });
  };
  if (alignment % 16 == 0) launch.template operator()<uint4>();
  else if (alignment % 8 == 0) launch.template operator()<uint2>();
  else if (alignment % 4 == 0) launch.template operator()<uint32_t>();
  else if (alignment % 2 == 0) launch.template operator()<uint16_t>();
  else launch.template operator()<uint8_t>();
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dweight) {
  const int64_t vocab = dweight.size(0), dim = dweight.size(1), n = ids.numel();
  use_device_of(dy);
  check_ids_in_vocab("embedding_backward", ids, vocab);
  if (dy.numel() == 0) return;
  HAM_CHECK(n < (int64_t(1) << 31), "embedding_backward: ", n,
            " positions exceed the CUDA sort's int range");
  const Device device = dy.device();
  const cudaStream_t stream = launch_stream();
  dispatch_index("embedding_backward", ids.dtype(), [&]<class I>() {
    Tensor positions = Tensor::empty({n}, DType::I64, device);
    Tensor sorted_positions = Tensor::empty({n}, DType::I64, device);
    Tensor sorted_ids = Tensor::empty({n}, ids.dtype(), device);
    HAM_LAUNCH(grid_for(n), kThreads, 0, stream, iota)(ptr<int64_t>(positions), n);
    HAM_CUDA_CHECK_LAUNCH();
    const int end_bit = significant_bits(vocab);
    size_t scratch_bytes = 0;
    HAM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, scratch_bytes, ptr<const I>(ids), ptr<I>(sorted_ids), ptr<const int64_t>(positions),
        ptr<int64_t>(sorted_positions), int(n), 0, end_bit, stream));
    Tensor scratch = Tensor::empty({int64_t(scratch_bytes) + 1}, DType::U8, device);
    HAM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        scratch.raw_data(), scratch_bytes, ptr<const I>(ids), ptr<I>(sorted_ids),
        ptr<const int64_t>(positions), ptr<int64_t>(sorted_positions), int(n), 0, end_bit,
        stream));
    dispatch_floating("embedding_backward", dy.dtype(), [&]<class T>() {
      HAM_LAUNCH(unsigned(n), 128, 0, stream, add_sorted_runs)(
          ptr<const T>(dy), ptr<const I>(sorted_ids), ptr<const int64_t>(sorted_positions), n, dim,
          ptr<T>(dweight));
      HAM_CUDA_CHECK_LAUNCH();
    });
  });
}

const bool registered = [] {
  embedding_kernels().register_kernel(DeviceKind::CUDA, &embedding);
  embedding_backward_kernels().register_kernel(DeviceKind::CUDA, &embedding_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

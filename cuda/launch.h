#pragma once
// Shared by the hand-written CUDA kernels (cuda/<op>.cu): dtype dispatch, element loads
// and stores through the f32 (or f64) compute type, grid sizing, launch checks and the
// warp / block reductions. Kernels read bf16 and f32 and compute in f32; f64 stays f64.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/device_limits.h"
#include "cuda/stream.h"

// Checks the launch just made (bad configuration, missing kernel image), naming the site.
#define HAM_CUDA_CHECK_LAUNCH() HAM_CUDA_CHECK(cudaGetLastError())

// HAM_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...) is
// kernel<<<grid, block, shared_bytes, stream>>>(args...), spelled so that the same source
// also compiles as C++ for the SIMT emulator (cuda/emulator/, HAM_CUDA_EMULATOR), which runs
// the kernel's threads as fibers on the CPU. The kernel comes last: its template arguments
// may hold commas.
#ifdef HAM_CUDA_EMULATOR
#define HAM_LAUNCH(grid, block, shared_bytes, stream, ...)                                    \
  HAM_EMULATED_LAUNCH((::ham::cuda::emulator::LaunchSite{#__VA_ARGS__, __FILE__, __LINE__}),  \
                      grid, block, shared_bytes, stream, __VA_ARGS__)
#else
#define HAM_LAUNCH(grid, block, shared_bytes, stream, ...) \
  __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#endif

// The block's dynamic shared memory as an array `name` of `type` (extern __shared__).
#ifdef HAM_CUDA_EMULATOR
#define HAM_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::ham::cuda::emulator::dynamic_shared_memory())
#else
#define HAM_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

// A static shared variable: HAM_STATIC_SHARED(float, s_g, [kChunk]) is
// `__shared__ float s_g[kChunk]` (the array bounds, if any, come last). On the emulator it
// is a static, and every block starts with its bytes 0xff: on a GPU each block's copy starts
// undefined, so a read of what this block never wrote must not find the previous block's
// value there. (The emulator's cuda_runtime.h poisons a bare __shared__.)
#ifdef HAM_CUDA_EMULATOR
#define HAM_STATIC_SHARED(type, name, ...) \
  static type name __VA_ARGS__;            \
  ::ham::cuda::emulator::static_shared_variable(&name, sizeof name, #name)
#else
#define HAM_STATIC_SHARED(type, name, ...) __shared__ type name __VA_ARGS__
#endif

namespace ham::cuda {

using bf16 = __nv_bfloat16;

// Kernels and their copies run on this thread's current stream of the current device
// (cuda/stream.h; the legacy default stream unless a StreamGuard says otherwise).
inline cudaStream_t launch_stream() {
  int device = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  return current_stream(device);
}

// Makes `t`'s GPU the current one for the launches that follow.
inline void use_device_of(const Tensor& t) { HAM_CUDA_CHECK(cudaSetDevice(t.device().index)); }

// Typed device pointer to a tensor's data (Tensor::data<T> knows no CUDA types).
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}
template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// The type a kernel computes and accumulates in: f32 for bf16 and f32, f64 for f64.
template <class T>
struct ComputeOf {
  using type = float;
};
template <>
struct ComputeOf<double> {
  using type = double;
};
template <class T>
using compute_t = typename ComputeOf<T>::type;

// DType of the compute type (for scratch buffers of partial sums).
template <class T>
constexpr DType compute_dtype() {
  return std::is_same_v<T, double> ? DType::F64 : DType::F32;
}

__device__ __forceinline__ float load(float v) { return v; }
__device__ __forceinline__ double load(double v) { return v; }
__device__ __forceinline__ float load(bf16 v) { return __bfloat162float(v); }

// Rounds a computed value to the storage type T (bf16: round to nearest even).
template <class T, class C>
__device__ __forceinline__ T store(C v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16_rn(float(v));
  } else {
    return T(v);
  }
}

// Calls fn.template operator()<T>() with T in {float, double, bf16}; other dtypes are an
// error naming the op.
template <class Fn>
void dispatch_floating(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: fn.template operator()<float>(); return;
    case DType::F64: fn.template operator()<double>(); return;
    case DType::BF16: fn.template operator()<bf16>(); return;
    default:
      HAM_FAIL(op, ": CUDA kernels take f32, f64 or bf16, got ", dtype_name(dtype));
  }
}

// Index dtypes (token ids, positions, gather indices).
template <class Fn>
void dispatch_index(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::I32: fn.template operator()<int32_t>(); return;
    case DType::I64: fn.template operator()<int64_t>(); return;
    default: HAM_FAIL(op, ": indices must be i32 or i64, got ", dtype_name(dtype));
  }
}

// Layout ops move elements without looking at them: dispatch on the element size.
template <class Fn>
void dispatch_element_size(const char* op, DType dtype, Fn&& fn) {
  switch (dtype_size(dtype)) {
    case 1: fn.template operator()<uint8_t>(); return;
    case 2: fn.template operator()<uint16_t>(); return;
    case 4: fn.template operator()<uint32_t>(); return;
    case 8: fn.template operator()<uint64_t>(); return;
    default: HAM_FAIL(op, ": unsupported element size ", dtype_size(dtype));
  }
}

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than
// the items need.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(blocks, 1, int64_t(1) << 20));
}

// query() for (kernel, threads, bytes) on the current device, the first time; the cached
// answer after that.
int cached_blocks_per_sm(const void* kernel, int threads, size_t bytes,
                         const std::function<int()>& query);

// Calls `raise` when `bytes` exceed what this process has raised `kernel`'s dynamic
// shared-memory limit to on the current device, then records them; the limit only rises.
void raise_dynamic_shared_limit(const void* kernel, size_t bytes,
                                const std::function<void()>& raise);

// The kernel's own static __shared__ arrays, which count against the same per-block limit.
// `op` names the caller in an error.
template <class Kernel>
size_t static_shared_bytes(const char* op, Kernel* kernel) {
  cudaFuncAttributes attributes{};
  HAM_CUDA_CHECK_CTX(cudaFuncGetAttributes(&attributes, kernel), op, ": kernel attributes");
  return attributes.sharedSizeBytes;
}

// Raises `kernel`'s dynamic shared-memory limit (MaxDynamicSharedMemorySize) to `bytes`, once
// per kernel, device and larger size. Below 48 KiB too: without it a block has 48 KiB for its
// static and dynamic shared memory together, so a launch asking for less still fails where
// the kernel's static arrays take the rest. `op` names the caller in an error, which a GPU
// with less shared memory than the kernel needs (less than Hopper's) gets here.
template <class Kernel>
void allow_dynamic_shared(const char* op, Kernel* kernel, size_t bytes) {
  if (bytes == 0) return;
  raise_dynamic_shared_limit(reinterpret_cast<const void*>(kernel), bytes, [&] {
    const size_t optin = max_shared_per_block(), static_bytes = static_shared_bytes(op, kernel);
    int device = 0;
    HAM_CUDA_CHECK(cudaGetDevice(&device));
    HAM_CHECK(bytes + static_bytes <= optin, op, ": a kernel needs ", bytes,
              " bytes of dynamic shared memory per block beside ", static_bytes, " static; GPU ",
              device, " allows a block ", optin);
    HAM_CUDA_CHECK_CTX(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        op, ": ", bytes, " bytes of dynamic shared memory");
  });
}

// Blocks of `kernel` (`threads` a block, `bytes` of dynamic shared memory, which the query
// opts in) that one SM of the current device holds at once, by the runtime's occupancy
// calculator. Cached per kernel, configuration and device, since launches on hot paths
// (rms_norm, decoding) size their grids by it. `op` names the caller in an error.
template <class Kernel>
int resident_blocks_per_sm(const char* op, Kernel* kernel, int threads, size_t bytes) {
  return cached_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, bytes, [&] {
    allow_dynamic_shared(op, kernel, bytes);
    int per_sm = 0;
    HAM_CUDA_CHECK_CTX(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes), op,
        ": occupancy of a block of ", threads, " threads with ", bytes, " bytes of shared memory");
    return per_sm;
  });
}

// Grid-stride loop over [0, n) with 64-bit indices.
#define HAM_GRID_STRIDE_LOOP(i, n)                                                   \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(n); \
       i += int64_t(blockDim.x) * gridDim.x)

template <class C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// max that ignores NaN in `v` the way the CPU's `v > m ? v : m` loop does.
template <class C>
__device__ __forceinline__ C warp_max(C v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    C other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over the whole block (every thread gets the result). blockDim.x must be a multiple
// of 32 and at most 1024; every thread of the block must call it.
template <class C>
__device__ C block_sum(C v) {
  HAM_STATIC_SHARED(C, partial, [32]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : C(0);
  return warp_sum(v);
}

template <class C>
__device__ C block_max(C v, C lowest) {
  HAM_STATIC_SHARED(C, partial, [32]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : lowest;
  return warp_max(v);
}

// A row handled by one warp (kWarp) or by the whole block: where this thread starts, its
// stride, and the group reductions.
template <bool kWarp>
struct RowGroup {
  __device__ static int lane() { return kWarp ? int(threadIdx.x % 32) : int(threadIdx.x); }
  __device__ static int size() { return kWarp ? 32 : int(blockDim.x); }
  template <class C>
  __device__ static C sum(C v) {
    if constexpr (kWarp) return warp_sum(v);
    else return block_sum(v);
  }
  template <class C>
  __device__ static C max(C v, C lowest) {
    if constexpr (kWarp) return warp_max(v);
    else return block_max(v, lowest);
  }
};

// Launch shape for one row per warp (kWarpRowsPerBlock rows per block) or one row per block.
constexpr int kWarpRowsPerBlock = kThreads / 32;
inline unsigned warp_row_blocks(int64_t rows) {
  return unsigned((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
}
// Rows up to this long get a warp each; longer rows get a block.
constexpr int64_t kWarpRowMax = 1024;

// Launches `warp_kernel` (one warp per row, for rows of at most kWarpRowMax elements) or
// `block_kernel` (one block per row, with `block_shared_bytes` of dynamic shared memory)
// over `rows` rows, and checks the launch. `op` names the caller in an error.
template <class... KernelArgs, class... Args>
void launch_rows_shared(const char* op, int64_t rows, int64_t row_length,
                        size_t block_shared_bytes, void (*warp_kernel)(KernelArgs...),
                        void (*block_kernel)(KernelArgs...), Args... args) {
  if (rows == 0) return;
  if (row_length <= kWarpRowMax) {
    HAM_LAUNCH(warp_row_blocks(rows), kThreads, 0, launch_stream(), warp_kernel)(
        KernelArgs(args)...);
  } else {
    HAM_CHECK(rows < (int64_t(1) << 31), op, ": ", rows, " rows exceed the grid");
    allow_dynamic_shared(op, block_kernel, block_shared_bytes);
    HAM_LAUNCH(unsigned(rows), kThreads, block_shared_bytes, launch_stream(), block_kernel)(
        KernelArgs(args)...);
  }
  HAM_CUDA_CHECK_LAUNCH();
}

// launch_rows_shared without shared memory.
template <class... KernelArgs, class... Args>
void launch_rows(int64_t rows, int64_t row_length, void (*warp_kernel)(KernelArgs...),
                 void (*block_kernel)(KernelArgs...), Args... args) {
  launch_rows_shared("cuda", rows, row_length, 0, warp_kernel, block_kernel, args...);
}

// ---- Vectorised element-wise maps over contiguous tensors ----
// When every pointer is 16-byte aligned, each thread moves 16 bytes at a time (4 f32,
// 8 bf16, 2 f64) as one Pack; the n % width tail runs element by element. The functor
// maps compute-type values: f(x) or f(x, y).

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <class T>
constexpr int kPackWidth = int(16 / sizeof(T));

__host__ __device__ inline bool aligned_16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether rows of length d at these pointers (null ones ignored) can move as 16-byte packs.
template <class T>
bool rows_packable(int64_t d, std::initializer_list<const void*> pointers) {
  if (d % kPackWidth<T> != 0) return false;
  for (const void* p : pointers) {
    if (p && !aligned_16(p)) return false;
  }
  return true;
}

// out[i] = f(x[i])
template <int N, class T, class F>
__global__ void map1_kernel(const T* x, T* out, int64_t n, F f) {
  using P = Pack<T, N>;
  const int64_t packs = n / N;
  HAM_GRID_STRIDE_LOOP(k, packs) {
    const P in = reinterpret_cast<const P*>(x)[k];
    P result;
#pragma unroll
    for (int e = 0; e < N; ++e) result.v[e] = store<T>(f(load(in.v[e])));
    reinterpret_cast<P*>(out)[k] = result;
  }
  HAM_GRID_STRIDE_LOOP(k, n - packs * N) {
    const int64_t i = packs * N + k;
    out[i] = store<T>(f(load(x[i])));
  }
}

// out[i] = f(a[i], b[i])   (out may be a: an in-place update)
template <int N, class T, class F>
__global__ void map2_kernel(const T* a, const T* b, T* out, int64_t n, F f) {
  using P = Pack<T, N>;
  const int64_t packs = n / N;
  HAM_GRID_STRIDE_LOOP(k, packs) {
    const P pa = reinterpret_cast<const P*>(a)[k];
    const P pb = reinterpret_cast<const P*>(b)[k];
    P result;
#pragma unroll
    for (int e = 0; e < N; ++e) result.v[e] = store<T>(f(load(pa.v[e]), load(pb.v[e])));
    reinterpret_cast<P*>(out)[k] = result;
  }
  HAM_GRID_STRIDE_LOOP(k, n - packs * N) {
    const int64_t i = packs * N + k;
    out[i] = store<T>(f(load(a[i]), load(b[i])));
  }
}

template <class T, class F>
void launch_map1(const T* x, T* out, int64_t n, F f) {
  if (n == 0) return;
  if (aligned_16(x) && aligned_16(out)) {
    constexpr int N = kPackWidth<T>;
    HAM_LAUNCH(grid_for(std::max<int64_t>(n / N, 1)), kThreads, 0, launch_stream(), map1_kernel<N>)(
        x, out, n, f);
  } else {
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), map1_kernel<1>)(x, out, n, f);
  }
  HAM_CUDA_CHECK_LAUNCH();
}

template <class T, class F>
void launch_map2(const T* a, const T* b, T* out, int64_t n, F f) {
  if (n == 0) return;
  if (aligned_16(a) && aligned_16(b) && aligned_16(out)) {
    constexpr int N = kPackWidth<T>;
    HAM_LAUNCH(grid_for(std::max<int64_t>(n / N, 1)), kThreads, 0, launch_stream(), map2_kernel<N>)(
        a, b, out, n, f);
  } else {
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), map2_kernel<1>)(a, b, out, n, f);
  }
  HAM_CUDA_CHECK_LAUNCH();
}

// Throws the CPU kernel's message (cpu::check_index_range) when an entry of `index`
// lies outside [0, limit). One device pass; the index is copied to the host only to
// word the error. Synchronises with the device.
void check_index_range(const char* op, const char* what, const Tensor& index, int64_t limit,
                       const std::string& why);

}  // namespace ham::cuda

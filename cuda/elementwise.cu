// CUDA kernels of core/ops/elementwise.h:
//   binary:  out[i] = a[bcast_a(i)] (op) b[bcast_b(i)],  op in {+, -, *, /}
//   axpy:    dst += alpha * src
//   scale:   x *= alpha
//   sum_to:  out = sum of `in` over the dims where out (right-aligned) is 1 or missing
// Elements are computed in f32 (f64 for f64) and rounded on store.
#include <cstdint>
#include <vector>

#include "core/ops/elementwise.h"
#include "cuda/launch.h"
#include "cuda/reduce_utils.cuh"

namespace ham::cuda {

namespace {

constexpr int kMaxDims = 8;

template <class C>
__device__ __forceinline__ C apply(BinaryOp op, C x, C y) {
  switch (op) {
    case BinaryOp::Add: return x + y;
    case BinaryOp::Sub: return x - y;
    case BinaryOp::Mul: return x * y;
    case BinaryOp::Div: return x / y;
  }
  return C(0);
}

// Same shapes: out[i] = a[i] op b[i] (vectorised map).
template <class C>
struct BinaryFn {
  BinaryOp op;
  __device__ C operator()(C x, C y) const { return apply<C>(op, x, y); }
};

// b is a trailing block of out (a bias): out[i] = a[i] op b[i % inner].
template <class T>
__global__ void binary_trailing(BinaryOp op, const T* a, const T* b, T* out, int64_t n,
                                int64_t inner) {
  using C = compute_t<T>;
  HAM_GRID_STRIDE_LOOP(i, n) out[i] = store<T>(apply<C>(op, load(a[i]), load(b[i % inner])));
}

// Any broadcast: the flat out index is decoded into coordinates, each operand's offset is
// sum of coordinate * stride (stride 0 where the operand is stretched).
struct BroadcastStrides {
  int rank = 0;
  int64_t out[kMaxDims] = {}, a[kMaxDims] = {}, b[kMaxDims] = {};
};

template <class T>
__global__ void binary_broadcast(BinaryOp op, const T* a, const T* b, T* out, int64_t n,
                                 BroadcastStrides s) {
  using C = compute_t<T>;
  HAM_GRID_STRIDE_LOOP(i, n) {
    int64_t flat = i, ia = 0, ib = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      int64_t idx = flat % s.out[d];
      flat /= s.out[d];
      ia += idx * s.a[d];
      ib += idx * s.b[d];
    }
    out[i] = store<T>(apply<C>(op, load(a[ia]), load(b[ib])));
  }
}

// Element strides of `shape` seen through the broadcast shape `out` (0 where stretched).
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    size_t d = shape.size() - 1 - k, o = out.size() - 1 - k;
    strides[o] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

// True when `s`, less its leading 1s, equals the last dims of `out`.
bool is_trailing_block(const Shape& s, const Shape& out) {
  size_t k = 0;
  while (k < s.size() && s[k] == 1) ++k;
  size_t len = s.size() - k;
  if (len > out.size()) return false;
  return std::equal(s.begin() + int64_t(k), s.end(), out.end() - int64_t(len));
}

// axpy: dst = dst + alpha src;  scale: x = x alpha  (vectorised maps, in place)
template <class C>
struct AxpyFn {
  C alpha;
  __device__ C operator()(C d, C s) const { return d + alpha * s; }
};
template <class C>
struct ScaleFn {
  C alpha;
  __device__ C operator()(C x) const { return x * alpha; }
};

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  use_device_of(out);
  dispatch_floating(binary_op_name(op), a.dtype(), [&]<class T>() {
    const T* pa = ptr<const T>(a);
    const T* pb = ptr<const T>(b);
    T* po = ptr<T>(out);
    if (a.shape() == out.shape() && b.shape() == out.shape()) {
      launch_map2(pa, pb, po, n, BinaryFn<compute_t<T>>{op});
      return;
    }
    if (a.shape() == out.shape() && is_trailing_block(b.shape(), out.shape()) &&
        b.numel() > 0) {
      HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), binary_trailing)(
          op, pa, pb, po, n, b.numel());
    } else {
      const Shape& shape = out.shape();
      HAM_CHECK(shape.size() <= size_t(kMaxDims), binary_op_name(op),
                ": CUDA broadcast takes at most ", kMaxDims, " dims, got ", shape_str(shape));
      BroadcastStrides s;
      s.rank = int(shape.size());
      std::vector<int64_t> sa = broadcast_strides(a.shape(), shape);
      std::vector<int64_t> sb = broadcast_strides(b.shape(), shape);
      for (int d = 0; d < s.rank; ++d) {
        s.out[d] = shape[size_t(d)];
        s.a[d] = sa[size_t(d)];
        s.b[d] = sb[size_t(d)];
      }
      HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), binary_broadcast)(op, pa, pb, po, n, s);
    }
    HAM_CUDA_CHECK_LAUNCH();
  });
}

void axpy(double alpha, const Tensor& src, Tensor& dst) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  use_device_of(dst);
  dispatch_floating("axpy_", dst.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    launch_map2(ptr<const T>(dst), ptr<const T>(src), ptr<T>(dst), n, AxpyFn<C>{C(alpha)});
  });
}

void scale(double alpha, Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  use_device_of(x);
  dispatch_floating("scale_", x.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    launch_map1(ptr<const T>(x), ptr<T>(x), n, ScaleFn<C>{C(alpha)});
  });
}

// sum_to reduces each maximal run of consecutive reduced dims as the middle of an
// [outer, len, inner] view, one run after another (innermost first), keeping
// intermediate sums in the compute type; the last run rounds to the output dtype.
void sum_to(const Tensor& in, Tensor& out) {
  const int64_t n_out = out.numel();
  if (n_out == 0) return;
  use_device_of(out);
  dispatch_floating("sum_to", in.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    const Shape& in_shape = in.shape();
    const size_t rank = in_shape.size();
    // out's shape right-aligned to in's rank (missing leading dims are reduced).
    Shape target(rank, 1);
    const Shape& os = out.shape();
    for (size_t k = 0; k < os.size(); ++k) target[rank - os.size() + k] = os[k];
    std::vector<bool> reduced(rank);
    for (size_t d = 0; d < rank; ++d) reduced[d] = target[d] == 1 && in_shape[d] != 1;

    // Runs [begin, end) of reduced dims, innermost first.
    std::vector<std::pair<size_t, size_t>> runs;
    for (size_t d = rank; d-- > 0;) {
      if (!reduced[d]) continue;
      size_t end = d + 1;
      while (d > 0 && reduced[d - 1]) --d;
      runs.push_back({d, end});
    }
    if (runs.empty()) {  // nothing to reduce: same element count, a copy
      HAM_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), in.raw_data(), out.nbytes(),
                                     cudaMemcpyDeviceToDevice, launch_stream()));
      return;
    }
    Shape current = in_shape;
    Tensor source = in;  // T for the first run, C afterwards
    for (size_t r = 0; r < runs.size(); ++r) {
      auto [begin, end] = runs[r];
      int64_t outer = 1, len = 1, inner = 1;
      for (size_t d = 0; d < rank; ++d) {
        if (d < begin) outer *= current[d];
        else if (d < end) len *= current[d];
        else inner *= current[d];
      }
      for (size_t d = begin; d < end; ++d) current[d] = 1;
      const bool last = r + 1 == runs.size();
      Tensor dest = last ? out : Tensor::empty({outer * inner}, compute_dtype<T>(), out.device());
      auto run = [&]<class In, class Out>() {
        reduce_middle<C>(out.device(), outer, len, inner, ReadMiddle<In, C>{ptr<const In>(source), len, inner},
                         StoreScaled<Out, C>{ptr<Out>(dest), C(1)});
      };
      if (r == 0 && last) run.template operator()<T, T>();
      else if (r == 0) run.template operator()<T, C>();
      else if (last) run.template operator()<C, T>();
      else run.template operator()<C, C>();
      source = dest;
    }
  });
}

const bool registered = [] {
  binary_kernels().register_kernel(DeviceKind::CUDA, &binary);
  axpy_kernels().register_kernel(DeviceKind::CUDA, &axpy);
  scale_kernels().register_kernel(DeviceKind::CUDA, &scale);
  sum_to_kernels().register_kernel(DeviceKind::CUDA, &sum_to);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

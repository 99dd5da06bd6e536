// CUDA kernel of core/ops/cast.h: out[i] = x[i] in out's dtype, the CPU's conversion
// (core/dtype.cpp convert_elements): to bf16 rounds to nearest even (f64 through f32),
// bf16 widens exactly, floating to integer truncates toward zero.
#include <cstdint>

#include "core/ops/cast.h"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

// Calls fn.template operator()<T>() with T the device type of `dtype`.
template <class Fn>
void visit_device_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: fn.template operator()<float>(); return;
    case DType::F64: fn.template operator()<double>(); return;
    case DType::BF16: fn.template operator()<bf16>(); return;
    case DType::I32: fn.template operator()<int32_t>(); return;
    case DType::I64: fn.template operator()<int64_t>(); return;
    case DType::U8: fn.template operator()<uint8_t>(); return;
  }
  HAM_FAIL("cast: invalid dtype ", int(dtype));
}

template <class D, class S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<S, bf16> && std::is_same_v<D, bf16>) {
    return v;
  } else if constexpr (std::is_same_v<S, bf16>) {
    return D(__bfloat162float(v));
  } else if constexpr (std::is_same_v<D, bf16>) {
    return __float2bfloat16_rn(float(v));
  } else {
    return D(v);
  }
}

template <class S, class D>
__global__ void cast_kernel(const S* x, D* out, int64_t n) {
  HAM_GRID_STRIDE_LOOP(i, n) out[i] = convert<D>(x[i]);
}

void cast(const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  use_device_of(x);
  visit_device_dtype(x.dtype(), [&]<class S>() {
    visit_device_dtype(out.dtype(), [&]<class D>() {
      HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), cast_kernel)(
          ptr<const S>(x), ptr<D>(out), n);
      HAM_CUDA_CHECK_LAUNCH();
    });
  });
}

const bool registered = [] {
  cast_kernels().register_kernel(DeviceKind::CUDA, &cast);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

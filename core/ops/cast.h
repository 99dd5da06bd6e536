#pragma once
// cast: element-wise dtype conversion, out[i] = x[i] in out's dtype, on any device.
//   to bf16:           round to nearest even (f64 goes through f32), NaN stays NaN
//   bf16 to f32/f64:   exact
//   floating to int:   truncation toward zero (out-of-range values are undefined)
// The only kernel that reads and writes bf16 natively on the CPU: every other CPU kernel
// gets bf16 tensors widened to f32 (core/bf16_widening.h), which uses this conversion.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

HAM_DECLARE_KERNEL_TABLE(cast, void(const Tensor& x, Tensor& out));

namespace ops {

// x converted to `dtype` (x itself when it has that dtype already), on x's device.
Tensor cast(const Tensor& x, DType dtype);
// out = x converted to out's dtype; same shape and device, any two dtypes.
void cast_into(const Tensor& x, Tensor& out);

}  // namespace ops

namespace cpu {
void cast(const Tensor& x, Tensor& out);
}

}  // namespace ham

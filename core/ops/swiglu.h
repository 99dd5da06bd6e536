#pragma once
// SwiGLU's gating, the MLP's silu(gate) * up, as one op:
//   out   = silu(gate) up = gate sigmoid(gate) up
// Backward, s = sigmoid(gate):
//   dgate = dout up s (1 + gate (1 - s))
//   dup   = dout gate s
// One pass each way where silu then mul take two forward and three backward (mul's two
// products and silu's backward), and silu(gate) is never stored: the backward keeps the
// GEMMs' outputs gate and up, which it needs anyway.
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

HAM_DECLARE_KERNEL_TABLE(swiglu, void(const Tensor& gate, const Tensor& up, Tensor& out));
// Fills each gradient that is defined on entry (an undefined one is not wanted).
HAM_DECLARE_KERNEL_TABLE(swiglu_backward, void(const Tensor& dout, const Tensor& gate,
                                               const Tensor& up, Tensor& dgate, Tensor& dup));

namespace ops {

struct SwigluGrads {
  Tensor dgate, dup;
};

// gate and up (and dout) of one shape, floating dtype and device; errors name the op.
Tensor swiglu(const Tensor& gate, const Tensor& up);
SwigluGrads swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up,
                            bool want_dgate, bool want_dup);

}  // namespace ops

namespace cpu {
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup);
}  // namespace cpu

}  // namespace ham

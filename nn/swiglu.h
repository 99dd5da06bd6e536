#pragma once
// Differentiable SwiGLU gating, silu(gate) * up as one op (formulas and why in
// core/ops/swiglu.h): equal to mul(silu(gate), up), with one kernel each way and no
// silu(gate) kept for the backward.
#include "core/tensor.h"

namespace ham {

Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace ham

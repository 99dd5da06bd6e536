#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/cast.h"
#include "core/ops/optim.h"

namespace ham::cpu {

void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWHyper& h) {
  HAM_CHECK(param.dtype() == grad.dtype() && param.dtype() == exp_avg.dtype(),
            "adamw_step: CPU kernel wants param, grad and moments in one dtype, got ",
            param.str(), ", ", grad.str(), ", ", exp_avg.str());
  dispatch_floating("adamw_step", param.dtype(), [&]<class T>() {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    const double bias1 = 1.0 - std::pow(h.beta1, double(h.step));
    const double bias2 = 1.0 - std::pow(h.beta2, double(h.step));
    const T decay = T(1.0 - h.lr * h.weight_decay);
    const T b1 = T(h.beta1), b2 = T(h.beta2);
    const T step_size = T(h.lr / bias1);
    const T inv_sqrt_bias2 = T(1.0 / std::sqrt(bias2));
    const T eps = T(h.eps);
    const T grad_scale = T(h.grad_scale);  // x 1 is exact: unscaled gradients stay as they are
    parallel_for(param.numel(), 4, [&](int64_t i) {
      const T gi = g[i] * grad_scale;
      m[i] = b1 * m[i] + (T(1) - b1) * gi;
      v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
      p[i] = p[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bias2 + eps);
    });
  });
}

// The per-tensor kernel on each entry in turn, so every entry is bit-identical to
// adamw_step on that tensor, then the cast of the updated tensor into its rounded copy.
void adamw_step_multi(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                      std::vector<Tensor>& rounded, const AdamWHyper& hyper) {
  for (size_t i = 0; i < params.size(); ++i) {
    adamw_step(params[i], grads[i], exp_avg[i], exp_avg_sq[i], hyper);
    if (!rounded.empty()) cast(params[i], rounded[i]);
  }
}

double squared_norm(const Tensor& x) {
  double total = 0;
  dispatch_floating("squared_norm", x.dtype(), [&]<class T>() {
    const T* p = x.data<T>();
    int64_t n = x.numel();
    // Fixed-size blocks summed in order: the result does not depend on the thread count.
    constexpr int64_t kBlock = 4096;
    int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(size_t(blocks), 0.0);
    parallel_for(blocks, kBlock, [&](int64_t b) {
      double acc = 0;
      for (int64_t i = b * kBlock, end = std::min(n, (b + 1) * kBlock); i < end; ++i) {
        acc += double(p[i]) * double(p[i]);
      }
      partial[size_t(b)] = acc;
    });
    for (double s : partial) total += s;
  });
  return total;
}

// The loop over squared_norm: bit-identical to it.
std::vector<double> squared_norms(const std::vector<Tensor>& xs) {
  std::vector<double> norms;
  norms.reserve(xs.size());
  for (const Tensor& x : xs) norms.push_back(squared_norm(x));
  return norms;
}

}  // namespace ham::cpu

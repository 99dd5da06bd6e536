// CPU gated delta rule decoding step (core/ops/gated_delta_rule_decode.h): one (b, h) pair
// per task, its state slice advanced in place token by token with the recurrence step the
// naive kernel uses (core/cpu/gated_delta_rule_step.h).
#include "core/ops/gated_delta_rule_decode.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/gated_delta_rule_step.h"
#include "core/cpu/parallel.h"

namespace ham::cpu {

void gated_delta_rule_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                             const Tensor& beta, Tensor& state, Tensor& o, Tensor& fit_error) {
  dispatch_floating("gated_delta_rule_decode", q.dtype(), [&]<class Scalar>() {
    const int64_t B = q.size(0), n = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
    const Scalar *pq = q.data<Scalar>(), *pk = k.data<Scalar>(), *pv = v.data<Scalar>(),
                 *pg = g.data<Scalar>(), *pbeta = beta.data<Scalar>();
    Scalar *ps = state.data<Scalar>(), *po = o.data<Scalar>(), *pfit = fit_error.data<Scalar>();
    parallel_for(B * H, std::max<int64_t>(1, n * K * V), [&](int64_t pair) {
      const int64_t b = pair / H, h = pair % H;
      std::vector<Scalar> p(static_cast<size_t>(V)), r(static_cast<size_t>(V));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t row = (b * n + t) * H + h;  // index into [B, n, H]
        pfit[row] = gated_delta_rule_token(ps + pair * K * V, K, V, pq + row * K, pk + row * K,
                                           pv + row * V, pg[row], pbeta[row], po + row * V,
                                           p.data(), r.data());
      }
    });
  });
}

}  // namespace ham::cpu

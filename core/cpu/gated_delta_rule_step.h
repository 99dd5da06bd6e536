#pragma once
// One token of the gated delta rule's recurrence (core/ops/gated_delta_rule.h) on a state
// S [K, V] (row-major) in place, straight from the definition with plain loops: the step of
// the token-by-token CPU kernels, gated_delta_rule_naive (the test reference) and
// gated_delta_rule_decode.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ham::cpu {

// fit_error = 1 - <p, v> / (||p|| ||v|| + kFitEpsilon)
inline constexpr double kFitEpsilon = 1e-6;

// S <- e^g S;  p = S^T k;  fit = 1 - <p, v> / (||p|| ||v|| + eps);  S += beta k (v - p)^T;
// o = S^T q. p and r are scratch of V elements. Returns fit.
template <class Scalar>
Scalar gated_delta_rule_token(Scalar* S, int64_t K, int64_t V, const Scalar* q, const Scalar* k,
                              const Scalar* v, Scalar g, Scalar beta, Scalar* o, Scalar* p,
                              Scalar* r) {
  const Scalar decay = std::exp(g);
  for (int64_t i = 0; i < K * V; ++i) S[i] *= decay;
  // p = S^T k (rows of S in order)
  std::fill(p, p + V, Scalar(0));
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t j = 0; j < V; ++j) p[j] += S[i * V + j] * k[i];
  }
  Scalar pv = 0, pp = 0, vv = 0;
  for (int64_t j = 0; j < V; ++j) {
    pv += p[j] * v[j];
    pp += p[j] * p[j];
    vv += v[j] * v[j];
    r[j] = v[j] - p[j];
  }
  // S += beta k r^T
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t j = 0; j < V; ++j) S[i * V + j] += beta * k[i] * r[j];
  }
  // o = S^T q
  std::fill(o, o + V, Scalar(0));
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t j = 0; j < V; ++j) o[j] += S[i * V + j] * q[i];
  }
  return Scalar(1) - pv / (std::sqrt(pp) * std::sqrt(vv) + Scalar(kFitEpsilon));
}

}  // namespace ham::cpu

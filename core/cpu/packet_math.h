#pragma once
// Math on Eigen packets (8 floats or 4 doubles under AVX2) for the CPU kernels whose
// transcendentals the compiler cannot vectorize from glibc's scalar functions: the unary
// ops' exp, sigmoid, silu, softplus and tanh, and the gated rms_norm's silu. Eigen's pexp and
// plog are within about an ulp of glibc's; tests/nn/test_unary.cpp measures the functions
// built on them against f64.
#include <Eigen/Core>
#include <numbers>

namespace ham::cpu {

namespace pk = Eigen::internal;

template <class P>
P packet_ones() {
  return pk::pset1<P>(typename pk::unpacket_traits<P>::type(1));
}

// e^x by Eigen's generic pexp_float / pexp_double (Cody-Waite reduction, then a
// polynomial). Not pk::pexp: under AVX-512 Eigen 3.4 swaps in a Packet16f exp of its own,
// measured 4.1 ulps from f64 near x = 80, where the generic one (AVX2's pexp) stays
// within the 1.5 ulps tests/nn/test_unary.cpp allows.
template <class P>
P exp_reduced_packet(const P& x) {
  using T = typename pk::unpacket_traits<P>::type;
  if constexpr (sizeof(T) == 4) return pk::pexp_float(x);
  else return pk::pexp_double(x);
}

// e^x. pexp clamps x at about -88.7 (f32) or -709.8 (f64), so far left it returns the
// clamp's e^x, not the subnormals nor 0. There e^x = e^(x + 64 ln 2) 2^-64 instead: the
// shifted argument stays in pexp's range and the scaling rounds once, into the subnormals.
template <class P>
P exp_packet(const P& x) {
  using T = typename pk::unpacket_traits<P>::type;
  constexpr T far_left = sizeof(T) == 4 ? T(-85) : T(-700);
  const P e = exp_reduced_packet(x);
  const P left = pk::pcmp_lt(x, pk::pset1<P>(far_left));
  if (!pk::predux_any(left)) return e;
  const P shifted = exp_reduced_packet(pk::padd(x, pk::pset1<P>(T(64 * std::numbers::ln2))));
  return pk::pselect(left, pk::pmul(shifted, pk::pset1<P>(T(0x1p-64))), e);
}

// sigmoid(x) and 1 - sigmoid(x) = sigmoid(-x), both from e = e^-|x| <= 1 (it never
// overflows): 1 / (1 + e) and e / (1 + e), whichever side x is on. Forming 1 - sigmoid(x)
// by subtraction would lose it to rounding for large x; far left, e keeps the subnormals.
// The `_from` forms take e = exp_minus_abs(x), for a kernel that needs both from one exp.
template <class P>
P exp_minus_abs(const P& x) {
  return exp_packet(pk::pnegate(pk::pabs(x)));
}

template <class P>
void sigmoid_and_complement_from(const P& x, const P& e, P& sigmoid, P& complement) {
  const P reciprocal = pk::pdiv(packet_ones<P>(), pk::padd(packet_ones<P>(), e));
  const P e_over = pk::pmul(e, reciprocal);
  const P negative = pk::pcmp_lt(x, pk::pzero(x));
  sigmoid = pk::pselect(negative, e_over, reciprocal);
  complement = pk::pselect(negative, reciprocal, e_over);
}

template <class P>
void sigmoid_and_complement(const P& x, P& sigmoid, P& complement) {
  sigmoid_and_complement_from(x, exp_minus_abs(x), sigmoid, complement);
}

// factor sigmoid(x) as (factor e^-|x| or factor) / (1 + e^-|x|), one rounding fewer than a
// product with sigmoid_and_complement's: sigmoid with factor 1, silu with factor x.
template <class P>
P scaled_sigmoid_from(const P& x, const P& e, const P& factor) {
  const P numerator = pk::pselect(pk::pcmp_lt(x, pk::pzero(x)), e, packet_ones<P>());
  return pk::pdiv(pk::pmul(factor, numerator), pk::padd(packet_ones<P>(), e));
}

template <class P>
P scaled_sigmoid_packet(const P& x, const P& factor) {
  return scaled_sigmoid_from(x, exp_minus_abs(x), factor);
}

// max(x, 0) + log1p(e^-|x|).
template <class P>
P softplus_packet(const P& x) {
  const P e = exp_packet(pk::pnegate(pk::pabs(x)));
  return pk::padd(pk::pmax(x, pk::pzero(x)), pk::generic_plog1p(e));
}

// tanh(|x|) = -m / (2 + m), m = e^(-2|x|) - 1 by Eigen's expm1 (exact near 0, where
// 1 - e^(-2|x|) would cancel), with x's sign; +-1 at the infinities.
template <class P>
P tanh_packet(const P& x) {
  using T = typename pk::unpacket_traits<P>::type;
  const P m = pk::generic_expm1(pk::pmul(pk::pset1<P>(T(-2)), pk::pabs(x)));
  const P magnitude = pk::pdiv(pk::pnegate(m), pk::padd(pk::pset1<P>(T(2)), m));
  return pk::pselect(pk::pcmp_lt(x, pk::pzero(x)), pk::pnegate(magnitude), magnitude);
}

}  // namespace ham::cpu

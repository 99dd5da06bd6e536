#include "core/cpu/packet_exp_warnings.h"  // first: see there

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "core/cpu/packet_math.h"
#include "core/cpu/packets.h"
#include "core/cpu/parallel.h"
#include "core/ops/unary.h"

namespace ham::cpu {

namespace {

// Per-element cost hint: most of these call a transcendental function.
constexpr int64_t kUnaryCost = 4;

// out[i] = f(in[i])
template <class T, class F>
void map(const Tensor& in, Tensor& out, F f) {
  const T* x = in.data<T>();
  T* y = out.data<T>();
  parallel_for(in.numel(), kUnaryCost, [&](int64_t i) { y[i] = f(x[i]); });
}

// out[i] = f(a[i], b[i])
template <class T, class F>
void zip(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  parallel_for(out.numel(), kUnaryCost, [&](int64_t i) { po[i] = f(pa[i], pb[i]); });
}

// Packet twins of map and zip for the vectorized functions.
template <class T, class F>
void map_packets(const Tensor& in, Tensor& out, F f) {
  packet_map<T>(in.data<T>(), out.data<T>(), in.numel(), kUnaryCost, f);
}

template <class T, class F>
void zip_packets(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  packet_zip<T>(a.data<T>(), b.data<T>(), out.data<T>(), out.numel(), kUnaryCost, f);
}

template <class T>
T gelu_cdf(T x) {  // Phi(x) = 0.5 (1 + erf(x / sqrt 2))
  return T(0.5) * (T(1) + std::erf(x * (T(1) / std::numbers::sqrt2_v<T>)));
}

template <class T>
T gelu_pdf(T x) {  // phi(x) = e^(-x^2 / 2) / sqrt(2 pi)
  constexpr T inv_sqrt_2pi = std::numbers::inv_sqrtpi_v<T> / std::numbers::sqrt2_v<T>;
  return inv_sqrt_2pi * std::exp(T(-0.5) * x * x);
}

}  // namespace

void unary(UnaryOp op, const Tensor& x, Tensor& y) {
  dispatch_floating(unary_op_name(op), x.dtype(), [&]<class T>() {
    using P = Packet<T>;
    switch (op) {
      case UnaryOp::Exp: map_packets<T>(x, y, [](P v) { return exp_packet(v); }); break;
      case UnaryOp::Log: map_packets<T>(x, y, [](P v) { return pk::plog(v); }); break;
      case UnaryOp::Sigmoid:
        map_packets<T>(x, y, [](P v) { return scaled_sigmoid_packet(v, packet_ones<P>()); });
        break;
      case UnaryOp::Silu:
        map_packets<T>(x, y, [](P v) { return scaled_sigmoid_packet(v, v); });
        break;
      case UnaryOp::Softplus: map_packets<T>(x, y, [](P v) { return softplus_packet(v); }); break;
      case UnaryOp::Gelu: map<T>(x, y, [](T v) { return v * gelu_cdf(v); }); break;
      case UnaryOp::Tanh: map_packets<T>(x, y, [](P v) { return tanh_packet(v); }); break;
      case UnaryOp::Neg: map<T>(x, y, [](T v) { return -v; }); break;
      case UnaryOp::Square: map<T>(x, y, [](T v) { return v * v; }); break;
      case UnaryOp::Sqrt: map<T>(x, y, [](T v) { return std::sqrt(v); }); break;
      case UnaryOp::Relu: map<T>(x, y, [](T v) { return std::max(v, T(0)); }); break;
    }
  });
}

void unary_backward(UnaryOp op, const Tensor& dy, const Tensor& saved, Tensor& dx) {
  dispatch_floating(unary_op_name(op), dy.dtype(), [&]<class T>() {
    using P = Packet<T>;
    // s is x or y as unary_saves(op) says.
    switch (op) {
      case UnaryOp::Exp: zip<T>(dy, saved, dx, [](T g, T s) { return g * s; }); break;
      case UnaryOp::Log: zip<T>(dy, saved, dx, [](T g, T s) { return g / s; }); break;
      case UnaryOp::Sigmoid:
        zip<T>(dy, saved, dx, [](T g, T s) { return g * s * (T(1) - s); });
        break;
      case UnaryOp::Silu:  // d/dx x sig(x) = sig(x) (1 + x (1 - sig(x)))
        zip_packets<T>(dy, saved, dx, [](P g, P s) {
          P sig, complement;
          sigmoid_and_complement(s, sig, complement);
          return pk::pmul(pk::pmul(g, sig), pk::pmadd(s, complement, packet_ones<P>()));
        });
        break;
      case UnaryOp::Softplus:
        zip_packets<T>(dy, saved, dx, [](P g, P s) { return scaled_sigmoid_packet(s, g); });
        break;
      case UnaryOp::Gelu:  // d/dx x Phi(x) = Phi(x) + x phi(x)
        zip<T>(dy, saved, dx, [](T g, T s) { return g * (gelu_cdf(s) + s * gelu_pdf(s)); });
        break;
      case UnaryOp::Tanh:  // 1 - s^2 in one rounding: near |s| = 1 a rounded s^2 would cancel
        zip<T>(dy, saved, dx, [](T g, T s) { return g * std::fma(-s, s, T(1)); });
        break;
      case UnaryOp::Neg: map<T>(dy, dx, [](T g) { return -g; }); break;
      case UnaryOp::Square: zip<T>(dy, saved, dx, [](T g, T s) { return T(2) * s * g; }); break;
      case UnaryOp::Sqrt: zip<T>(dy, saved, dx, [](T g, T s) { return g / (T(2) * s); }); break;
      case UnaryOp::Relu:
        zip<T>(dy, saved, dx, [](T g, T s) { return s > T(0) ? g : T(0); });
        break;
    }
  });
}

}  // namespace ham::cpu

#pragma once
// Loops that apply a function of Eigen packets (8 floats or 4 doubles under AVX2) to whole
// arrays, for the element-wise kernels whose math (exp, log) the compiler cannot vectorize
// on its own. Every element goes through the same packet code, the last few included: the
// tail is padded to a whole packet rather than run through a scalar twin, so an element's
// result does not depend on where it sits in the array or on how threads split the loop.
#include <Eigen/Core>
#include <algorithm>
#include <cstdint>

#include "core/cpu/parallel.h"

namespace ham::cpu {

template <class T>
using Packet = typename Eigen::internal::packet_traits<T>::type;

template <class T>
constexpr int64_t kPacketSize = Eigen::internal::unpacket_traits<Packet<T>>::size;

// A packet of in[0, count), padded with ones (a value every function here takes).
template <class T>
Packet<T> load_padded(const T* in, int64_t count) {
  if (count == kPacketSize<T>) return Eigen::internal::ploadu<Packet<T>>(in);
  T padded[kPacketSize<T>];
  std::fill(padded, padded + kPacketSize<T>, T(1));
  std::copy(in, in + count, padded);
  return Eigen::internal::ploadu<Packet<T>>(padded);
}

// The first `count` values of a packet to out[0, count).
template <class T>
void store_partial(T* out, const Packet<T>& value, int64_t count) {
  if (count == kPacketSize<T>) return Eigen::internal::pstoreu(out, value);
  T whole[kPacketSize<T>];
  Eigen::internal::pstoreu(whole, value);
  std::copy(whole, whole + count, out);
}

// body(i, count) for the packets of [0, n), on the calling thread (inside a kernel's own
// parallel loop); count < kPacketSize only for the last one.
template <class T, class Body>
void for_each_packet_serial(int64_t n, Body&& body) {
  constexpr int64_t size = kPacketSize<T>;
  for (int64_t i = 0; i < n; i += size) body(i, std::min(size, n - i));
}

namespace detail {

// The same over threads.
template <class T, class Body>
void for_each_packet(int64_t n, int64_t cost_per_element, Body&& body) {
  constexpr int64_t size = kPacketSize<T>;
  parallel_for((n + size - 1) / size, cost_per_element * size,
               [&](int64_t p) { body(p * size, std::min(size, n - p * size)); });
}

}  // namespace detail

// y[i] = f(x[i]) for i < n; f maps Packet<T> to Packet<T>.
template <class T, class F>
void packet_map(const T* x, T* y, int64_t n, int64_t cost_per_element, F f) {
  detail::for_each_packet<T>(n, cost_per_element, [&](int64_t i, int64_t count) {
    store_partial(y + i, f(load_padded(x + i, count)), count);
  });
}

// y[i] = f(a[i], b[i]) for i < n.
template <class T, class F>
void packet_zip(const T* a, const T* b, T* y, int64_t n, int64_t cost_per_element, F f) {
  detail::for_each_packet<T>(n, cost_per_element, [&](int64_t i, int64_t count) {
    store_partial(y + i, f(load_padded(a + i, count), load_padded(b + i, count)), count);
  });
}

}  // namespace ham::cpu

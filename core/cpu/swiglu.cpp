// GCC 12 warns falsely inside Eigen's AVX-512 packet exp (see core/cpu/unary.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "core/cpu/packet_math.h"
#include "core/cpu/packets.h"
#include "core/ops/swiglu.h"

namespace ham::cpu {

namespace {

constexpr int64_t kSwigluCost = 6;  // an exp and a few products an element

}  // namespace

// out = (gate up) sigmoid(gate), the product formed first so that sigmoid's division
// rounds once (scaled_sigmoid_packet).
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  dispatch_floating("swiglu", gate.dtype(), [&]<class T>() {
    packet_zip<T>(gate.data<T>(), up.data<T>(), out.data<T>(), out.numel(), kSwigluCost,
                  [](Packet<T> g, Packet<T> u) { return scaled_sigmoid_packet(g, pk::pmul(g, u)); });
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  dispatch_floating("swiglu_backward", gate.dtype(), [&]<class T>() {
    const T* pd = dout.data<T>();
    const T* pg = gate.data<T>();
    const T* pu = up.data<T>();
    T* pdg = dgate.defined() ? dgate.data<T>() : nullptr;
    T* pdu = dup.defined() ? dup.data<T>() : nullptr;
    detail::for_each_packet<T>(gate.numel(), kSwigluCost, [&](int64_t i, int64_t count) {
      const Packet<T> d = load_padded(pd + i, count), g = load_padded(pg + i, count);
      Packet<T> s, complement;
      sigmoid_and_complement(g, s, complement);
      const Packet<T> ds = pk::pmul(d, s);  // dout s
      if (pdu) store_partial(pdu + i, pk::pmul(ds, g), count);
      if (pdg) {
        const Packet<T> u = load_padded(pu + i, count);
        const Packet<T> slope = pk::pmadd(g, complement, packet_ones<Packet<T>>());
        store_partial(pdg + i, pk::pmul(pk::pmul(ds, u), slope), count);
      }
    });
  });
}

}  // namespace ham::cpu

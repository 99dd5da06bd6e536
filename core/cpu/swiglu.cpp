#include "core/cpu/packet_exp_warnings.h"  // first: see there

#include <cstdint>

#include "core/cpu/packet_math.h"
#include "core/cpu/packets.h"
#include "core/ops/swiglu.h"

namespace ham::cpu {

namespace {

constexpr int64_t kSwigluCost = 6;  // an exp and a few products an element

}  // namespace

// Each value is rounded as the unary silu and then the product round it (silu as
// scaled_sigmoid_packet(g, g), core/cpu/unary.cpp), so the op gives mul(silu(gate), up) bit
// for bit on the CPU, forward and backward: fusing moves no training run's numbers there.

// out = silu(gate) up.
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  dispatch_floating("swiglu", gate.dtype(), [&]<class T>() {
    packet_zip<T>(gate.data<T>(), up.data<T>(), out.data<T>(), out.numel(), kSwigluCost,
                  [](Packet<T> g, Packet<T> u) {
                    return pk::pmul(scaled_sigmoid_packet(g, g), u);
                  });
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
      // dup = dout silu(gate); dgate = (dout up) silu'(gate), as the unary backward forms
      // silu': s (1 + gate (1 - s)). One exp for both.
      const Packet<T> e = exp_minus_abs(g);
      if (pdu) store_partial(pdu + i, pk::pmul(d, scaled_sigmoid_from(g, e, g)), count);
      if (pdg) {
        Packet<T> s, complement;
        sigmoid_and_complement_from(g, e, s, complement);
        const Packet<T> d_silu = pk::pmul(d, load_padded(pu + i, count));
        const Packet<T> slope = pk::pmadd(g, complement, packet_ones<Packet<T>>());
        store_partial(pdg + i, pk::pmul(pk::pmul(d_silu, s), slope), count);
      }
    });
  });
}

}  // namespace ham::cpu

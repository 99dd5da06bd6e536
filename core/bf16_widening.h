#pragma once
// bf16 on the CPU. CPU kernels compute in f32 or f64 only, so a CPU kernel called with bf16
// tensors runs on f32 copies of them, and what it wrote is rounded back into the bf16
// tensors (nearest even) when it returns. That is the CUDA kernels' contract as well (bf16
// is a storage format: loads widen to f32, stores round), so an op in bf16 gives on the CPU
// what it gives on a GPU, up to the order of f32 sums; this is what makes the CPU the
// reference for bf16 and lets bf16 training run (slowly) without a GPU.
//
// Outputs are the arguments a kernel takes by non-const reference (Tensor&,
// std::vector<Tensor>&, result structs); only those are written back. A struct that carries
// tensors declares them, next to its definition, with
//   template <class F> void for_each_tensor(S& s, F&& f)   (f(Tensor&) for each member)
// A tensor passed twice (an in-place op) gets one f32 stand-in. Kernels called with no bf16
// tensor run directly, with no copy.
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ham::bf16_widening {

template <class T>
concept TensorBundle = requires(T& t) { for_each_tensor(t, [](Tensor&) {}); };

template <class T>
constexpr bool kHoldsTensors =
    std::is_same_v<T, Tensor> || std::is_same_v<T, std::vector<Tensor>> || TensorBundle<T>;

// Calls f(Tensor&) on every tensor slot of `arg`, in a fixed order.
template <class T, class F>
void visit_slots(T& arg, F&& f) {
  if constexpr (std::is_same_v<T, Tensor>) {
    f(arg);
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    for (Tensor& t : arg) f(t);
  } else if constexpr (TensorBundle<T>) {
    for_each_tensor(arg, f);
  }
}

template <class T>
bool holds_bf16(const T& arg) {
  bool found = false;
  if constexpr (kHoldsTensors<T>) {
    visit_slots(const_cast<T&>(arg), [&](Tensor& t) {
      found = found || (t.defined() && t.dtype() == DType::BF16);
    });
  }
  return found;
}

// The f32 stand-ins of one kernel call, one per distinct bf16 tensor.
class Widening {
 public:
  // The f32 stand-in of a bf16 tensor (made on first sight); `output`: round it back
  // into `t` after the call.
  Tensor widen(const Tensor& t, bool output) {
    for (Entry& e : entries_) {
      if (e.original.impl() == t.impl()) {
        e.output = e.output || output;
        return e.wide;
      }
    }
    Tensor wide = Tensor::empty(t.shape(), DType::F32, t.device());
    convert_elements(t.raw_data(), DType::BF16, wide.raw_data(), DType::F32, t.numel());
    entries_.push_back({t, wide, output});
    return wide;
  }
  // The stand-in made for `t`, or an undefined tensor.
  Tensor stand_in(const Tensor& t) const {
    for (const Entry& e : entries_) {
      if (e.original.impl() == t.impl()) return e.wide;
    }
    return Tensor();
  }
  void write_back() const {
    for (const Entry& e : entries_) {
      if (!e.output) continue;
      convert_elements(e.wide.raw_data(), DType::F32, e.original.raw_data(), DType::BF16,
                       e.original.numel());
    }
  }

 private:
  struct Entry {
    Tensor original, wide;
    bool output;
  };
  std::vector<Entry> entries_;
};

// One kernel argument of declared type Param: a copy whose bf16 tensors are replaced by
// their stand-ins; outputs are copied back into the caller's argument after the call.
template <class Param>
class Arg {
 public:
  using Value = std::remove_cvref_t<Param>;
  static constexpr bool kOutput = std::is_lvalue_reference_v<Param> &&
                                  !std::is_const_v<std::remove_reference_t<Param>>;

  Arg(Param original, Widening& widening)
      : original_(static_cast<Param>(original)), value_(original) {
    if constexpr (kHoldsTensors<Value>) {
      visit_slots(value_, [&](Tensor& t) {
        if (t.defined() && t.dtype() == DType::BF16) t = widening.widen(t, kOutput);
      });
    }
  }
  Value& value() { return value_; }

  // After the call: a slot the kernel pointed at a new tensor is handed to the caller (in
  // bf16 where the caller's tensor was bf16); stand-ins written in place are rounded back
  // by Widening::write_back.
  void hand_back(const Widening& widening) {
    if constexpr (!kOutput) {
      return;
    } else if constexpr (kHoldsTensors<Value>) {
      std::vector<Tensor*> mine;
      visit_slots(value_, [&](Tensor& t) { mine.push_back(&t); });
      size_t i = 0;
      visit_slots(original_, [&](Tensor& caller) {
        HAM_CHECK(i < mine.size(), "bf16 widening: a kernel changed the number of its outputs");
        Tensor& got = *mine[i++];
        const bool was_bf16 = caller.defined() && caller.dtype() == DType::BF16;
        const Tensor expected = was_bf16 ? widening.stand_in(caller) : caller;
        if (got.impl() == expected.impl()) return;
        caller = (was_bf16 && got.defined() && got.dtype() == DType::F32) ? got.to(DType::BF16)
                                                                          : got;
      });
    } else {
      original_ = value_;
    }
  }

 private:
  Param original_;
  Value value_;
};

// The kernel `kernel`, called through f32 stand-ins when any argument holds bf16.
template <auto kernel, class R, class... Args>
R call_widened(Args... args) {
  if (!(holds_bf16(args) || ...)) return kernel(std::forward<Args>(args)...);
  Widening widening;
  std::tuple<Arg<Args>...> wrapped{Arg<Args>(std::forward<Args>(args), widening)...};
  auto finish = [&] {
    std::apply([&](auto&... a) { (a.hand_back(widening), ...); }, wrapped);
    widening.write_back();
  };
  if constexpr (std::is_void_v<R>) {
    std::apply([](auto&... a) { kernel(a.value()...); }, wrapped);
    finish();
  } else {
    R result = std::apply([](auto&... a) { return kernel(a.value()...); }, wrapped);
    finish();
    return result;
  }
}

}  // namespace ham::bf16_widening

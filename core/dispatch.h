#pragma once
// Op dispatch: each op owns a KernelTable that maps a device kind to its kernel. The CPU
// kernel is set where the table is defined (core/ops/*.cpp); cuda/ registers its kernels
// at load time, so core/ never includes CUDA code. CPU kernels take bf16 through f32
// stand-ins (core/bf16_widening.h) unless the table is defined BF16_NATIVE.
#include <array>
#include <utility>

#include "core/bf16_widening.h"
#include "core/device.h"
#include "core/error.h"
#include "core/profiler.h"

namespace ham {

template <class Signature>
class KernelTable;

template <class R, class... Args>
class KernelTable<R(Args...)> {
 public:
  using Kernel = R (*)(Args...);

  KernelTable(const char* op_name, Kernel cpu_kernel) : op_name_(op_name) {
    kernels_[size_t(DeviceKind::CPU)] = cpu_kernel;
  }

  void register_kernel(DeviceKind kind, Kernel kernel) { kernels_[size_t(kind)] = kernel; }
  bool has_kernel(DeviceKind kind) const { return kernels_[size_t(kind)] != nullptr; }

  template <class... CallArgs>
  R operator()(Device device, CallArgs&&... args) const {
    Kernel kernel = kernels_[size_t(device.kind)];
    if (!kernel && is_emulated_on_cpu(device.kind)) kernel = kernels_[size_t(DeviceKind::CPU)];
    HAM_CHECK(kernel, "op '", op_name_, "' has no kernel for device ", device.str());
    profiler::OpScope timed(op_name_, device, args...);  // where `ham train --profile` runs
    return kernel(std::forward<CallArgs>(args)...);
  }

  const char* op_name() const { return op_name_; }

  // `kernel` behind the bf16 widening: bf16 tensors reach it as f32 copies and its bf16
  // outputs are rounded back (core/bf16_widening.h).
  template <Kernel kernel>
  static constexpr Kernel bf16_widened() {
    return &bf16_widening::call_widened<kernel, R, Args...>;
  }

 private:
  const char* op_name_;
  std::array<Kernel, kNumDeviceKinds> kernels_{};
};

// Declares `KernelTable<sig>& name##_kernels()` in a header; defined once with
// HAM_DEFINE_KERNEL_TABLE next to the op's dispatch code. The CPU kernel is installed
// behind the bf16 widening; HAM_DEFINE_KERNEL_TABLE_BF16_NATIVE installs it as it is, for a
// kernel that reads and writes bf16 itself (cast).
#define HAM_DECLARE_KERNEL_TABLE(name, ...) ::ham::KernelTable<__VA_ARGS__>& name##_kernels()
#define HAM_DEFINE_KERNEL_TABLE(name, cpu_kernel, ...)                                      \
  ::ham::KernelTable<__VA_ARGS__>& name##_kernels() {                                       \
    static ::ham::KernelTable<__VA_ARGS__> table(                                           \
        #name, ::ham::KernelTable<__VA_ARGS__>::template bf16_widened<cpu_kernel>());        \
    return table;                                                                            \
  }
#define HAM_DEFINE_KERNEL_TABLE_BF16_NATIVE(name, cpu_kernel, ...)  \
  ::ham::KernelTable<__VA_ARGS__>& name##_kernels() {               \
    static ::ham::KernelTable<__VA_ARGS__> table(#name, cpu_kernel); \
    return table;                                                    \
  }

}  // namespace ham

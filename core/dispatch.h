#pragma once
// Op dispatch: each op owns a KernelTable that maps a device kind to its kernel. The CPU
// kernel is set where the table is defined (core/ops/*.cpp); cuda/ registers its kernels
// at load time, so core/ never includes CUDA code.
#include <array>
#include <utility>

#include "core/device.h"
#include "core/error.h"

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
    return kernel(std::forward<CallArgs>(args)...);
  }

  const char* op_name() const { return op_name_; }

 private:
  const char* op_name_;
  std::array<Kernel, kNumDeviceKinds> kernels_{};
};

// Declares `KernelTable<sig>& name##_kernels()` in a header; defined once with
// HAM_DEFINE_KERNEL_TABLE next to the op's dispatch code.
#define HAM_DECLARE_KERNEL_TABLE(name, ...) ::ham::KernelTable<__VA_ARGS__>& name##_kernels()
#define HAM_DEFINE_KERNEL_TABLE(name, cpu_kernel, ...)              \
  ::ham::KernelTable<__VA_ARGS__>& name##_kernels() {               \
    static ::ham::KernelTable<__VA_ARGS__> table(#name, cpu_kernel); \
    return table;                                                    \
  }

}  // namespace ham

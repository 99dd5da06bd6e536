#include "core/device.h"

#include <array>
#include <cstring>
#include <string>

#include "core/cpu_memory_pool.h"
#include "core/error.h"

namespace ham {

std::string Device::str() const {
  return kind == DeviceKind::CPU ? "cpu" : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      int index = std::stoi(text.substr(5), &used);
      if (used == text.size() - 5 && index >= 0) return cuda(index);
    } catch (const std::exception&) {
    }
  }
  HAM_FAIL("unknown device '", text, "' (expected cpu, cuda or cuda:N)");
}

namespace {

// Host memory from the CPU pool (core/cpu_memory_pool.h): 64-byte aligned blocks, which keeps
// rows friendly to AVX-512 loads.
class CpuBackend final : public DeviceBackend {
 public:
  void* allocate(size_t nbytes, Device) override { return cpu_memory_pool().allocate(nbytes); }
  void deallocate(void* ptr, size_t, Device) override { cpu_memory_pool().free(ptr); }
  void copy_from_host(void* dst, const void* src, size_t n, Device) override { copy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, size_t n, Device) override { copy(dst, src, n); }
  void copy_within(void* dst, const void* src, size_t n, Device) override { copy(dst, src, n); }
  void memset_zero(void* dst, size_t n, Device) override {
    if (n) std::memset(dst, 0, n);
  }
  DeviceMemoryStats memory_stats(Device) override {
    CpuMemoryStats pool = cpu_memory_pool().stats();
    return {pool.requested_bytes, pool.peak_requested_bytes, pool.allocated_bytes,
            pool.allocated_bytes + pool.cached_bytes};
  }
  void reset_peak_memory(Device) override { cpu_memory_pool().reset_peaks(); }

 private:
  static void copy(void* dst, const void* src, size_t n) {
    if (n) std::memmove(dst, src, n);
  }
};

std::array<bool, kNumDeviceKinds>& emulated_kinds() {
  static std::array<bool, kNumDeviceKinds> emulated{};
  return emulated;
}

std::array<DeviceBackend*, kNumDeviceKinds>& backends() {
  static CpuBackend cpu_backend;
  static std::array<DeviceBackend*, kNumDeviceKinds> table{&cpu_backend, nullptr};
  return table;
}

}  // namespace

void register_device_backend(DeviceKind kind, DeviceBackend* backend) {
  backends()[size_t(kind)] = backend;
}

bool has_device_backend(DeviceKind kind) { return backends()[size_t(kind)] != nullptr; }

void emulate_device_on_cpu(DeviceKind kind) {
  HAM_CHECK(kind != DeviceKind::CPU, "emulate_device_on_cpu: cpu is not emulated");
  if (is_emulated_on_cpu(kind)) return;
  HAM_CHECK(!has_device_backend(kind), "emulate_device_on_cpu: ", Device{kind, 0}.str(),
            " has a real backend in this build; emulation is for builds without it");
  static CpuBackend host_memory;
  register_device_backend(kind, &host_memory);
  emulated_kinds()[size_t(kind)] = true;
}

bool is_emulated_on_cpu(DeviceKind kind) { return emulated_kinds()[size_t(kind)]; }

DeviceBackend& device_backend(Device device) {
  DeviceBackend* backend = backends()[size_t(device.kind)];
  if (!backend) {
    HAM_FAIL("device ", device.str(),
             " is not available: this build of ham has no CUDA backend (configure with nvcc on PATH)");
  }
  return *backend;
}

DeviceMemoryStats device_memory_stats(Device device) {
  return device_backend(device).memory_stats(device);
}

void reset_peak_device_memory(Device device) { device_backend(device).reset_peak_memory(device); }

}  // namespace ham

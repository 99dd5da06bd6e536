#pragma once
// Devices and the memory backend each one registers. core/ implements the CPU backend;
// cuda/ registers the CUDA one at load time, so core never depends on cuda/.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ham {

enum class DeviceKind : uint8_t { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceKinds = 2;

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  std::string str() const;  // "cpu", "cuda:0"
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:1"
  bool operator==(const Device&) const = default;
};

// A device's memory as its pool sees it. The bytes its blocks' holders asked for (tensors,
// and on a GPU cuBLASLt's workspace) and their peak since the last reset, which depend only
// on the program's requests; the bytes in the blocks they hold, which the pool's rounding and
// cache raise; and the bytes the pool keeps, held and cached.
struct DeviceMemoryStats {
  size_t requested_bytes = 0;
  size_t peak_requested_bytes = 0;
  size_t allocated_bytes = 0;
  size_t reserved_bytes = 0;
};

// Raw memory operations of one device kind.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, Device device) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t nbytes, Device device) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t nbytes, Device device) = 0;
  virtual void copy_within(void* dst, const void* src, size_t nbytes, Device device) = 0;
  virtual void memset_zero(void* dst, size_t nbytes, Device device) = 0;
  virtual DeviceMemoryStats memory_stats(Device device) = 0;
  virtual void reset_peak_memory(Device device) = 0;  // the peak becomes what is asked for now
};

void register_device_backend(DeviceKind kind, DeviceBackend* backend);
// Throws a one-line error when the kind has no backend (e.g. CUDA in a CPU-only build).
DeviceBackend& device_backend(Device device);
bool has_device_backend(DeviceKind kind);
DeviceMemoryStats device_memory_stats(Device device);
void reset_peak_device_memory(Device device);

// Device emulation, for testing device plumbing without the hardware: `kind` gets a
// host-memory backend (the CPU's pool, whose statistics it shares), and every op without a
// kernel for `kind` runs its CPU kernel. Code that mixes devices, or reads device memory
// without a copy, still fails as on the device.
// An error when `kind` already has a real backend (this build links the CUDA backend).
void emulate_device_on_cpu(DeviceKind kind);
bool is_emulated_on_cpu(DeviceKind kind);

}  // namespace ham

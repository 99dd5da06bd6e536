#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4 and
// TFRecord framing. ham uses it for TensorBoard event records (train/metrics_log.h) and
// for the data section of every safetensors file it writes (core/safetensors.h).
// crc32c("123456789") = 0xE3069283.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ham {

// The CRC of `size` bytes at `data`; `crc` continues an earlier value, so
// crc32c(ab) == crc32c(b, crc32c(a)). Uses the SSE4.2 crc32 instruction where the CPU has
// it, else crc32c_portable.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view bytes, uint32_t crc = 0) {
  return crc32c(bytes.data(), bytes.size(), crc);
}

// The table-driven CRC, eight bytes a step (slicing by 8), on any CPU. The tests hold the
// two paths against each other.
uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc = 0);

// Whether crc32c() runs on the SSE4.2 instruction on this CPU.
bool crc32c_uses_hardware();

}  // namespace ham

#include "core/crc32c.h"

#include <array>
#include <cstring>

namespace ham {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;

// kTables[0][b]: the CRC register after shifting byte b through eight steps of the
// polynomial. kTables[k][b]: the same byte followed by k zero bytes, so that eight table
// lookups advance the register by eight bytes at once.
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> tables{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t reg = byte;
    for (int bit = 0; bit < 8; ++bit) {
      reg = (reg & 1) ? (reg >> 1) ^ kReflectedPolynomial : reg >> 1;
    }
    tables[0][byte] = reg;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const uint32_t previous = tables[k - 1][byte];
      tables[k][byte] = tables[0][previous & 0xFF] ^ (previous >> 8);
    }
  }
  return tables;
}
constexpr auto kTables = make_tables();

// The register (pre-inverted) advanced over `size` bytes.
uint32_t advance_portable(uint32_t reg, const uint8_t* bytes, size_t size) {
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);  // little-endian: byte 0 is the low byte
    word ^= reg;
    reg = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^
          kTables[5][(word >> 16) & 0xFF] ^ kTables[4][(word >> 24) & 0xFF] ^
          kTables[3][(word >> 32) & 0xFF] ^ kTables[2][(word >> 40) & 0xFF] ^
          kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
    bytes += 8;
    size -= 8;
  }
  for (; size > 0; --size) reg = kTables[0][(reg ^ *bytes++) & 0xFF] ^ (reg >> 8);
  return reg;
}

#if defined(__x86_64__)
// The SSE4.2 crc32 instruction computes this polynomial's reflected CRC step: 8 bytes a
// cycle of throughput, one dependent chain (about 8 GB/s at 3 GHz).
__attribute__((target("sse4.2"))) uint32_t advance_sse42(uint32_t reg, const uint8_t* bytes,
                                                          size_t size) {
  uint64_t wide = reg;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    wide = __builtin_ia32_crc32di(wide, word);
    bytes += 8;
    size -= 8;
  }
  reg = uint32_t(wide);
  for (; size > 0; --size) reg = __builtin_ia32_crc32qi(reg, *bytes++);
  return reg;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc) {
  // The standard pre- and post-inversion.
  return ~advance_portable(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  if (cpu_has_sse42()) return ~advance_sse42(~crc, static_cast<const uint8_t*>(data), size);
#endif
  return crc32c_portable(data, size, crc);
}

bool crc32c_uses_hardware() {
#if defined(__x86_64__)
  return cpu_has_sse42();
#else
  return false;
#endif
}

}  // namespace ham

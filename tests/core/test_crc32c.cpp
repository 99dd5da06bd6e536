#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ham {
namespace {

// One bit at a time, straight from the polynomial: the reference both paths must equal.
uint32_t bitwise_crc32c(const void* data, size_t size, uint32_t crc = 0) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t reg = ~crc;
  for (size_t i = 0; i < size; ++i) {
    reg ^= bytes[i];
    for (int bit = 0; bit < 8; ++bit) reg = (reg >> 1) ^ ((reg & 1) ? 0x82F63B78u : 0u);
  }
  return ~reg;
}

TEST(Crc32c, KnownAnswers) {
  for (auto crc : {+[](std::string_view s) { return crc32c(s); },
                   +[](std::string_view s) { return crc32c_portable(s.data(), s.size()); }}) {
    EXPECT_EQ(crc("123456789"), 0xE3069283u);
    EXPECT_EQ(crc(""), 0u);
    // RFC 3720 (iSCSI) B.4 vectors.
    EXPECT_EQ(crc(std::string(32, '\0')), 0x8A9136AAu);
    EXPECT_EQ(crc(std::string(32, '\xff')), 0x62A8AB43u);
    std::string ascending, descending;
    for (int i = 0; i < 32; ++i) {
      ascending += char(i);
      descending += char(31 - i);
    }
    EXPECT_EQ(crc(ascending), 0x46DD794Eu);
    EXPECT_EQ(crc(descending), 0x113FDB5Cu);
  }
}

// Every length from 0 to 80 at every start within a word, then longer runs: the 8-byte
// steps, the byte tail and unaligned starts of both paths against the bitwise CRC.
TEST(Crc32c, BothPathsEqualTheBitwiseCrcAtAnyLengthAndAlignment) {
  std::mt19937 rng(20261201);
  std::vector<uint8_t> bytes(5000);
  for (uint8_t& b : bytes) b = uint8_t(rng());
  auto check = [&](size_t start, size_t size, uint32_t seed) {
    const uint8_t* p = bytes.data() + start;
    const uint32_t expected = bitwise_crc32c(p, size, seed);
    EXPECT_EQ(crc32c(p, size, seed), expected) << start << " + " << size;
    EXPECT_EQ(crc32c_portable(p, size, seed), expected) << start << " + " << size;
  };
  for (size_t start = 0; start < 8; ++start) {
    for (size_t size = 0; size <= 80; ++size) check(start, size, 0);
  }
  for (size_t size : {size_t(255), size_t(1024), size_t(4093), size_t(4992)}) {
    check(3, size, uint32_t(rng()));
  }
}

TEST(Crc32c, ContinuesAcrossPieces) {
  std::string text = "The quick brown fox jumps over the lazy dog, then over it again.";
  for (size_t split : {size_t(0), size_t(1), size_t(17), size_t(40), text.size()}) {
    uint32_t first = crc32c(text.data(), split);
    EXPECT_EQ(crc32c(text.data() + split, text.size() - split, first), crc32c(text));
    uint32_t first_portable = crc32c_portable(text.data(), split);
    EXPECT_EQ(crc32c_portable(text.data() + split, text.size() - split, first_portable),
              crc32c(text));
  }
}

}  // namespace
}  // namespace ham

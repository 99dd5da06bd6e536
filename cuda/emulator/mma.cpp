// mma.sync and ldmatrix for the SIMT emulator (cuda/emulator/mma.h).
#include "cuda/emulator/mma.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/emulator/eight_doubles.h"
#include "cuda/emulator/racecheck.h"

namespace ham::cuda::emulator {

namespace {

constexpr unsigned kFullWarp = 0xffffffffu;

float low_bf16(uint32_t word) { return bf16_to_float(BFloat16{uint16_t(word & 0xffffu)}); }
float high_bf16(uint32_t word) { return bf16_to_float(BFloat16{uint16_t(word >> 16)}); }

struct MmaLane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
};

// D = C + A B in double, each element's sum in the order k = 0, 1, .. 15 from C (the
// products of two bf16 values are exact in double, so whether the compiler fuses them
// with the sum does not change it), eight columns a vector: the emulated tests spend much
// of their time here, and the compiler left the plain loops' sums scalar.
void mma_combine(void* const* lanes, unsigned mask) {
  HAM_CHECK(mask == kFullWarp, "mma.sync needs the whole warp");
  double A[16][16];
  EightDoubles B[16], D[16];
  for (int lane = 0; lane < 32; ++lane) {
    const auto* in = static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int half = 0; half < 2; ++half) {  // a0/a1: columns 2t..; a2/a3: columns 2t + 8..
      const int col = 2 * t + 8 * half;
      A[g][col] = low_bf16(in->a[2 * half]);
      A[g][col + 1] = high_bf16(in->a[2 * half]);
      A[g + 8][col] = low_bf16(in->a[2 * half + 1]);
      A[g + 8][col + 1] = high_bf16(in->a[2 * half + 1]);
      B[col].set(g, low_bf16(in->b[half]));
      B[col + 1].set(g, high_bf16(in->b[half]));
    }
    D[g].set(2 * t, in->d[0]);
    D[g].set(2 * t + 1, in->d[1]);
    D[g + 8].set(2 * t, in->d[2]);
    D[g + 8].set(2 * t + 1, in->d[3]);
  }
  for (int r = 0; r < 16; ++r) {
    for (int k = 0; k < 16; ++k) D[r] += A[r][k] * B[k];
  }
  for (int lane = 0; lane < 32; ++lane) {
    auto* out = static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    out->d[0] = float(D[g][2 * t]);
    out->d[1] = float(D[g][2 * t + 1]);
    out->d[2] = float(D[g + 8][2 * t]);
    out->d[3] = float(D[g + 8][2 * t + 1]);
  }
}

template <int N, bool kTranspose>
void ldmatrix_combine(void* const* lanes, unsigned mask) {
  HAM_CHECK(mask == kFullWarp, "ldmatrix needs the whole warp");
  uint16_t M[N][8][8];
  for (int j = 0; j < N; ++j) {
    for (int i = 0; i < 8; ++i) {
      const auto* lane = static_cast<const LdmatrixLane*>(lanes[8 * j + i]);
      const void* row = lane->row;
      HAM_CHECK(reinterpret_cast<uintptr_t>(row) % 16 == 0, "ldmatrix row ", i,
                " of matrix ", j, " (lane ", 8 * j + i, ") is not 16-byte aligned");
      shared_read_for_lane(8 * j + i, row, 16, lane->pc);
      std::memcpy(M[j][i], row, 16);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t* out = static_cast<const LdmatrixLane*>(lanes[lane])->out;
    const int r = lane / 4, c = 2 * (lane % 4);
    for (int j = 0; j < N; ++j) {
      const uint16_t lo = kTranspose ? M[j][c][r] : M[j][r][c];
      const uint16_t hi = kTranspose ? M[j][c + 1][r] : M[j][r][c + 1];
      out[j] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
}

// A descriptor's fields (cuda/wgmma.cuh).
struct Descriptor {
  uint32_t start, leading, stride;
};

Descriptor decode(uint64_t desc, const char* operand) {
  HAM_CHECK(desc >> 62 == 1, "wgmma: descriptor of ", operand,
            " does not name the 128-byte swizzle (the only layout emulated)");
  HAM_CHECK((desc >> 49 & 7) == 0, "wgmma: descriptor of ", operand, " has a base offset");
  const Descriptor d{uint32_t(desc & 0x3fff) << 4, uint32_t(desc >> 16 & 0x3fff) << 4,
                     uint32_t(desc >> 32 & 0x3fff) << 4};
  // The swizzle pattern's rows start at the tile's first row only from a 1024-byte boundary.
  HAM_CHECK((d.start & 0x380) == 0, "wgmma: ", operand, " starts at shared address ", d.start,
            ", not in the first 128-byte row of a 1024-byte swizzle atom");
  return d;
}

// The shared address, after the swizzle, that the hardware reads for `address`: 16-byte
// chunk bits 4-6 xor'd with row bits 7-9.
uint32_t swizzled(uint32_t address) { return address ^ ((address >> 7 & 7) << 4); }

[[noreturn]] __attribute__((cold, noinline)) void fail_past_shared(uint32_t at, size_t size) {
  HAM_FAIL("wgmma: operand reads shared address ", at, " past the block's ", size, " bytes");
}

// Shared address (before the swizzle) of element (row r, reduction index k) of a K-major
// operand, and of (k, column n) of an MN-major one.
uint32_t k_major_address(const Descriptor& d, int r, int k) {
  return d.start + uint32_t(r / 8) * d.stride + uint32_t(r % 8) * 128 + uint32_t(k) * 2;
}
uint32_t mn_major_address(const Descriptor& d, int k, int n) {
  return d.start + uint32_t(n / 64) * d.leading + uint32_t(n % 64) * 2 +
         uint32_t(k / 8) * d.stride + uint32_t(k % 8) * 128;
}

struct WgmmaCall {
  int n;
  bool a_in_registers, b_mn_major;
  uint64_t desc_a, desc_b;
  int warp;  // within the warpgroup
};

// The bytes a warp's wgmma reads its shared operands from, after the swizzle (each checked
// to lie in the block's shared memory): A's 16 x 16 (unless from registers) and B's 16 x N,
// row-major by (row, k) and (k, column). And the same bytes as 16-byte pieces, which the
// checks compare first: the swizzle moves 16-byte pieces whole, and each 8 elements of an
// operand that are contiguous (A's k; B's k, K-major, or n, MN-major) from an aligned first
// one fill one, element j at the piece's byte 2 j.
struct OperandAddresses {
  std::vector<uint32_t> a, b;
  std::vector<uint32_t> pieces;  // 16-byte aligned, after the swizzle
};

// Fails naming the first of `at` (in element order) that lies past the block's shared memory.
[[noreturn]] __attribute__((cold, noinline)) void fail_first_past_shared(
    const std::vector<uint32_t>& at, size_t size) {
  for (uint32_t byte : at) {
    if (byte + 2 > size) fail_past_shared(byte, size);
  }
  HAM_FAIL("wgmma: an operand's piece passes the block's ", size, " bytes of shared memory");
}

OperandAddresses operand_addresses(const WgmmaCall& call, size_t shared_size) {
  OperandAddresses at;
  bool past_end = false;
  // The piece that holds shared address `first` (before the swizzle) and the 7 elements
  // after it: elements[j * step] = its byte 2 j.
  auto add_piece = [&](uint32_t first, uint32_t* elements, size_t step) {
    const uint32_t piece = swizzled(first);
    HAM_CHECK(piece % 16 == 0, "wgmma: an operand's piece starts at shared byte ", piece);
    past_end |= piece + 16 > shared_size;
    at.pieces.push_back(piece);
    for (uint32_t j = 0; j < 8; ++j) elements[j * step] = piece + 2 * j;
  };
  if (!call.a_in_registers) {
    const Descriptor da = decode(call.desc_a, "A");
    at.a.resize(16 * 16);
    for (int r = 0; r < 16; ++r) {
      for (int k = 0; k < 16; k += 8) {
        add_piece(k_major_address(da, 16 * call.warp + r, k), &at.a[size_t(r * 16 + k)], 1);
      }
    }
    if (past_end) fail_first_past_shared(at.a, shared_size);
  }
  const Descriptor db = decode(call.desc_b, "B");
  const int n = call.n;
  at.b.resize(size_t(16 * n));
  for (int k = 0; k < 16; k += call.b_mn_major ? 1 : 8) {
    for (int column = 0; column < n; column += call.b_mn_major ? 8 : 1) {
      uint32_t* elements = &at.b[size_t(k * n + column)];
      if (call.b_mn_major) add_piece(mn_major_address(db, k, column), elements, 1);
      else add_piece(k_major_address(db, column, k), elements, size_t(n));
    }
  }
  if (past_end) fail_first_past_shared(at.b, shared_size);
  return at;
}

// The raw bf16 at each of `at` (bytes after the swizzle, checked) in `memory`.
std::vector<uint16_t> read_bits(const unsigned char* memory, const std::vector<uint32_t>& at) {
  std::vector<uint16_t> bits(at.size());
  for (size_t i = 0; i < at.size(); ++i) std::memcpy(&bits[i], memory + at[i], 2);
  return bits;
}

// 16 bytes of an operand, as two words.
struct Piece {
  uint64_t bytes[2];
};

std::vector<Piece> read_pieces(const unsigned char* memory, const std::vector<uint32_t>& at) {
  std::vector<Piece> pieces(at.size());
  for (size_t i = 0; i < at.size(); ++i) std::memcpy(pieces[i].bytes, memory + at[i], 16);
  return pieces;
}

// What a warp's wgmma read at issue, to be read again at the wait that completes it: each
// element, and the same bytes by pieces.
struct OperandReads {
  WgmmaCall call;
  OperandAddresses at;
  std::vector<uint16_t> a, b;
  std::vector<Piece> pieces;
};

// "" where `memory` (the dynamic shared memory or a copy of it) holds at every operand
// address what the wgmma read; else an error naming the first element that differs, and
// `why`. (The pieces first: where they all match, so do the elements.)
std::string first_difference(const OperandReads& reads, const void* memory, const char* why) {
  const auto* bytes = static_cast<const unsigned char*>(memory);
  bool same = true;
  for (size_t i = 0; i < reads.pieces.size(); ++i) {
    uint64_t now[2];
    std::memcpy(now, bytes + reads.at.pieces[i], 16);
    same &= now[0] == reads.pieces[i].bytes[0] && now[1] == reads.pieces[i].bytes[1];
  }
  if (same) return "";
  auto bits_at = [bytes](uint32_t at) {
    uint16_t bits;
    std::memcpy(&bits, bytes + at, 2);
    return bits;
  };
  const char* operand = "A";
  std::string element;
  uint32_t at = 0;
  const size_t n = size_t(reads.call.n);
  for (size_t i = 0; i < reads.a.size() && element.empty(); ++i) {
    if (bits_at(reads.at.a[i]) == reads.a[i]) continue;
    element = detail::concat("row ", 16 * reads.call.warp + i / 16, ", k ", i % 16,
                             ") of its 64 x 16");
    at = reads.at.a[i];
  }
  for (size_t i = 0; i < reads.b.size() && element.empty(); ++i) {
    if (bits_at(reads.at.b[i]) == reads.b[i]) continue;
    operand = "B";
    element = detail::concat("k ", i / n, ", column ", i % n, ") of its 16 x ", n);
    at = reads.at.b[i];
  }
  HAM_CHECK(!element.empty(), "wgmma: a piece of an operand changed, but none of its elements");
  return detail::concat("wgmma.mma_async of warp ", reads.call.warp,
                        " of its warpgroup read operand ", operand, "'s element (", element,
                        " at shared byte ", at, ", ", why);
}

// The check at the wait (simt.h, wgmma_issued).
std::string operand_change(const OperandReads& reads) {
  return first_difference(reads, dynamic_shared_memory(),
                          "which changed before the wgmma.wait_group that covers it: the "
                          "tensor cores may read it until that wait");
}

struct WgmmaLane {
  float* d;
  const uint32_t* a;
  WgmmaCall call;
  const void* pc;  // the lane's wgmma, for the racecheck's messages
};

void wgmma_combine(void* const* lanes, unsigned mask) {
  HAM_CHECK(mask == kFullWarp, "wgmma needs every lane of the warp");
  const WgmmaCall& call = static_cast<const WgmmaLane*>(lanes[0])->call;
  for (int lane = 1; lane < 32; ++lane) {
    const WgmmaCall& other = static_cast<const WgmmaLane*>(lanes[lane])->call;
    HAM_CHECK(other.n == call.n && other.a_in_registers == call.a_in_registers &&
                  other.b_mn_major == call.b_mn_major && other.desc_a == call.desc_a &&
                  other.desc_b == call.desc_b,
              "wgmma: lane ", lane, " passes other operands than lane 0");
  }
  auto issued = std::make_shared<OperandReads>();
  OperandReads& reads = *issued;
  reads.call = call;
  reads.at = operand_addresses(call, dynamic_shared_size());
  const auto* shared = static_cast<const unsigned char*>(dynamic_shared_memory());
  reads.a = read_bits(shared, reads.at.a);
  reads.b = read_bits(shared, reads.at.b);
  reads.pieces = read_pieces(shared, reads.at.pieces);
  const std::string unfenced = first_difference(
      reads, async_proxy_view(),
      "which holds a write that no fence.proxy.async and barrier after it handed to the "
      "tensor cores: they may read what it held before");
  HAM_CHECK(unfenced.empty(), unfenced);
  // For the racecheck, the operands are read here, as lane 0's reads: another thread's
  // write to them after this needs a barrier first (a lane of this warp, a __syncwarp).
  // The check at the wait sees only what has changed by then; this also sees a cp.async
  // of another warp still in flight, and a write after this warp's wait that comes before
  // a warp that has not yet issued its part of the wgmma (reads it too).
  if (racecheck_on()) {
    const void* pc = static_cast<const WgmmaLane*>(lanes[0])->pc;
    for (uint32_t piece : reads.at.pieces) shared_read_for_lane(0, shared + piece, 16, pc);
  }
  // Handed over here rather than by lane 0 after the exchange, so that nothing is left on
  // a fiber's stack that a failing kernel abandons.
  wgmma_issued([issued] { return operand_change(*issued); });
  // D = C + A B as mma_combine forms it, a row of N columns in N / 8 vectors.
  auto value = [](uint16_t bits) { return double(bf16_to_float(BFloat16{bits})); };
  const int n = call.n, vectors = n / 8;
  double A[16][16];
  if (call.a_in_registers) {
    for (int lane = 0; lane < 32; ++lane) {
      const uint32_t* a = static_cast<const WgmmaLane*>(lanes[lane])->a;
      const int g = lane / 4, t = lane % 4;
      for (int half = 0; half < 2; ++half) {
        const int col = 2 * t + 8 * half;
        A[g][col] = low_bf16(a[2 * half]);
        A[g][col + 1] = high_bf16(a[2 * half]);
        A[g + 8][col] = low_bf16(a[2 * half + 1]);
        A[g + 8][col + 1] = high_bf16(a[2 * half + 1]);
      }
    }
  } else {
    for (int r = 0; r < 16; ++r) {
      for (int k = 0; k < 16; ++k) A[r][k] = value(reads.a[size_t(r * 16 + k)]);
    }
  }
  // Rows of B (16 x N) and of D (16 x N), N / 8 vectors each.
  std::vector<EightDoubles> B(size_t(16 * vectors)), D(size_t(16 * vectors));
  for (size_t v = 0; v < B.size(); ++v) {
    const uint16_t* bits = &reads.b[8 * v];
    for (int e = 0; e < 4; ++e) {
      B[v].low[e] = value(bits[e]);
      B[v].high[e] = value(bits[4 + e]);
    }
  }
  // Element e of a lane's accumulator block j: row g + 8 (e / 2), column 8 j + 2 t + e % 2,
  // that is element 2 t + e % 2 of vector j of its row.
  auto vector_of = [&D, vectors](int lane, int j, int e) -> EightDoubles& {
    return D[size_t((lane / 4 + 8 * (e / 2)) * vectors + j)];
  };
  auto element_in_vector = [](int lane, int e) { return 2 * (lane % 4) + e % 2; };
  for (int lane = 0; lane < 32; ++lane) {
    const float* d = static_cast<const WgmmaLane*>(lanes[lane])->d;
    for (int j = 0; j < vectors; ++j) {
      for (int e = 0; e < 4; ++e) {
        vector_of(lane, j, e).set(element_in_vector(lane, e), d[4 * j + e]);
      }
    }
  }
  // Each vector of D summed over k in a local, so that it stays in registers; every
  // element's sum runs over k in order from its C.
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < vectors; ++c) {
      EightDoubles sum = D[size_t(r * vectors + c)];
      for (int k = 0; k < 16; ++k) sum += A[r][k] * B[size_t(k * vectors + c)];
      D[size_t(r * vectors + c)] = sum;
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    float* d = static_cast<const WgmmaLane*>(lanes[lane])->d;
    for (int j = 0; j < vectors; ++j) {
      for (int e = 0; e < 4; ++e) {
        d[4 * j + e] = float(vector_of(lane, j, e)[element_in_vector(lane, e)]);
      }
    }
  }
}

}  // namespace

void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaLane lane{d, a, b};
  warp_exchange(kFullWarp, &lane, &mma_combine, "mma.sync.m16n8k16.bf16");
}

void ldmatrix_combine_x1(void* const* l, unsigned m) { ldmatrix_combine<1, false>(l, m); }
void ldmatrix_combine_x2(void* const* l, unsigned m) { ldmatrix_combine<2, false>(l, m); }
void ldmatrix_combine_x4(void* const* l, unsigned m) { ldmatrix_combine<4, false>(l, m); }
void ldmatrix_combine_x1_trans(void* const* l, unsigned m) { ldmatrix_combine<1, true>(l, m); }
void ldmatrix_combine_x2_trans(void* const* l, unsigned m) { ldmatrix_combine<2, true>(l, m); }
void ldmatrix_combine_x4_trans(void* const* l, unsigned m) { ldmatrix_combine<4, true>(l, m); }

uint32_t shared_address(const void* p) {
  const auto base = reinterpret_cast<uintptr_t>(dynamic_shared_memory());
  const auto at = reinterpret_cast<uintptr_t>(p);
  HAM_CHECK(at >= base && at < base + dynamic_shared_size(),
            "shared_address: the pointer is not in the block's dynamic shared memory");
  return uint32_t(at - base);
}

void wgmma_bf16(float* d, int n, const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
                bool b_mn_major) {
  HAM_CHECK(n % 8 == 0 && n >= 8 && n <= 256, "wgmma: N = ", n,
            " is not a multiple of 8 in [8, 256]");
  const ThreadPlace& at = place();
  HAM_CHECK(at.block_dim.x % 128 == 0 && at.block_dim.y == 1 && at.block_dim.z == 1,
            "wgmma: a block of ", at.block_dim.x, " x ", at.block_dim.y, " x ", at.block_dim.z,
            " threads is not whole warpgroups");
  WgmmaLane lane{d, a,
                 WgmmaCall{n, a != nullptr, b_mn_major, desc_a, desc_b,
                           int(at.thread_idx.x / 32 % 4)},
                 __builtin_return_address(0)};  // in the kernel's code
  warp_exchange(kFullWarp, &lane, &wgmma_combine, "wgmma.mma_async.m64nNk16.bf16");
}

uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(float_to_bf16(lo).bits) | uint32_t(float_to_bf16(hi).bits) << 16;
}

}  // namespace ham::cuda::emulator

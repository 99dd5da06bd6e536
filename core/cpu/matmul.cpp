// CPU GEMM, C = alpha * op(A) op(B) + beta * C, blocked as in Goto's GEMM:
//
//   for each NC-wide column panel of C (jc):
//     for each KC-deep slice of K (pc):
//       pack op(B)[pc:pc+KC, jc:jc+NC] into slivers NR columns wide
//       for each MC-tall row block of C (ic):
//         for each MR x NR tile of the block: tile += A sliver * B sliver (the micro-kernel)
//
// The micro-kernel holds the MR x NR tile in MR * NR / P vector accumulators (P lanes) and
// adds one rank-1 update per k: NR / P packet loads of B's packed sliver, MR broadcasts of
// A's. It reads A's MR-row slivers in place, along A's rows or, when A is transposed, along
// its columns; only a partial last sliver is packed, padded with zeros. (Packing all of A
// took about 15% of the GEMM time of a tiny HAM run, by perf.) A narrow B sliver runs a
// narrower kernel, and a partial tile runs on a full-size copy, so each element of C gets
// the same sequence of FMAs wherever it sits: the result does not depend on the thread
// count or on which tile an element falls in.
//
// Threads split C into blocks of whole tiles, one block each, every thread packing its own
// slivers; a batch with at least as many products as threads runs one product per thread.
// The packing buffers come from the tensor pool, so they count in the run's peak memory.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include <Eigen/Core>

#include "core/cpu/matmul.h"
#include "core/cpu/packets.h"
#include "core/cpu/parallel.h"
#include "core/ops/matmul.h"

namespace ham::cpu {

namespace {

namespace ei = Eigen::internal;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
int64_t ceil_div(int64_t value, int64_t divisor) { return (value + divisor - 1) / divisor; }

// Tile and block sizes for one scalar type. The accumulators, B's packets and one
// broadcast of A must fit the vector registers: 24 + 3 + 1 of AVX-512's 32, 12 + 2 + 1 of
// AVX2's (or SSE's) 16. A B sliver, KC * NR elements (48 KiB of f32 under AVX-512), is
// streamed from L2 by every MR-row sliver of A; NC bounds the packed B panel at 2 MiB.
template <class T>
struct Blocking {
  static constexpr int kLanes = int(kPacketSize<T>);
  static constexpr bool kWideRegisterFile = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32;
  static constexpr int kColumnPackets = kWideRegisterFile ? 3 : 2;
  static constexpr int kTileRows = kWideRegisterFile ? 8 : 6;         // MR
  static constexpr int kTileCols = kColumnPackets * kLanes;           // NR
  static constexpr int64_t kDepth = 256;                              // KC
  static constexpr int64_t kBlockRows = 16 * kTileRows;               // MC
  static constexpr int64_t kPanelCols =                               // NC
      std::max<int64_t>(1, (int64_t(2) << 20) / (kDepth * int64_t(sizeof(T))) / kTileCols) *
      kTileCols;
};

// op(A), op(B) and C as strided matrices: op(A)[i, p] = a[i * a_row + p * a_col].
template <class T>
struct Operands {
  const T* a;
  int64_t a_row, a_col;
  const T* b;
  int64_t b_row, b_col;
  T* c;
  int64_t ldc;
  int64_t k;
  T alpha, beta;
};

// out[0, valid) = in[0], in[stride], ..., then zeros up to out[width).
template <class T>
void copy_padded(const T* in, int64_t stride, int64_t valid, int64_t width, T* out) {
  if (stride == 1) {
    std::copy(in, in + valid, out);
  } else {
    for (int64_t i = 0; i < valid; ++i) out[i] = in[i * stride];
  }
  std::fill(out + valid, out + width, T(0));
}

// Rows [row0, row0 + rows) x depth [p0, p0 + depth) of op(A) into slivers of MR rows: the
// sliver starting at row s holds out[s * depth + p * MR + r] = op(A)[row0 + s + r, p0 + p],
// 0 past the last row.
template <class T>
void pack_a(const Operands<T>& x, int64_t row0, int64_t rows, int64_t p0, int64_t depth,
            T* out) {
  constexpr int kMr = Blocking<T>::kTileRows;
  for (int64_t s = 0; s < rows; s += kMr) {
    const int64_t valid = std::min<int64_t>(kMr, rows - s);
    for (int64_t p = 0; p < depth; ++p) {
      const T* column = x.a + (row0 + s) * x.a_row + (p0 + p) * x.a_col;
      copy_padded(column, x.a_row, valid, kMr, out + s * depth + p * kMr);
    }
  }
}

// Columns of the next B sliver, out of `remaining`: NR, except that four packets left with
// AVX-512's three-packet slivers go as two and two (two 16-accumulator tiles run faster
// than a 24- and an 8-accumulator one). The last sliver may end inside a packet.
template <class T>
int64_t sliver_cols(int64_t remaining) {
  using B = Blocking<T>;
  if (B::kColumnPackets == 3 && remaining > 3 * B::kLanes && remaining <= 4 * B::kLanes) {
    return 2 * B::kLanes;
  }
  return std::min<int64_t>(B::kTileCols, remaining);
}

// Depth [p0, p0 + depth) x columns [col0, col0 + cols) of op(B) into slivers of
// sliver_cols() columns, each padded with zeros to whole packets: a sliver of width w
// starting at column s holds out[s * depth + p * w + c] = op(B)[p0 + p, col0 + s + c].
template <class T>
void pack_b(const Operands<T>& x, int64_t p0, int64_t depth, int64_t col0, int64_t cols,
            T* out) {
  using B = Blocking<T>;
  for (int64_t s = 0, valid = 0; s < cols; s += valid) {
    valid = sliver_cols<T>(cols - s);
    const int64_t width = round_up(valid, B::kLanes);
    for (int64_t p = 0; p < depth; ++p) {
      const T* row = x.b + (p0 + p) * x.b_row + (col0 + s) * x.b_col;
      copy_padded(row, x.b_col, valid, width, out + s * depth + p * width);
    }
  }
}

// An MR-row sliver of op(A), KC deep, as the micro-kernel reads it: a[p * stride + r]
// (packed, stride MR, or A transposed, read in place) or, with kRowMajorA, a[r * stride + p]
// (A not transposed, read in place).
template <class T>
struct ASliver {
  const T* data;
  int64_t stride;
};

// The micro-kernel: for an MR x (kNp * P) tile with leading dimension ldc,
//   tile = alpha * sum_p a[p, :]^T b[p, :] + (first_slice ? beta * tile : tile)
// where a is an A sliver and b holds depth rows of kNp packets. beta = 0 on the first
// slice never reads the tile, so NaN or garbage there does not leak into C.
template <class T, int kNp, bool kRowMajorA>
void multiply_tile(int64_t depth, ASliver<T> a, const T* b, T* tile, int64_t ldc, T alpha,
                   T beta, bool first_slice) {
  using P = Packet<T>;
  constexpr int kMr = Blocking<T>::kTileRows, kLanes = Blocking<T>::kLanes;
  P acc[kMr][kNp];
  for (int r = 0; r < kMr; ++r)
    for (int j = 0; j < kNp; ++j) acc[r][j] = ei::pset1<P>(T(0));
  for (int64_t p = 0; p < depth; ++p) {
    P b_row[kNp];
    for (int j = 0; j < kNp; ++j) b_row[j] = ei::ploadu<P>(b + (p * kNp + j) * kLanes);
    for (int r = 0; r < kMr; ++r) {
      const T a_rp = kRowMajorA ? a.data[r * a.stride + p] : a.data[p * a.stride + r];
      const P a_value = ei::pset1<P>(a_rp);
      for (int j = 0; j < kNp; ++j) acc[r][j] = ei::pmadd(a_value, b_row[j], acc[r][j]);
    }
  }
  const P alpha_p = ei::pset1<P>(alpha), beta_p = ei::pset1<P>(beta);
  for (int r = 0; r < kMr; ++r) {
    for (int j = 0; j < kNp; ++j) {
      T* out = tile + r * ldc + j * kLanes;
      const P scaled = ei::pmul(alpha_p, acc[r][j]);
      P value;
      if (!first_slice) value = ei::padd(ei::ploadu<P>(out), scaled);
      else if (beta == T(0)) value = scaled;
      else value = ei::pmadd(beta_p, ei::ploadu<P>(out), scaled);
      ei::pstoreu(out, value);
    }
  }
}

// A tile of rows x cols of C (at most MR x kNp * P). A partial one goes through a
// full-size copy, so it gets exactly the arithmetic of a whole one.
template <class T, int kNp, bool kRowMajorA>
void multiply_any_tile(int64_t depth, ASliver<T> a, const T* b, T* c, int64_t ldc, int64_t rows,
                       int64_t cols, T alpha, T beta, bool first_slice) {
  constexpr int kMr = Blocking<T>::kTileRows, kWidth = kNp * Blocking<T>::kLanes;
  if (rows == kMr && cols == kWidth) {
    return multiply_tile<T, kNp, kRowMajorA>(depth, a, b, c, ldc, alpha, beta, first_slice);
  }
  alignas(64) T tile[kMr * kWidth] = {};
  const bool reads_c = !first_slice || beta != T(0);
  if (reads_c) {
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(c + r * ldc, c + r * ldc + cols, tile + r * kWidth);
    }
  }
  multiply_tile<T, kNp, kRowMajorA>(depth, a, b, tile, kWidth, alpha, beta, first_slice);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(tile + r * kWidth, tile + r * kWidth + cols, c + r * ldc);
  }
}

// Picks the micro-kernel as wide as the sliver's packets, so a narrow sliver (the last of a
// panel, or one of a two-and-two pair) does not multiply columns of zeros.
template <class T, bool kRowMajorA>
void multiply_sliver_pair(int64_t depth, ASliver<T> a, const T* b, T* c, int64_t ldc,
                          int64_t rows, int64_t cols, T alpha, T beta, bool first_slice) {
  using B = Blocking<T>;
  static_assert(B::kColumnPackets == 2 || B::kColumnPackets == 3);
  const int64_t packets = ceil_div(cols, B::kLanes);
  if constexpr (B::kColumnPackets == 3) {
    if (packets == 3) {
      return multiply_any_tile<T, 3, kRowMajorA>(depth, a, b, c, ldc, rows, cols, alpha, beta,
                                                first_slice);
    }
  }
  if (packets == 2) {
    return multiply_any_tile<T, 2, kRowMajorA>(depth, a, b, c, ldc, rows, cols, alpha, beta,
                                              first_slice);
  }
  multiply_any_tile<T, 1, kRowMajorA>(depth, a, b, c, ldc, rows, cols, alpha, beta, first_slice);
}

// Elements of packing buffer one thread needs for a block of C `cols` wide: one A sliver
// and one B panel.
template <class T>
int64_t packing_elements(int64_t cols, int64_t k) {
  using B = Blocking<T>;
  const int64_t depth = std::min(B::kDepth, k);
  const int64_t a_sliver = B::kTileRows * depth;
  const int64_t b_panel = std::min(B::kPanelCols, round_up(cols, B::kTileCols)) * depth;
  return a_sliver + b_panel + 2 * 64 / int64_t(sizeof(T));  // + room to align both to 64 bytes
}

template <class T>
T* aligned_64(T* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return p + ((64 - address % 64) % 64) / sizeof(T);
}

// Rows [row0, row0 + rows) x columns [col0, col0 + cols) of C on the calling thread, with
// `buffer` of packing_elements(cols, k) elements.
template <class T>
void gemm_block(const Operands<T>& x, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                T* buffer) {
  using B = Blocking<T>;
  if (rows <= 0 || cols <= 0) return;
  // The micro-kernel reads whole slivers of op(A) in place, along rows of A (not
  // transposed) or along its columns (transposed); only a partial last sliver is packed
  // (padded with zeros). Packing a transposed A with 2048 rows whole was not measurably
  // faster (bench_matmul, mlp/TN).
  const bool a_row_major = x.a_col == 1;
  T* packed_a = aligned_64(buffer);
  T* packed_b = aligned_64(packed_a + B::kTileRows * std::min(B::kDepth, x.k));
  for (int64_t jc = 0; jc < cols; jc += B::kPanelCols) {
    const int64_t panel_cols = std::min(B::kPanelCols, cols - jc);
    for (int64_t pc = 0; pc < x.k; pc += B::kDepth) {
      const int64_t depth = std::min(B::kDepth, x.k - pc);
      const bool first_slice = pc == 0;
      pack_b(x, pc, depth, col0 + jc, panel_cols, packed_b);
      for (int64_t ic = 0; ic < rows; ic += B::kBlockRows) {
        const int64_t block_rows = std::min(B::kBlockRows, rows - ic);
        const int64_t whole_rows = block_rows / B::kTileRows * B::kTileRows;
        if (whole_rows < block_rows) {  // only the partial last sliver, at packed_a
          pack_a(x, row0 + ic + whole_rows, block_rows - whole_rows, pc, depth, packed_a);
        }
        for (int64_t jr = 0, tile_cols = 0; jr < panel_cols; jr += tile_cols) {
          tile_cols = sliver_cols<T>(panel_cols - jr);
          const T* b_sliver = packed_b + jr * depth;
          for (int64_t ir = 0; ir < block_rows; ir += B::kTileRows) {
            const int64_t tile_rows = std::min<int64_t>(B::kTileRows, block_rows - ir);
            T* c = x.c + (row0 + ic + ir) * x.ldc + col0 + jc + jr;
            const T* in_place = x.a + (row0 + ic + ir) * x.a_row + pc * x.a_col;
            if (ir == whole_rows) {
              const ASliver<T> a{packed_a, B::kTileRows};
              multiply_sliver_pair<T, false>(depth, a, b_sliver, c, x.ldc, tile_rows,
                                             tile_cols, x.alpha, x.beta, first_slice);
            } else if (a_row_major) {
              const ASliver<T> a{in_place, x.a_row};
              multiply_sliver_pair<T, true>(depth, a, b_sliver, c, x.ldc, tile_rows, tile_cols,
                                            x.alpha, x.beta, first_slice);
            } else {
              const ASliver<T> a{in_place, x.a_col};
              multiply_sliver_pair<T, false>(depth, a, b_sliver, c, x.ldc, tile_rows,
                                             tile_cols, x.alpha, x.beta, first_slice);
            }
          }
        }
      }
    }
  }
}

// C = beta * C, for K = 0 (beta = 0 ignores whatever C held, even NaN).
template <class T>
void scale_only(T* c, int64_t count, T beta) {
  if (beta == T(0)) std::fill(c, c + count, T(0));
  else if (beta != T(1)) std::transform(c, c + count, c, [beta](T v) { return beta * v; });
}

// How `threads` threads split an m x n product: a grid of row_parts x col_parts blocks of
// whole tiles. Picks the grid with the fewest tiles in its largest block; on a tie, more
// row parts (each thread then reads only its own rows of A).
struct ThreadGrid {
  int64_t row_parts = 1, col_parts = 1;
  int64_t rows_per_part = 0, cols_per_part = 0;  // multiples of MR and NR
};

template <class T>
ThreadGrid thread_grid(int64_t m, int64_t n, int threads) {
  using B = Blocking<T>;
  const int64_t row_tiles = ceil_div(m, B::kTileRows), col_tiles = ceil_div(n, B::kTileCols);
  ThreadGrid best;
  int64_t best_tiles = -1;
  for (int64_t row_parts = threads; row_parts >= 1; --row_parts) {
    if (threads % row_parts != 0) continue;
    const int64_t col_parts = threads / row_parts;
    const int64_t tiles = ceil_div(row_tiles, row_parts) * ceil_div(col_tiles, col_parts);
    if (best_tiles < 0 || tiles < best_tiles) {
      best_tiles = tiles;
      best = {row_parts, col_parts, ceil_div(row_tiles, row_parts) * B::kTileRows,
              ceil_div(col_tiles, col_parts) * B::kTileCols};
    }
  }
  return best;
}

// FMAs below which a product stays on one thread (a thread's start-up and its own packing
// would cost more than it saves).
constexpr int64_t kFmasPerThread = int64_t(1) << 16;

template <class T>
void gemm_typed(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape& s) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = c.data<T>();
  auto operands = [&](int64_t i) {
    Operands<T> x;
    x.a = pa + i * s.a_batch_stride;
    x.a_row = s.trans_a ? 1 : s.k;
    x.a_col = s.trans_a ? s.m : 1;
    x.b = pb + i * s.b_batch_stride;
    x.b_row = s.trans_b ? 1 : s.n;
    x.b_col = s.trans_b ? s.k : 1;
    x.c = pc + i * s.m * s.n;
    x.ldc = s.n;
    x.k = s.k;
    x.alpha = T(s.alpha);
    x.beta = T(s.beta);
    return x;
  };
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    scale_only(pc, s.batch * s.m * s.n, T(s.beta));
    return;
  }
  const int64_t fmas = s.m * s.n * s.k;
  const int available = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t per_product = packing_elements<T>(s.n, s.k);

  if (s.batch >= available && available > 1 && s.batch * fmas >= kFmasPerThread * available) {
    // One product per thread, each with its own buffer.
    Tensor buffers = Tensor::empty({available * per_product}, dtype_of<T>());
    T* base = buffers.data<T>();
#pragma omp parallel for schedule(static) num_threads(available)
    for (int64_t i = 0; i < s.batch; ++i) {
      gemm_block(operands(i), 0, s.m, 0, s.n, base + omp_get_thread_num() * per_product);
    }
    return;
  }

  const int wanted = int(std::clamp<int64_t>(fmas / kFmasPerThread, 1, available));
  const ThreadGrid grid = thread_grid<T>(s.m, s.n, wanted);
  const int64_t per_thread = packing_elements<T>(grid.cols_per_part, s.k);
  Tensor buffers = Tensor::empty({wanted * per_thread}, dtype_of<T>());
  T* base = buffers.data<T>();
  for (int64_t i = 0; i < s.batch; ++i) {
    const Operands<T> x = operands(i);
    if (wanted == 1) {
      gemm_block(x, 0, s.m, 0, s.n, base);
      continue;
    }
#pragma omp parallel num_threads(wanted)
    {
      // Fewer threads than asked for (OMP_THREAD_LIMIT, a busy runtime) share the blocks.
      const int64_t team = omp_get_num_threads();
      for (int64_t part = omp_get_thread_num(); part < grid.row_parts * grid.col_parts;
           part += team) {
        const int64_t row0 = (part / grid.col_parts) * grid.rows_per_part;
        const int64_t col0 = (part % grid.col_parts) * grid.cols_per_part;
        gemm_block(x, row0, std::min(grid.rows_per_part, s.m - row0), col0,
                   std::min(grid.cols_per_part, s.n - col0),
                   base + omp_get_thread_num() * per_thread);
      }
    }
  }
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape& s) {
  dispatch_floating("matmul", a.dtype(), [&]<class T>() { gemm_typed<T>(a, b, c, s); });
}

template <class T>
void ProductOnThisThread<T>::operator()(const StridedMatrix<T>& c,
                                        const StridedMatrix<const T>& a,
                                        const StridedMatrix<const T>& b, T alpha, T beta) {
  HAM_CHECK(a.rows == c.rows && b.cols == c.cols && a.cols == b.rows,
            "cpu product: [", c.rows, ", ", c.cols, "] = [", a.rows, ", ", a.cols, "] x [",
            b.rows, ", ", b.cols, "] does not match");
  HAM_CHECK(c.col_stride == 1 || c.cols <= 1,
            "cpu product: the result's column stride is ", c.col_stride, ", not 1");
  HAM_CHECK(a.col_stride == 1 || a.row_stride == 1, "cpu product: the left operand has strides ",
            a.row_stride, " and ", a.col_stride, "; one must be 1");
  if (c.rows == 0 || c.cols == 0) return;
  if (a.cols == 0) {
    for (int64_t i = 0; i < c.rows; ++i) scale_only(c.data + i * c.row_stride, c.cols, beta);
    return;
  }
  const int64_t needed = packing_elements<T>(c.cols, a.cols);
  if (!buffer_.defined() || buffer_.numel() < needed) {
    buffer_ = Tensor::empty({needed}, dtype_of<T>());
  }
  // gemm_block reads A in place along its rows if a_col is 1, else along its columns.
  const Operands<T> x{a.data, a.row_stride, a.col_stride,
                      b.data, b.row_stride, b.col_stride,
                      c.data, c.row_stride, a.cols, alpha, beta};
  gemm_block(x, 0, c.rows, 0, c.cols, buffer_.data<T>());
}

template class ProductOnThisThread<float>;
template class ProductOnThisThread<double>;

}  // namespace ham::cpu

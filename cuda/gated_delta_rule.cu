// CUDA kernels of core/ops/gated_delta_rule.h: the chunked forward (training), its
// backward, and the token-by-token recurrence (decoding; the _naive table). The math, the
// output layout and the document semantics are those of the CPU reference
// (core/cpu/gated_delta_rule.cpp); each step below names the formula it implements.
//
// ---- Decomposition ----
// Every quantity on the key side of one chunk (G, Gamma, M, P, the unit lower-triangular
// system I + diag(beta) M) depends on q, k, g, beta only, and the value columns of S, v,
// v_new and o never mix: column j of o and S depends on column j of v and h0 alone. So a
// block owns one (b, h, V tile of `vt` columns) and carries the fp32 state slice
// S[:, tile] (K x vt) in shared memory through the whole sequence; the key-side matrices
// are recomputed by every V tile of a head (cheap next to the state products). Only two
// things couple the tiles:
//   * the fit error, 1 - <p, v> / (||p|| ||v|| + 1e-6), needs <p, v>, ||p||^2, ||v||^2
//     over all of V: each tile writes its three partial sums per token to a scratch
//     buffer [B*T*H, tiles, 3] and a second kernel adds them in tile order;
//   * the gradients of q, k, g, beta are sums over value columns: each tile writes its
//     partial dq, dk, dg, dbeta to scratch [tiles, ...] and a kernel adds them in tile
//     order (fixed order: deterministic, no atomics).
// dv and dh0 are per column, written directly by the owning tile.
//
// ---- Chunks and documents ----
// With doc_ids, a chunk table per batch row (chunk_table_kernel) lists chunk starts: every
// document segment is chunked from its own first token in pieces of at most 64 tokens,
// exactly as the CPU does, so no chunk holds a document start. Without them there is no
// table: each row is one document, chunk c its tokens [64 c, 64 c + 64) (RowChunks).
// chunk_doc_start marks chunks that begin a document; there the state resets to 0 (h0
// only seeds the chunk at t = 0). doc_chunk lists each document's first chunk: the
// tensor-core state passes run every document of a row in blocks of its own, side by side
// (StateTile).
//
// ---- Forward of one chunk (c <= 64 rows, start state S0 = the block's S) ----
//   G_i = g_0 + ... + g_i (chunk-local cumsum, compute type), E = e^G,
//   Gamma_ij = e^{G_i - G_j} (j <= i; the exponent is a difference, taken only where kept)
//   M = strict_tril(K K^T * Gamma),  P = tril(Q K^T * Gamma)
//   R = V - diag(E) K S0;  forward substitution (I + diag(beta) M) u = diag(beta) R, i.e.
//     u_i = beta_i (R_i - sum_{j<i} M_ij u_j)        [u = v_new = U - W S0, the WY form]
//   O = diag(E) Q S0 + P u
//   pred = diag(E) K S0 + M u     (p_t: the decayed state's prediction, before the write)
//   S_end = e^{G_last} S0 + K^T diag(e^{G_last - G}) u
//
// ---- Backward of one chunk (reverse over chunks; dS holds dS_end, then dS0) ----
//   du = P^T dO + diag(e^{G_last-G}) K dS_end;  dX = (I + diag(beta) M)^-T du (back
//   substitution);  dv = dR = diag(beta) dX;  dM = -strict_tril(diag(beta) dX u^T);
//   dP = tril(dO u^T);  dbeta_i = <dX_i, R_i - (M u)_i>;
//   dq = diag(E) dO S0^T + (dP * Gamma) K
//   dk = diag(e^{G_last-G}) u dS_end^T - diag(E) dR S0^T + (dP * Gamma)^T Q
//        + (dM * Gamma) K + (dM * Gamma)^T K
//   dG_i = E_i <dO_i, (Q S0)_i> - E_i <dR_i, (K S0)_i> - e^{G_last-G_i} <(K dS_end)_i, u_i>
//          + rowsum(Z)_i - colsum(Z)_i,  Z = dP * P + dM * M
//   dG_last += e^{G_last} <S0, dS_end> + sum_j e^{G_last-G_j} <(K dS_end)_j, u_j>
//   dg = reverse chunk-local cumsum of dG
//   dS0 = e^{G_last} dS_end + Q^T diag(E) dO - K^T diag(E) dR
// The backward first re-runs the forward over the sequence, saving each chunk's start
// state to a scratch buffer, then walks the chunks in reverse recomputing the chunk terms
// from the saved state (v_new is never stored). Only the last document segment sees
// grad_h_final; only the segment at t = 0 reaches dh0.
//
// Precision: inputs bf16, f32 (or f64); everything on chip, every accumulation and the
// state in f32 (f64 for f64 inputs); outputs are rounded once to the input dtype.
//
// Two implementations of the forward and the backward:
//   * the SIMT kernels below (f32, f64, and bf16 with a key dim the tensor-core path does
//     not take): one block per (b, h, V tile), shared-memory products with one output
//     element per thread, every chunk term recomputed by each V tile: straightforward and
//     exact to f32 rounding, but only B * H * tiles blocks and no tensor cores;
//   * the tensor-core kernels for bf16 ("Tensor-core forward", "Tensor-core backward"):
//     flash-linear-attention's WY form on mma.sync, every chunk in parallel except in the
//     state recurrences (forward and reverse).
// The decode kernel is SIMT. The chunk table is one kernel launch per call; with doc_ids
// the chunked paths read the largest chunk count back to the host (one stream
// synchronisation) to size their per-chunk buffers, without them it is ceil(T / 64).
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/ops/gated_delta_rule.h"
#include "cuda/async_copy.cuh"
#include "cuda/autotune.h"
#include "cuda/block_timeline.h"
#include "cuda/dependent_launch.h"
#include "cuda/gated_delta_rule.h"
#include "cuda/gated_delta_rule_fit.cuh"
#include "cuda/launch.h"
#include "cuda/mma_tiles.cuh"

namespace ham::cuda {

namespace {

constexpr int kChunk = 64;
static_assert(kChunk == kGatedDeltaRuleChunkSize, "the CUDA chunk must be the CPU's");
constexpr int kBlock = 256;         // threads of the forward, backward and decode blocks
// Per-row loops give thread i row i of a chunk, and warp reductions need whole warps.
static_assert(kBlock >= kChunk && kBlock % 32 == 0, "kBlock: one thread per chunk row, whole warps");
// The chunk table's block (one per batch row): kTableItems consecutive tokens a thread.
// (1024 threads of 8 tokens, bound to 64 registers, spilled 71 instructions of each tile
// on sm_90a; 512 of 16 take up to 128.)
constexpr int kTableThreads = 512;
constexpr int kTableItems = 16;
constexpr int kTableTile = kTableThreads * kTableItems;

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }

// The chunks a block takes in a loop over [first + blockIdx.x, count) in steps of gridDim.x.
__device__ __forceinline__ int64_t strided_chunks(int first, int count) {
  const int from = first + int(blockIdx.x);
  return from < count ? (count - from + int(gridDim.x) - 1) / int(gridDim.x) : 0;
}

// ---- Chunk table ---------------------------------------------------------------------
// Per batch row b: chunk_begin[b, c] for c < count[b] (and chunk_begin[b, count[b]] = T),
// chunk_doc_start[b, c] = 1 when chunk c begins a document (t = 0 included), and
// doc_chunk[b, d] = the first chunk of document d for d < docs[b] (doc_chunk[b, docs[b]]
// = count[b]), which lets the state passes give each document its own blocks. A token t
// begins a chunk iff (t - s) % 64 == 0 with s its document's first token, which is the
// CPU's "each segment chunked from its first token". One block per row walks the row in
// tiles of kTableTile tokens, kTableItems consecutive ones a thread: s by a max-scan of
// document starts, the chunk and document indices by sum-scans of chunk and document
// starts, all carried across tiles. (A token a thread, the H200 took 26 us a call at
// T = 16384: 16 tiles of three block-wide scans each; thirty-seventh session's profile.
// That was with or without doc_ids; without them no table is built now.)

struct MaxOp {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

template <class Index>
__global__ void __launch_bounds__(kTableThreads)
    chunk_table_kernel(const Index* doc_ids, int64_t seq_len, int32_t* chunk_begin,
                       int32_t* chunk_doc_start, int32_t* doc_chunk, int32_t* chunk_count,
                       int32_t* doc_count, BlockStamps* timeline) {
  begin_dependent_kernel();
  const StampedBlock stamped(timeline);
  using Scan = cub::BlockScan<int, kTableThreads>;
  HAM_STATIC_SHARED(typename Scan::TempStorage, scan_storage);
  HAM_STATIC_SHARED(int, carry_doc_start);
  HAM_STATIC_SHARED(int, carry_count);
  HAM_STATIC_SHARED(int, carry_docs);
  const int64_t b = blockIdx.x;
  const Index* doc = doc_ids + b * seq_len;
  int32_t* begins = chunk_begin + b * (seq_len + 1);
  int32_t* doc_starts = chunk_doc_start + b * (seq_len + 1);
  int32_t* doc_chunks = doc_chunk + b * (seq_len + 1);
  if (threadIdx.x == 0) {
    carry_doc_start = 0;
    carry_count = 0;
    carry_docs = 0;
  }
  __syncthreads();
  stamped.loop_begins([&] { return (seq_len + kTableTile - 1) / kTableTile; });
  for (int64_t base = 0; base < seq_len; base += kTableTile) {
    const int64_t t0 = base + int64_t(threadIdx.x) * kTableItems;  // this thread's first token
    // doc_first: each token's document start; a token begins its document where that is
    // itself, and a chunk where it is a multiple of 64 before (chunk_index and doc_index
    // hold those flags until their scans turn them into the chunk and document indices).
    int doc_first[kTableItems], chunk_index[kTableItems], doc_index[kTableItems];
    Index previous = t0 > 0 && t0 < seq_len ? doc[t0 - 1] : Index(0);
#pragma unroll
    for (int j = 0; j < kTableItems; ++j) {
      const int64_t t = t0 + j;
      bool starts = false;
      if (t < seq_len) {
        const Index id = doc[t];
        starts = t == 0 || id != previous;
        previous = id;
      }
      doc_first[j] = starts ? int(t) : -1;
    }
    Scan(scan_storage).InclusiveScan(doc_first, doc_first, MaxOp());
    __syncthreads();  // scan_storage is reused below
    auto starts_chunk = [&](int j) {
      const int64_t t = t0 + j;
      return t < seq_len && (t - doc_first[j]) % kChunk == 0;
    };
    auto starts_doc = [&](int j) { return t0 + j < seq_len && t0 + j == doc_first[j]; };
#pragma unroll
    for (int j = 0; j < kTableItems; ++j) {
      doc_first[j] = max(doc_first[j], carry_doc_start);
      chunk_index[j] = starts_chunk(j) ? 1 : 0;
      doc_index[j] = starts_doc(j) ? 1 : 0;
    }
    int tile_chunks = 0, tile_docs = 0;
    Scan(scan_storage).ExclusiveSum(chunk_index, chunk_index, tile_chunks);
    __syncthreads();  // scan_storage is reused below
    Scan(scan_storage).ExclusiveSum(doc_index, doc_index, tile_docs);
#pragma unroll
    for (int j = 0; j < kTableItems; ++j) {
      const int at = carry_count + chunk_index[j];
      if (starts_chunk(j)) {
        begins[at] = int32_t(t0 + j);
        doc_starts[at] = starts_doc(j) ? 1 : 0;
      }
      if (starts_doc(j)) doc_chunks[carry_docs + doc_index[j]] = at;
    }
    __syncthreads();  // every thread has read the carries
    if (threadIdx.x == kTableThreads - 1) {
      carry_doc_start = doc_first[kTableItems - 1];
      carry_count += tile_chunks;
      carry_docs += tile_docs;
    }
    __syncthreads();
  }
  stamped.loop_done();
  if (threadIdx.x == 0) {
    begins[carry_count] = int32_t(seq_len);
    doc_chunks[carry_docs] = carry_count;
    chunk_count[b] = carry_count;
    doc_count[b] = carry_docs;
  }
}

struct ChunkTable {
  Tensor begin, doc_start, doc_chunk;  // i32 [B, T + 1] each
  Tensor count;                        // i32 [2, B]: chunks, then documents, per row
};

// The table of doc_ids ([B, T] on their device). Undefined doc_ids: no table (its tensors
// undefined) and no launch; the kernels then chunk each row as one document (RowChunks).
ChunkTable build_chunk_table(const Tensor& doc_ids, int64_t batch, int64_t seq_len) {
  if (!doc_ids.defined()) return {};
  const Device device = doc_ids.device();
  ChunkTable table{Tensor::empty(Shape{batch, seq_len + 1}, DType::I32, device),
                   Tensor::empty(Shape{batch, seq_len + 1}, DType::I32, device),
                   Tensor::empty(Shape{batch, seq_len + 1}, DType::I32, device),
                   Tensor::empty(Shape{2, batch}, DType::I32, device)};
  if (batch == 0) return table;
  HAM_CHECK(batch < (int64_t(1) << 31), "gated_delta_rule: batch ", batch, " exceeds the grid");
  auto launch = [&]<class Index>(const Index* ids) {
    HAM_LAUNCH_DEPENDENT(unsigned(batch), kTableThreads, 0, launch_stream(),
                         chunk_table_kernel<Index>)(
        ids, seq_len, ptr<int32_t>(table.begin), ptr<int32_t>(table.doc_start),
        ptr<int32_t>(table.doc_chunk), ptr<int32_t>(table.count),
        ptr<int32_t>(table.count) + batch,
        block_timeline_for_launch(KernelName{"chunk_table_kernel", {}, 0}, batch));
    HAM_CUDA_CHECK_LAUNCH();
  };
  dispatch_index("gated_delta_rule doc_ids", doc_ids.dtype(),
                 [&]<class Index>() { launch(ptr<const Index>(doc_ids)); });
  return table;
}

ChunkTable build_chunk_table(const GatedDeltaRuleArgs& a, int64_t batch, int64_t seq_len) {
  return build_chunk_table(a.doc_ids, batch, seq_len);
}

// ---- Shared memory of one block ------------------------------------------------------
// The same carve on host (sizing) and device (pointers). kc, qc hold the chunk's key and
// query rows in the input dtype (exact copies); the rest is in the compute type C.
struct SmemLayout {
  size_t kc, qc;                       // T [kChunk][K]
  size_t state;                        // C [K][vt]            S (forward), S0 (backward)
  size_t m, p;                         // C [kChunk][kChunk]   M, P (then dM*Gamma, dP*Gamma)
  size_t ks, qs, r, u;                 // C [kChunk][vt]       K S0, Q S0, R, v_new
  size_t gcum, decay, to_end, beta;    // C [kChunk]           G, e^G, e^{G_last-G}, beta
  size_t scalars;                      // C [4]                e^{G_last}
  size_t dstate, z, dout, dx, kds;     // backward: C [K][vt], [kChunk][kChunk], [kChunk][vt] x3
  size_t dgate, to_end_terms;          // backward: C [kChunk]
  size_t bytes;
  // Row strides, padded by one 4-byte word so that lanes walking different rows of kc, qc,
  // S, dS or u at the same column hit different banks.
  int64_t ldk;  // kc, qc: K + 2 (bf16) or K + 1
  int lds;      // state, dstate: vt + 1
  int ldu;      // u: vt + 1

  __host__ __device__ static size_t take(size_t& at, size_t nbytes) {
    const size_t here = at;
    at += (nbytes + 15) / 16 * 16;
    return here;
  }

  __host__ __device__ SmemLayout(int64_t key_dim, int vt, size_t t_size, size_t c_size,
                                 bool backward)
      : SmemLayout(key_dim, vt, t_size, c_size, backward, true) {}
  // q_in_shared false: no qc (the kernels read Q's rows from global memory instead).
  __host__ __device__ SmemLayout(int64_t key_dim, int vt, size_t t_size, size_t c_size,
                                 bool backward, bool q_in_shared) {
    size_t at = 0;
    ldk = key_dim + (t_size == 2 ? 2 : 1);
    lds = vt + 1;
    ldu = vt + 1;
    const size_t rows_k = size_t(kChunk) * size_t(ldk), rows_v = size_t(kChunk) * vt;
    const size_t square = size_t(kChunk) * kChunk, state_size = size_t(key_dim) * lds;
    kc = take(at, rows_k * t_size);
    qc = take(at, q_in_shared ? rows_k * t_size : 0);
    state = take(at, state_size * c_size);
    m = take(at, square * c_size);
    p = take(at, square * c_size);
    ks = take(at, rows_v * c_size);
    qs = take(at, rows_v * c_size);
    r = take(at, rows_v * c_size);
    u = take(at, size_t(kChunk) * ldu * c_size);
    gcum = take(at, kChunk * c_size);
    decay = take(at, kChunk * c_size);
    to_end = take(at, kChunk * c_size);
    beta = take(at, kChunk * c_size);
    scalars = take(at, 4 * c_size);
    const size_t b = backward ? 1 : 0;
    dstate = take(at, b * state_size * c_size);
    z = take(at, b * square * c_size);
    dout = take(at, b * rows_v * c_size);
    dx = take(at, b * rows_v * c_size);
    kds = take(at, b * rows_v * c_size);
    dgate = take(at, b * kChunk * c_size);
    to_end_terms = take(at, b * kChunk * c_size);
    bytes = at;
  }
};

template <class T, class C>
struct Smem {
  T *kc, *qc;
  C *state, *m, *p, *ks, *qs, *r, *u, *gcum, *decay, *to_end, *beta, *scalars;
  C *dstate, *z, *dout, *dx, *kds, *dgate, *to_end_terms;
  int64_t ldk;
  int lds, ldu;

  __device__ Smem(unsigned char* base, const SmemLayout& l)
      : kc(reinterpret_cast<T*>(base + l.kc)),
        qc(reinterpret_cast<T*>(base + l.qc)),
        state(reinterpret_cast<C*>(base + l.state)),
        m(reinterpret_cast<C*>(base + l.m)),
        p(reinterpret_cast<C*>(base + l.p)),
        ks(reinterpret_cast<C*>(base + l.ks)),
        qs(reinterpret_cast<C*>(base + l.qs)),
        r(reinterpret_cast<C*>(base + l.r)),
        u(reinterpret_cast<C*>(base + l.u)),
        gcum(reinterpret_cast<C*>(base + l.gcum)),
        decay(reinterpret_cast<C*>(base + l.decay)),
        to_end(reinterpret_cast<C*>(base + l.to_end)),
        beta(reinterpret_cast<C*>(base + l.beta)),
        scalars(reinterpret_cast<C*>(base + l.scalars)),
        dstate(reinterpret_cast<C*>(base + l.dstate)),
        z(reinterpret_cast<C*>(base + l.z)),
        dout(reinterpret_cast<C*>(base + l.dout)),
        dx(reinterpret_cast<C*>(base + l.dx)),
        kds(reinterpret_cast<C*>(base + l.kds)),
        dgate(reinterpret_cast<C*>(base + l.dgate)),
        to_end_terms(reinterpret_cast<C*>(base + l.to_end_terms)),
        ldk(l.ldk),
        lds(l.lds),
        ldu(l.ldu) {}
};

// Inputs and sizes shared by the kernels.
template <class T>
struct Problem {
  const T *q, *k, *v, *g, *beta, *h0;  // h0 may be null
  const float* g_f32;  // f32 gates with bf16 T (mixed precision); then g is null
  // the chunk table, all null without doc_ids (then read through RowChunks, StateTile)
  const int32_t *chunk_begin, *chunk_doc_start, *chunk_count;
  const int32_t *doc_chunk, *doc_count;
  int64_t batch, seq_len, heads, key_dim, value_dim;
  int vt, tiles;
  // The launch's block stamps while recording (cuda/block_timeline.h; the tensor-core
  // kernels), else null: launch_kernel sets it a launch.
  BlockStamps* timeline = nullptr;

  // Index of token t of batch b, head h into [B, T, H] (times the width for [B, T, H, D]).
  __device__ int64_t row(int64_t b, int64_t t, int64_t h) const {
    return (b * seq_len + t) * heads + h;
  }
};

// Batch row b's chunks: the chunk table's where there are doc_ids, else (no table) the row
// as one document cut from t = 0, chunk c being [64 c, min(64 c + 64, T)). Without ids no
// table is built: a kernel and its launch fewer in each forward and recomputing backward.
struct RowChunks {
  const int32_t* begins;      // the table's rows, or null
  const int32_t* doc_starts;
  const int32_t* doc_firsts;
  const int32_t* doc_count;   // the table's count for the row, or null
  int seq_len, count;         // T < 2^30 (check_sizes)

  template <class T>
  __device__ RowChunks(const Problem<T>& pr, int64_t b)
      : begins(pr.chunk_begin ? pr.chunk_begin + b * (pr.seq_len + 1) : nullptr),
        doc_starts(pr.chunk_doc_start ? pr.chunk_doc_start + b * (pr.seq_len + 1) : nullptr),
        doc_firsts(pr.doc_chunk ? pr.doc_chunk + b * (pr.seq_len + 1) : nullptr),
        doc_count(pr.doc_count ? pr.doc_count + b : nullptr),
        seq_len(int(pr.seq_len)),
        count(pr.chunk_count ? pr.chunk_count[b] : (seq_len + kChunk - 1) / kChunk) {}

  // Chunk c's first token; begin(count) = T.
  __device__ int64_t begin(int chunk) const {
    return begins ? begins[chunk] : min(chunk * kChunk, seq_len);
  }
  __device__ bool starts_document(int chunk) const {
    return doc_starts ? doc_starts[chunk] != 0 : chunk == 0;
  }
  // The row's documents (without a table one, none in a row of T = 0), and document d's
  // first chunk; document_begin(documents()) = count.
  __device__ int documents() const { return doc_count ? *doc_count : (count > 0 ? 1 : 0); }
  __device__ int document_begin(int d) const { return doc_firsts ? doc_firsts[d] : d * count; }
};

// The log-decay gate of row i ([B, T, H] index), from the f32 gates when given.
template <class T>
__device__ __forceinline__ compute_t<T> gate_at(const Problem<T>& pr, int64_t i) {
  return pr.g_f32 ? compute_t<T>(pr.g_f32[i]) : compute_t<T>(load(pr.g[i]));
}

// The block's coordinates: batch b, head h, V tile `tile` covering value columns
// [col0, col0 + cols) (cols < vt on a ragged last tile; the missing columns are zeros).
struct BlockCoords {
  int64_t b, h, tile, col0;
  int cols;
};

template <class T>
__device__ BlockCoords block_coords(const Problem<T>& pr) {
  BlockCoords c;
  c.tile = blockIdx.x;
  c.h = blockIdx.y;
  c.b = blockIdx.z;
  c.col0 = c.tile * pr.vt;
  c.cols = int(min(int64_t(pr.vt), pr.value_dim - c.col0));
  return c;
}

// S <- h0[b, h, :, tile] (zeros without h0 and in the missing columns of a ragged tile);
// S is [K][vt] with row stride ld.
template <class T, class C>
__device__ void load_state(const Problem<T>& pr, const BlockCoords& bc, const T* src, C* state,
                           int ld) {
  const int vt = pr.vt;
  const int64_t base = (bc.b * pr.heads + bc.h) * pr.key_dim * pr.value_dim;
  for (int64_t idx = threadIdx.x; idx < pr.key_dim * vt; idx += blockDim.x) {
    const int64_t a = idx / vt;
    const int c = int(idx % vt);
    state[a * ld + c] =
        src && c < bc.cols ? C(load(src[base + a * pr.value_dim + bc.col0 + c])) : C(0);
  }
}

template <class T, class C>
__device__ void store_state(const Problem<T>& pr, const BlockCoords& bc, const C* state, int ld,
                            T* dst) {
  const int vt = pr.vt;
  const int64_t base = (bc.b * pr.heads + bc.h) * pr.key_dim * pr.value_dim;
  for (int64_t idx = threadIdx.x; idx < pr.key_dim * vt; idx += blockDim.x) {
    const int64_t a = idx / vt;
    const int c = int(idx % vt);
    if (c < bc.cols) dst[base + a * pr.value_dim + bc.col0 + c] = store<T>(state[a * ld + c]);
  }
}

// S <- 0 for a [rows][cols] matrix of row stride ld.
template <class C>
__device__ void zero_state(C* x, int64_t rows, int cols, int ld) {
  for (int64_t idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
    x[(idx / cols) * ld + idx % cols] = C(0);
  }
}

// Row i of Q's chunk from `begin`, in global memory: the SIMT kernels read it there with
// kQInShared false, where a chunk's K and Q rows together do not fit a block (f32 at K = 256
// on an A100's 163 KiB), and from its copy in shared memory (qc) otherwise. (The staging
// kernels keep their own indexing of qc, under `if constexpr`: so written, their machine
// code stayed byte for byte what the H200 timed.)
template <class T>
__device__ __forceinline__ const T* q_row_in_global(const Problem<T>& pr, const BlockCoords& bc,
                                                    int64_t begin, int i) {
  return pr.q + pr.row(bc.b, begin + i, bc.h) * pr.key_dim;
}

// Everything of one chunk [begin, begin + n) that the forward output and the backward
// read, given its start state in s.state (CPU: compute_chunk_terms). On return (after a
// barrier): kc, qc (with kQInShared), gcum = G, decay = E, to_end = e^{G_last - G}, beta,
// scalars[0] = e^{G_last}, m = M, p = P (zero outside the chunk's rows and masks),
// ks = K S0, qs = Q S0, u = v_new, and r = R - M u (the residual left once the earlier
// rows' writes are subtracted; u = diag(beta) r).
template <bool kQInShared, class T, class C>
__device__ void chunk_terms(const Problem<T>& pr, const BlockCoords& bc, const Smem<T, C>& s,
                            int64_t begin, int n) {
  const int64_t K = pr.key_dim;
  const int vt = pr.vt;
  // Rows of the chunk; gates and write strengths.
  for (int64_t idx = threadIdx.x; idx < int64_t(n) * K; idx += blockDim.x) {
    const int64_t i = idx / K, a = idx % K;
    const int64_t at = pr.row(bc.b, begin + i, bc.h) * K + a;
    s.kc[i * s.ldk + a] = pr.k[at];
    if constexpr (kQInShared) s.qc[i * s.ldk + a] = pr.q[at];
  }
  if (int(threadIdx.x) < n) {
    const int64_t at = pr.row(bc.b, begin + threadIdx.x, bc.h);
    s.gcum[threadIdx.x] = gate_at(pr, at);
    s.beta[threadIdx.x] = C(load(pr.beta[at]));
  }
  __syncthreads();
  // G_i = g_0 + ... + g_i, in order (as the CPU's running sum).
  if (threadIdx.x == 0) {
    C running = C(0);
    for (int i = 0; i < n; ++i) s.gcum[i] = running += s.gcum[i];
  }
  __syncthreads();
  // E_i = e^{G_i}, e^{G_last - G_i}, e^{G_last}
  if (int(threadIdx.x) < n) {
    const C last = s.gcum[n - 1], gi = s.gcum[threadIdx.x];
    s.decay[threadIdx.x] = exp_(gi);
    s.to_end[threadIdx.x] = exp_(last - gi);
    if (threadIdx.x == 0) s.scalars[0] = exp_(last);
  }
  // M = strict_tril(K K^T * Gamma), P = tril(Q K^T * Gamma); Gamma_ij = e^{G_i - G_j} is
  // evaluated only for j <= i (no e^{-G}, no inf * 0).
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += blockDim.x) {
    const int i = idx / kChunk, j = idx % kChunk;
    C mv = C(0), pv = C(0);
    if (i < n && j <= i) {
      const T *ki = s.kc + i * s.ldk, *qi = s.qc + i * s.ldk, *kj = s.kc + j * s.ldk;
      if constexpr (!kQInShared) qi = q_row_in_global(pr, bc, begin, i);
      C kk = C(0), qk = C(0);
      for (int64_t a = 0; a < K; ++a) {
        const C kja = C(load(kj[a]));
        kk += C(load(ki[a])) * kja;
        qk += C(load(qi[a])) * kja;
      }
      const C gamma = exp_(s.gcum[i] - s.gcum[j]);
      mv = j < i ? kk * gamma : C(0);
      pv = qk * gamma;
    }
    s.m[idx] = mv;
    s.p[idx] = pv;
  }
  // K S0, Q S0 and R = V - diag(E) K S0 (columns past the tile's end read as 0).
  for (int idx = threadIdx.x; idx < n * vt; idx += blockDim.x) {
    const int i = idx / vt, c = idx % vt;
    const T *ki = s.kc + i * s.ldk, *qi = s.qc + i * s.ldk;
    if constexpr (!kQInShared) qi = q_row_in_global(pr, bc, begin, i);
    C kv = C(0), qv = C(0);
    for (int64_t a = 0; a < K; ++a) {
      const C sa = s.state[a * s.lds + c];
      kv += C(load(ki[a])) * sa;
      qv += C(load(qi[a])) * sa;
    }
    s.ks[idx] = kv;
    s.qs[idx] = qv;
    const C vv =
        c < bc.cols ? C(load(pr.v[pr.row(bc.b, begin + i, bc.h) * pr.value_dim + bc.col0 + c]))
                    : C(0);
    // R_i = V_i - E_i (K S0)_i  (E_i from G directly: s.decay is not yet published)
    s.r[idx] = vv - exp_(s.gcum[i]) * kv;
  }
  __syncthreads();
  // Forward substitution with the unit lower-triangular I + diag(beta) M, one value
  // column per group of tpc consecutive lanes (a group never spans two warps):
  //   u_i = beta_i (R_i - sum_{j<i} M_ij u_j)
  // Rows go in order; the group's lanes split the j sum and combine it by shuffles in a
  // fixed pattern (deterministic). No block barrier between rows: columns are independent.
  {
    const int tpc = int(blockDim.x) / vt;
    const int c = int(threadIdx.x) / tpc, sub = int(threadIdx.x) % tpc;
    for (int i = 0; i < n; ++i) {
      C acc = C(0);
      for (int j = sub; j < i; j += tpc) acc += s.m[i * kChunk + j] * s.u[j * s.ldu + c];
      for (int offset = tpc / 2; offset > 0; offset >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      }
      if (sub == 0) {
        const C rest = s.r[i * vt + c] - acc;
        s.r[i * vt + c] = rest;
        s.u[i * s.ldu + c] = s.beta[i] * rest;
      }
      __syncwarp();
    }
  }
  __syncthreads();
}

// S <- e^{G_last} S0 + K^T diag(e^{G_last - G}) u   (CPU: chunk_end_state)
template <class T, class C>
__device__ void advance_state(const Problem<T>& pr, const Smem<T, C>& s, int n) {
  const int64_t K = pr.key_dim;
  const int vt = pr.vt;
  const C total = s.scalars[0];
  for (int64_t idx = threadIdx.x; idx < K * vt; idx += blockDim.x) {
    const int64_t a = idx / vt;
    const int c = int(idx % vt);
    C acc = total * s.state[a * s.lds + c];
    for (int i = 0; i < n; ++i) {
      acc += C(load(s.kc[i * s.ldk + a])) * s.to_end[i] * s.u[i * s.ldu + c];
    }
    s.state[a * s.lds + c] = acc;
  }
}

// ---- Chunked forward -----------------------------------------------------------------
// One block per (tile, h, b). Writes o for its columns, h_final for its columns and the
// fit partial sums fit_part[row, tile, 0..2] = (<p, v>, ||p||^2, ||v||^2) over its columns.
// kQInShared false: Q's rows read from global memory (q_row_in_global).
template <class T, bool kQInShared = true>
__global__ void __launch_bounds__(kBlock)
    gdr_forward_kernel(Problem<T> pr, T* o, T* h_final, compute_t<T>* fit_part) {
  using C = compute_t<T>;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  const SmemLayout layout = kQInShared
                                ? SmemLayout(pr.key_dim, pr.vt, sizeof(T), sizeof(C), false)
                                : SmemLayout(pr.key_dim, pr.vt, sizeof(T), sizeof(C), false, false);
  const Smem<T, C> s(smem_raw, layout);
  const BlockCoords bc = block_coords(pr);
  const int vt = pr.vt;
  const int64_t V = pr.value_dim;
  const RowChunks row_chunks(pr, bc.b);
  const int chunks = row_chunks.count;

  load_state(pr, bc, pr.h0, s.state, s.lds);  // h0 seeds the segment at t = 0
  __syncthreads();
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    if (begin > 0 && row_chunks.starts_document(chunk)) {  // document start: the state resets
      zero_state(s.state, pr.key_dim, vt, s.lds);
      __syncthreads();
    }
    chunk_terms<kQInShared>(pr, bc, s, begin, n);
    // O = diag(E) Q S0 + P u;   pred = diag(E) K S0 + M u  (into ks, element by element)
    for (int idx = threadIdx.x; idx < n * vt; idx += blockDim.x) {
      const int i = idx / vt, c = idx % vt;
      C out = s.decay[i] * s.qs[idx], pred = s.decay[i] * s.ks[idx];
      for (int j = 0; j <= i; ++j) {
        const C uj = s.u[j * s.ldu + c];
        out += s.p[i * kChunk + j] * uj;
        pred += s.m[i * kChunk + j] * uj;  // M_ii = 0
      }
      s.ks[idx] = pred;
      if (c < bc.cols) o[pr.row(bc.b, begin + i, bc.h) * V + bc.col0 + c] = store<T>(out);
    }
    advance_state(pr, s, n);
    __syncthreads();
    // Fit partial sums of each row, one warp per row, lanes over the tile's columns.
    {
      const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
      const int warps = int(blockDim.x) / 32;
      for (int i = warp; i < n; i += warps) {
        const int64_t row = pr.row(bc.b, begin + i, bc.h);
        C pv = C(0), pp = C(0), vv = C(0);
        for (int c = lane; c < bc.cols; c += 32) {
          const C pred = s.ks[i * vt + c], val = C(load(pr.v[row * V + bc.col0 + c]));
          pv += pred * val;
          pp += pred * pred;
          vv += val * val;
        }
        pv = warp_sum(pv);
        pp = warp_sum(pp);
        vv = warp_sum(vv);
        if (lane == 0) {
          C* part = fit_part + (row * pr.tiles + bc.tile) * 3;
          part[0] = pv;
          part[1] = pp;
          part[2] = vv;
        }
      }
    }
    __syncthreads();
  }
  store_state(pr, bc, s.state, s.lds, h_final);  // after token T-1 (h0, or 0, when T = 0)
}

// ---- Token-by-token recurrence (decoding; the _naive table) --------------------------
// One block per (tile, h, b), the state slice S [K][vt] in shared memory, per token:
//   S <- e^{g_t} S;  p = S^T k_t;  fit partials of (p, v_t);  S += beta_t k_t (v_t - p)^T;
//   o_t = S^T q_t
// (CPU: gated_delta_rule_naive). The document reset happens before the decay.
struct RecurrentLayout {
  size_t state, kvec, qvec, pred, resid, bytes;
  __host__ __device__ RecurrentLayout(int64_t key_dim, int vt, size_t c_size) {
    size_t at = 0;
    state = SmemLayout::take(at, size_t(key_dim) * vt * c_size);
    kvec = SmemLayout::take(at, size_t(key_dim) * c_size);
    qvec = SmemLayout::take(at, size_t(key_dim) * c_size);
    pred = SmemLayout::take(at, size_t(vt) * c_size);
    resid = SmemLayout::take(at, size_t(vt) * c_size);
    bytes = at;
  }
};

template <class T, class Index>
__global__ void __launch_bounds__(kBlock)
    gdr_recurrent_kernel(Problem<T> pr, const Index* doc_ids, T* o, T* h_final,
                         compute_t<T>* fit_part) {
  using C = compute_t<T>;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  const RecurrentLayout l(pr.key_dim, pr.vt, sizeof(C));
  C* state = reinterpret_cast<C*>(smem_raw + l.state);
  C* kvec = reinterpret_cast<C*>(smem_raw + l.kvec);
  C* qvec = reinterpret_cast<C*>(smem_raw + l.qvec);
  C* pred = reinterpret_cast<C*>(smem_raw + l.pred);
  C* resid = reinterpret_cast<C*>(smem_raw + l.resid);
  const BlockCoords bc = block_coords(pr);
  const int vt = pr.vt;
  const int64_t K = pr.key_dim, V = pr.value_dim, T_ = pr.seq_len;
  const int tpc = int(blockDim.x) / vt;
  const int col = int(threadIdx.x) / tpc, sub = int(threadIdx.x) % tpc;

  load_state(pr, bc, pr.h0, state, vt);
  for (int64_t t = 0; t < T_; ++t) {
    const int64_t row = pr.row(bc.b, t, bc.h);
    for (int64_t a = threadIdx.x; a < K; a += blockDim.x) {
      kvec[a] = C(load(pr.k[row * K + a]));
      qvec[a] = C(load(pr.q[row * K + a]));
    }
    const bool reset = t > 0 && doc_ids && doc_ids[bc.b * T_ + t] != doc_ids[bc.b * T_ + t - 1];
    const C decay = exp_(gate_at(pr, row));
    const C beta = C(load(pr.beta[row]));
    __syncthreads();  // also orders the previous token's reads of state before the writes
    // S <- e^{g_t} S (0 at a document start)
    for (int64_t idx = threadIdx.x; idx < K * vt; idx += blockDim.x) {
      state[idx] = reset ? C(0) : state[idx] * decay;
    }
    __syncthreads();
    // p = S^T k_t, one column per lane group
    {
      C acc = C(0);
      for (int64_t a = sub; a < K; a += tpc) acc += state[a * vt + col] * kvec[a];
      for (int offset = tpc / 2; offset > 0; offset >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      }
      if (sub == 0) pred[col] = acc;
    }
    __syncthreads();
    // Fit partial sums and r = v_t - p (warp 0)
    if (threadIdx.x < 32) {
      C pv = C(0), pp = C(0), vv = C(0);
      for (int c = int(threadIdx.x); c < vt; c += 32) {
        const C val = c < bc.cols ? C(load(pr.v[row * V + bc.col0 + c])) : C(0);
        const C pc = pred[c];
        pv += pc * val;
        pp += pc * pc;
        vv += val * val;
        resid[c] = val - pc;
      }
      pv = warp_sum(pv);
      pp = warp_sum(pp);
      vv = warp_sum(vv);
      if (threadIdx.x == 0) {
        C* part = fit_part + (row * pr.tiles + bc.tile) * 3;
        part[0] = pv;
        part[1] = pp;
        part[2] = vv;
      }
    }
    __syncthreads();
    // S += beta_t k_t r^T
    for (int64_t idx = threadIdx.x; idx < K * vt; idx += blockDim.x) {
      state[idx] += beta * kvec[idx / vt] * resid[idx % vt];
    }
    __syncthreads();
    // o_t = S^T q_t
    {
      C acc = C(0);
      for (int64_t a = sub; a < K; a += tpc) acc += state[a * vt + col] * qvec[a];
      for (int offset = tpc / 2; offset > 0; offset >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      }
      if (sub == 0 && col < bc.cols) o[row * V + bc.col0 + col] = store<T>(acc);
    }
    __syncthreads();  // the next token overwrites kvec, qvec
  }
  store_state(pr, bc, state, vt, h_final);
}

// ---- Backward ------------------------------------------------------------------------
// One block per (tile, h, b). Pass 1 re-runs the forward and saves each chunk's start
// state to checkpoints[block][chunk]; pass 2 walks the chunks in reverse (CPU:
// chunked_backward_head / chunk_backward). Partial k-side gradients of this tile go to
// *_part[tile][...] (null when not wanted); dv and dh0 are written directly.
template <class T>
struct BackwardOut {
  const T *grad_o, *grad_h_final;
  compute_t<T>* checkpoints;  // [blocks][max_chunks][K][vt]
  int64_t max_chunks;
  T *dv, *dh0;                                           // may be null
  compute_t<T> *dq_part, *dk_part, *dg_part, *dbeta_part;  // may be null
};

// kQInShared false: Q's rows read from global memory (q_row_in_global).
template <class T, bool kQInShared = true>
__global__ void __launch_bounds__(kBlock) gdr_backward_kernel(Problem<T> pr, BackwardOut<T> out) {
  using C = compute_t<T>;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  const SmemLayout layout = kQInShared
                                ? SmemLayout(pr.key_dim, pr.vt, sizeof(T), sizeof(C), true)
                                : SmemLayout(pr.key_dim, pr.vt, sizeof(T), sizeof(C), true, false);
  const Smem<T, C> s(smem_raw, layout);
  const BlockCoords bc = block_coords(pr);
  const int vt = pr.vt;
  const int64_t K = pr.key_dim, V = pr.value_dim, state_size = K * vt;
  const int64_t rows = pr.batch * pr.seq_len * pr.heads;
  const RowChunks row_chunks(pr, bc.b);
  const int chunks = row_chunks.count;
  const int64_t block = (bc.b * pr.heads + bc.h) * pr.tiles + bc.tile;
  C* checkpoints = out.checkpoints + block * out.max_chunks * state_size;

  // Pass 1: chunk start states (the segment at t = 0 starts from h0, the others from 0).
  load_state(pr, bc, pr.h0, s.state, s.lds);
  __syncthreads();
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    if (begin > 0 && row_chunks.starts_document(chunk)) {
      zero_state(s.state, K, vt, s.lds);
      __syncthreads();
    }
    C* saved = checkpoints + int64_t(chunk) * state_size;
    for (int64_t idx = threadIdx.x; idx < state_size; idx += blockDim.x) {
      saved[idx] = s.state[(idx / vt) * s.lds + idx % vt];
    }
    chunk_terms<kQInShared>(pr, bc, s, begin, n);
    advance_state(pr, s, n);
    __syncthreads();
  }

  // Pass 2: dS = grad_h_final for the last segment, 0 at the end of every earlier one.
  load_state(pr, bc, out.grad_h_final, s.dstate, s.lds);
  __syncthreads();
  const int tpc = int(blockDim.x) / vt;
  for (int chunk = chunks - 1; chunk >= 0; --chunk) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    if (chunk + 1 < chunks && row_chunks.starts_document(chunk + 1)) {
      zero_state(s.dstate, K, vt, s.lds);
    }
    const C* saved = checkpoints + int64_t(chunk) * state_size;
    for (int64_t idx = threadIdx.x; idx < state_size; idx += blockDim.x) {
      s.state[(idx / vt) * s.lds + idx % vt] = saved[idx];
    }
    chunk_terms<kQInShared>(pr, bc, s, begin, n);  // its first barrier orders the loops above
    const C total = s.scalars[0];

    // dO rows of the tile and K dS_end.
    for (int idx = threadIdx.x; idx < n * vt; idx += blockDim.x) {
      const int i = idx / vt, c = idx % vt;
      s.dout[idx] = c < bc.cols
                        ? C(load(out.grad_o[pr.row(bc.b, begin + i, bc.h) * V + bc.col0 + c]))
                        : C(0);
      C acc = C(0);
      for (int64_t a = 0; a < K; ++a) acc += C(load(s.kc[i * s.ldk + a])) * s.dstate[a * s.lds + c];
      s.kds[idx] = acc;
    }
    __syncthreads();
    // du = P^T dO + diag(e^{G_last-G}) K dS_end   (into dx)
    for (int idx = threadIdx.x; idx < n * vt; idx += blockDim.x) {
      const int i = idx / vt, c = idx % vt;
      C acc = s.to_end[i] * s.kds[idx];
      for (int j = i; j < n; ++j) acc += s.p[j * kChunk + i] * s.dout[j * vt + c];
      s.dx[idx] = acc;
    }
    __syncthreads();
    // dX = (I + diag(beta) M)^-T du by back substitution, in place:
    //   dX_i = du_i - sum_{j>i} beta_j M_ji dX_j,  i = n-1 .. 0
    {
      const int c = int(threadIdx.x) / tpc, sub = int(threadIdx.x) % tpc;
      for (int i = n - 1; i >= 0; --i) {
        C acc = C(0);
        for (int j = i + 1 + sub; j < n; j += tpc) {
          acc += s.beta[j] * s.m[j * kChunk + i] * s.dx[j * vt + c];
        }
        for (int offset = tpc / 2; offset > 0; offset >>= 1) {
          acc += __shfl_xor_sync(0xffffffffu, acc, offset);
        }
        if (sub == 0) s.dx[i * vt + c] -= acc;
        __syncwarp();
      }
    }
    __syncthreads();
    // dv = dR = diag(beta) dX
    if (out.dv) {
      for (int idx = threadIdx.x; idx < n * vt; idx += blockDim.x) {
        const int i = idx / vt, c = idx % vt;
        if (c < bc.cols) {
          out.dv[pr.row(bc.b, begin + i, bc.h) * V + bc.col0 + c] = store<T>(s.beta[i] * s.dx[idx]);
        }
      }
    }
    // dM_ij = -beta_i <dX_i, u_j> (j < i), dP_ij = <dO_i, u_j> (j <= i) over the tile;
    // Z = dP * P + dM * M; then M, P are replaced by dM * Gamma, dP * Gamma (same element).
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += blockDim.x) {
      const int i = idx / kChunk, j = idx % kChunk;
      C zv = C(0), dm_gamma = C(0), dp_gamma = C(0);
      if (i < n && j <= i) {
        C xu = C(0), ou = C(0);
        for (int c = 0; c < vt; ++c) {
          const C uj = s.u[j * s.ldu + c];
          xu += s.dx[i * vt + c] * uj;
          ou += s.dout[i * vt + c] * uj;
        }
        const C gamma = exp_(s.gcum[i] - s.gcum[j]);
        const C dm = j < i ? -s.beta[i] * xu : C(0);
        zv = ou * s.p[idx] + dm * s.m[idx];
        dm_gamma = dm * gamma;
        dp_gamma = ou * gamma;
      }
      s.z[idx] = zv;
      s.m[idx] = dm_gamma;
      s.p[idx] = dp_gamma;
    }
    __syncthreads();
    // dq = diag(E) dO S0^T + (dP * Gamma) K
    // dk = diag(e^{G_last-G}) u dS_end^T - diag(E) dR S0^T + (dP * Gamma)^T Q
    //      + (dM * Gamma) K + (dM * Gamma)^T K
    if (out.dq_part || out.dk_part) {
      for (int64_t idx = threadIdx.x; idx < int64_t(n) * K; idx += blockDim.x) {
        const int i = int(idx / K);
        const int64_t a = idx % K;
        const int64_t at = (bc.tile * rows + pr.row(bc.b, begin + i, bc.h)) * K + a;
        if (out.dq_part) {
          C do_s = C(0);
          for (int c = 0; c < vt; ++c) do_s += s.dout[i * vt + c] * s.state[a * s.lds + c];
          C acc = s.decay[i] * do_s;
          for (int j = 0; j <= i; ++j) acc += s.p[i * kChunk + j] * C(load(s.kc[j * s.ldk + a]));
          out.dq_part[at] = acc;
        }
        if (out.dk_part) {
          C u_ds = C(0), dx_s = C(0);
          for (int c = 0; c < vt; ++c) {
            u_ds += s.u[i * s.ldu + c] * s.dstate[a * s.lds + c];
            dx_s += s.dx[i * vt + c] * s.state[a * s.lds + c];
          }
          C acc = s.to_end[i] * u_ds - s.decay[i] * s.beta[i] * dx_s;
          if constexpr (kQInShared) {
            for (int j = i; j < n; ++j) acc += s.p[j * kChunk + i] * C(load(s.qc[j * s.ldk + a]));
          } else {
            for (int j = i; j < n; ++j) {
              acc += s.p[j * kChunk + i] * C(load(q_row_in_global(pr, bc, begin, j)[a]));
            }
          }
          for (int j = 0; j < n; ++j) {
            acc += (s.m[i * kChunk + j] + s.m[j * kChunk + i]) * C(load(s.kc[j * s.ldk + a]));
          }
          out.dk_part[at] = acc;
        }
      }
    }
    // Per row: dbeta_i = <dX_i, R_i - (M u)_i> (= -sum_j (dX u^T)_ij M_ij + <dX_i, R_i>),
    // and dG_i without the chunk-end terms.
    if (int(threadIdx.x) < n) {
      const int i = int(threadIdx.x);
      C eo = C(0), er = C(0), tt = C(0), xr = C(0), row_z = C(0), col_z = C(0);
      for (int c = 0; c < vt; ++c) {
        const int e = i * vt + c;
        eo += s.dout[e] * s.qs[e];
        er += s.dx[e] * s.ks[e];
        tt += s.kds[e] * s.u[i * s.ldu + c];
        xr += s.dx[e] * s.r[e];
      }
      for (int j = 0; j < n; ++j) {
        row_z += s.z[i * kChunk + j];
        col_z += s.z[j * kChunk + i];
      }
      const C to_end_term = s.to_end[i] * tt;
      s.to_end_terms[i] = to_end_term;
      // (row_z - col_z) first: it is exactly 0 for a one-token chunk, so a gradient that
      // is 0 in exact arithmetic (T = 1 with no h0) comes out 0, not rounding noise.
      s.dgate[i] = (row_z - col_z) + s.decay[i] * eo - s.decay[i] * s.beta[i] * er - to_end_term;
      if (out.dbeta_part) out.dbeta_part[bc.tile * rows + pr.row(bc.b, begin + i, bc.h)] = xr;
    }
    // <S0, dS_end> (block_sum's barriers also publish dgate and to_end_terms)
    C s_ds = C(0);
    for (int64_t idx = threadIdx.x; idx < state_size; idx += blockDim.x) {
      const int64_t e = (idx / vt) * s.lds + idx % vt;
      s_ds += s.state[e] * s.dstate[e];
    }
    s_ds = block_sum(s_ds);
    // dG_last += e^{G_last} <S0, dS_end> + sum_j e^{G_last-G_j} <(K dS_end)_j, u_j>;
    // dg = reverse cumsum of dG within the chunk.
    if (threadIdx.x == 0 && out.dg_part) {
      C end_terms = total * s_ds;
      for (int j = 0; j < n; ++j) end_terms += s.to_end_terms[j];
      C running = C(0);
      for (int i = n - 1; i >= 0; --i) {
        running += s.dgate[i] + (i == n - 1 ? end_terms : C(0));
        out.dg_part[bc.tile * rows + pr.row(bc.b, begin + i, bc.h)] = running;
      }
    }
    __syncthreads();  // everything above read dS_end and S0
    // dS0 = e^{G_last} dS_end + Q^T diag(E) dO - K^T diag(E) dR
    for (int64_t idx = threadIdx.x; idx < state_size; idx += blockDim.x) {
      const int64_t a = idx / vt;
      const int c = int(idx % vt);
      C acc = total * s.dstate[a * s.lds + c];
      for (int i = 0; i < n; ++i) {
        const C e_do = s.decay[i] * s.dout[i * vt + c];
        const C e_dr = s.decay[i] * s.beta[i] * s.dx[i * vt + c];
        if constexpr (kQInShared) {
          acc += C(load(s.qc[i * s.ldk + a])) * e_do - C(load(s.kc[i * s.ldk + a])) * e_dr;
        } else {
          acc += C(load(q_row_in_global(pr, bc, begin, i)[a])) * e_do -
                 C(load(s.kc[i * s.ldk + a])) * e_dr;
        }
      }
      s.dstate[a * s.lds + c] = acc;
    }
    __syncthreads();
  }
  // The segment at t = 0 reaches h0 (T = 0: dh0 = grad_h_final).
  if (out.dh0) store_state(pr, bc, s.dstate, s.lds, out.dh0);
}

// out[i] = sum over tiles of part[tile * count + i], in tile order.
template <class T, class C>
__global__ void sum_tiles_kernel(const C* part, int64_t count, int tiles, T* out) {
  HAM_GRID_STRIDE_LOOP(i, count) {
    C acc = C(0);
    for (int t = 0; t < tiles; ++t) acc += part[int64_t(t) * count + i];
    out[i] = store<T>(acc);
  }
}

// ---- Tensor-core forward (bf16) ------------------------------------------------------
// bf16 q, k, v (with bf16 or f32 gates) and K in {16, 32, 64, 128, 256} take the WY form in
// three kernels, as flash-linear-attention does, so that only the state recurrence is
// sequential and everything else runs on all chunks at once:
//   1. gdr_prepare_mma, one block per (chunk, h, b):
//        G (chunk cumsum) -> gcum (f32 [B, T, H], read by every later kernel),
//        L = diag(beta) M = strict_tril(diag(beta) (K K^T * Gamma)),
//        A = (I + L)^-1 in f32 by 16 x 16 blocks (chunk_inverse)  -> f32, where kept for
//                                    the backward (GatedDeltaRuleKeep), which then reads it
//                                    here instead of forming it again,
//        W = A diag(beta E) K,  U = A diag(beta) V          -> scratch, bf16 [B, T, H, *]
//   2. gdr_state_mma, one block per (V tile of 32 or 64 columns: state_columns, h, b),
//      the chunks in order:
//        S0 of each chunk -> scratch (bf16),  v_new = U - W S0 -> scratch (bf16),
//        S <- e^{G_last} S + K^T diag(e^{G_last - G}) v_new    (S in f32 registers)
//   3. gdr_output_mma, one block per (chunk, h, b) over the V tiles, 8 warps:
//        O = diag(E) Q S0 + P v_new,  pred = diag(E) K S0 + M v_new  -> o, fit partials
//      (pred only where the fit error is wanted: GatedDeltaRuleArgs::want_fit_error)
//      (with set_gated_delta_rule_forward_windows, 2 and 3 run by windows of chunks, the
//      output kernel of one window beside the state pass of the next: StateWindow; 1 too,
//      every window's issued first, each pass waiting for its own)
// (u = v_new = U - W S0 is the forward substitution of the chunk terms above, written with
// the inverse formed.) Products run on mma.sync (cuda/mma_tiles.cuh), f32 accumulation;
// A, S0, v_new and the scaled K and V enter them rounded to bf16, as in FLA. A warp owns
// 16 rows of each product; the 4 warps of a block cover a chunk's 64 (the prepare
// kernel's 8 with set_gated_delta_rule_prepare_warps: each half of the columns; the output
// kernel's 8 warps: 4 for each of its two products, or for each half of O's columns
// without the fit error; the state passes' 8 warps from
// K = 128, kStateWarps: two column halves of v_new or du, 16 key rows each of S). bf16
// tiles arrive by cp.async (issue_tile; cuda/async_copy.cuh), every copy of a thread in
// flight at once; the two state passes issue the next chunk's copies before the current
// chunk's products.

constexpr int kMmaThreads = 128;
constexpr int kMmaVt = 64;  // value columns per block of the state and output kernels

// The rows of a tile's source: row r at first + r * stride.
template <class E>
struct RowSource {
  const E* first;
  int64_t stride;
  __device__ const E* operator()(int r) const { return first + r * stride; }
};

template <class T>
constexpr bool kIsRowSource = false;
template <class E>
constexpr bool kIsRowSource<RowSource<E>> = true;

// Issues the copies of a tile (bf16 or f32): dst[r][c] (row stride ld) for r < rows,
// c < width from source(r)[c] for r < n, c < cols, zeros elsewhere (padding rows and
// columns). Whole 16-byte-aligned groups of columns go by cp.async, so a thread has all its
// copies in flight at once (the caller commits and waits; padding rows of the short path
// below land zeros with them); the rest (ragged or unaligned rows, padding) is stored
// directly. Group g of the tile is thread g % kThreads's, as in map_tile.
// A RowSource tile whose every row is whole and 16-byte aligned takes a short path: a
// thread's groups then share a column and its pointers move by fixed steps. (The general
// loop took about 60 instructions a group, half of all the state pass executed on the
// H200, in ncu's SASS counts.) kThreads is the block's size: with it and the tile's shape
// constants (the call sites' are) the short path is unrolled, a pass being one
// multiply-add for the source, the row test and the copy (of zeros past row n). (With
// blockDim.x it had divided by the block size and looped, and sm_90a SASS took about 86
// instructions for the one copy a thread makes of a 64 x 32 tile of the backward's keys
// kernel, which issues 5 such tiles a step around 24 tensor-core products a warp; now 46.
// A 64 x 128 tile at 128 threads, 8 copies a thread: about 182, now 118.)
template <int kThreads, class E, class Source>
__device__ __forceinline__ void issue_tile(E* dst, int ld, int rows, int width, int n, int cols,
                                           Source source) {
  static_assert(std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(source(0))>>, E>,
                "issue_tile copies rows of its own element type");
  constexpr int kGroup = 16 / int(sizeof(E));
  const int per_row = (width + kGroup - 1) / kGroup, groups = rows * per_row;
  if constexpr (kIsRowSource<Source>) {
    const int64_t row_bytes = source.stride * int64_t(sizeof(E));
    if (cols == width && width % kGroup == 0 && kThreads % per_row == 0 &&
        groups % kThreads == 0 && ld % kGroup == 0 && row_bytes % 16 == 0 &&
        row_bytes <= int64_t(UINT32_MAX) && aligned_16(source.first) &&
        aligned_16(dst)) {  // uniform over the block
      const int step = kThreads / per_row, passes = groups / kThreads;
      const int r0 = int(threadIdx.x) / per_row, c0 = int(threadIdx.x) % per_row * kGroup;
      // a pass's source is one 32 x 32 -> 64-bit multiply-add from the column's base
      const char* column = reinterpret_cast<const char*>(source.first + c0);
      E* to = dst + r0 * ld + c0;
#pragma unroll 4
      for (int pass = 0; pass < passes; ++pass) {
        const int r = r0 + pass * step;
        async_copy_16_or_zeros(to + pass * step * ld,
                               strided_address(column, uint32_t(r), uint32_t(row_bytes)), r < n);
      }
      return;
    }
  }
#pragma unroll 1
  for (int g = int(threadIdx.x); g < groups; g += kThreads) {
    const int r = g / per_row, c0 = (g % per_row) * kGroup;
    E* to = dst + r * ld + c0;
    const E* from = r < n ? source(r) + c0 : nullptr;
    if (from && c0 + kGroup <= cols && c0 + kGroup <= width && aligned_16(from) &&
        aligned_16(to)) {
      async_copy_16(to, from);
      continue;
    }
    for (int e = 0; e < kGroup && c0 + e < width; ++e) {
      to[e] = from && c0 + e < cols ? from[e] : store<E>(0.f);
    }
  }
}

// A thread's part of issue_tile's short path for a stream of kRows x kWidth tiles of E
// (bf16 or f32; row stride LD in shared memory) cut from sources laid out alike (the rows
// of [B, T, H, width] tensors of a chunk or document, or a chunk's states): tile row r,
// column c at element origin + r stride + c of a source, plus the tile's offset (the next
// value tile, key block or chunk). The thread's row, column group and first element are
// formed once, and a tile is then an add and, per pass, a copy (of zeros past row n);
// issue_tile formed them, and checked the shape and alignment, for every tile: about 40
// instructions a tile that a thread copies in one 16-byte copy, in the sm_90a SASS. The
// sources' base pointers come with each tile (kernel parameters: no registers held), so
// the tiles of one layout share one stream. usable() says whether a source suits the
// short path (uniform over the block); callers take issue_tile where it does not, or
// where a tile is not whole.
template <int kThreads, int kRows, int kWidth, int LD, class E = bf16>
struct TileStream {
  static constexpr int kGroup = 16 / int(sizeof(E));
  static constexpr int kPerRow = kWidth / kGroup, kStep = kThreads / kPerRow;
  static constexpr int kPasses = kRows * kPerRow / kThreads;
  static constexpr bool kShapeFits = kWidth % kGroup == 0 && kThreads % kPerRow == 0 &&
                                     kRows * kPerRow % kThreads == 0 && LD % kGroup == 0;

  int64_t first;        // the element of the thread's first group, at offset 0
  uint32_t pass_bytes;  // from one of the thread's rows to the next (kStep rows)
  int r0, to;           // the thread's first row; its first group's element in the tile

  __device__ TileStream(int64_t origin, int64_t stride)
      : first(origin + int(threadIdx.x) / kPerRow * stride + int(threadIdx.x) % kPerRow * kGroup),
        pass_bytes(uint32_t(stride * kStep * int64_t(sizeof(E)))),
        r0(int(threadIdx.x) / kPerRow), to(r0 * LD + int(threadIdx.x) % kPerRow * kGroup) {}

  // Whether the tiles of `base` at offsets that are multiples of kGroup suit the short path.
  __device__ static bool usable(const E* base, int64_t origin, int64_t stride) {
    const int64_t row_bytes = stride * int64_t(sizeof(E));
    return kShapeFits && row_bytes % 16 == 0 && row_bytes * kStep <= int64_t(UINT32_MAX) &&
           aligned_16(base + origin);
  }

  // dst[r][c] = base[origin + r stride + offset + c] for r < n, 0 for r >= n (r < kRows,
  // c < kWidth).
  __device__ __forceinline__ void issue(E* dst, const E* base, int64_t offset, int n) const {
    const char* at = reinterpret_cast<const char*>(base + (first + offset));
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      async_copy_16_or_zeros(dst + to + pass * kStep * LD,
                             pass == 0 ? at : strided_address(at, uint32_t(pass), pass_bytes),
                             r0 + pass * kStep < n);
    }
  }
};

// fn(g) for this thread's items g = threadIdx.x + kThreads p of [0, kCount) (kThreads the
// block's size): a loop of constant trip count, straight-line code once unrolled, where a
// loop to a bound of blockDim.x had to count and branch.
template <int kThreads, int kCount, class Fn>
__device__ __forceinline__ void for_each_item(Fn&& fn) {
#pragma unroll
  for (int pass = 0; pass < (kCount + kThreads - 1) / kThreads; ++pass) {
    const int g = int(threadIdx.x) + pass * kThreads;
    if (kCount % kThreads == 0 || g < kCount) fn(g);
  }
}

// Element x of row r of a bf16 tile becomes f(r)(x), rounded back (f(r) is called once a
// group: the row's factors come out of shared memory or expf once), on this thread's
// groups of 8 columns (group g is thread g % blockDim.x's, as in issue_tile, so it may run
// after the thread's own copies have landed and before the barrier that publishes them).
// A group moves as one 16-byte shared load and store where the row allows: element by
// element, the K scaling of the prepare kernel alone was a quarter of the instructions it
// executed on the H200 (ncu's SASS counts).
template <class F>
__device__ void map_tile(bf16* tile, int ld, int rows, int width, F f) {
  const int per_row = (width + 7) / 8, groups = rows * per_row;
  for (int g = int(threadIdx.x); g < groups; g += int(blockDim.x)) {
    const int r = g / per_row, c0 = (g % per_row) * 8;
    const auto row_map = f(r);
    bf16* at = tile + r * ld + c0;
    if (c0 + 8 <= width && aligned_16(at)) {
      // (a Pack of bf16, not a uint4 read through bf16 pointers, which the emulator's host
      // compiler may optimise by strict aliasing)
      Pack<bf16, 8> pack = *reinterpret_cast<const Pack<bf16, 8>*>(at);
#pragma unroll
      for (int e = 0; e < 8; ++e) pack.v[e] = store<bf16>(row_map(load(pack.v[e])));
      *reinterpret_cast<Pack<bf16, 8>*>(at) = pack;
    } else {
      for (int e = 0; e < 8 && c0 + e < width; ++e) at[e] = store<bf16>(row_map(load(at[e])));
    }
  }
}

// Row r of the bf16 tile times scale(r) (map_tile).
template <class Scale>
__device__ void scale_tile(bf16* tile, int ld, int rows, int width, Scale scale) {
  map_tile(tile, ld, rows, width, [&](int r) {
    const float factor = scale(r);
    return [factor](float x) { return x * factor; };
  });
}

// Row pointers into a [B, T, H, width] tensor for the tokens of the chunk starting at
// `begin`: rows_of(base, width, offset)(r) is token begin + r's row, `offset` columns in.
struct ChunkRows {
  int64_t seq_len, heads, b, h, begin;
  __device__ ChunkRows(const Problem<bf16>& pr, int64_t b_, int64_t h_, int64_t begin_)
      : seq_len(pr.seq_len), heads(pr.heads), b(b_), h(h_), begin(begin_) {}
  template <class E>
  __device__ RowSource<E> operator()(const E* base, int64_t width, int64_t offset) const {
    return {base + origin(width, offset), heads * width};
  }
  // The element of row 0 (token begin), `offset` columns in, and the step between rows.
  __device__ int64_t origin(int64_t width, int64_t offset) const {
    return ((b * seq_len + begin) * heads + h) * width + offset;
  }
  __device__ int64_t stride(int64_t width) const { return heads * width; }
};

// Thread i's gate g_i of the chunk [begin, begin + n) (0 past n and for threads >= 64),
// loaded early so that its latency overlaps the chunk's tile copies.
__device__ float chunk_gate(const Problem<bf16>& pr, int64_t b, int64_t h, int64_t begin, int n) {
  const int i = int(threadIdx.x);
  return i < kChunk && i < n ? float(gate_at(pr, pr.row(b, begin + i, h))) : 0.f;
}

// G of the chunk (n rows) into s_g (zeros past n) from each thread's chunk_gate, in order as
// the CPU sums it: thread 0 loads 16 gates at a time into registers, so only its adds are
// a chain (a loop through shared memory had waited on a load and a store per row; all 64
// at once spilled).
__device__ void chunk_gate_cumsum(float gate, int n, float* s_g) {
  constexpr int kGroup = 16;
  if (int(threadIdx.x) < kChunk) s_g[threadIdx.x] = gate;
  __syncthreads();
  if (threadIdx.x == 0) {
    float running = 0.f;
#pragma unroll
    for (int base = 0; base < kChunk; base += kGroup) {
      float g[kGroup];
#pragma unroll
      for (int i = 0; i < kGroup; ++i) g[i] = s_g[base + i];
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        running += g[i];  // past n: + 0, and s_g keeps its 0
        if (base + i < n) s_g[base + i] = running;
      }
    }
  }
  __syncthreads();
}

// G of the chunk [begin, begin + n) into s_g (zeros past n) from gcum, where the prepare
// kernel left it; the caller's barrier publishes it.
__device__ void load_gcum(const float* gcum, const Problem<bf16>& pr, int64_t b, int64_t h,
                          int64_t begin, int n, float* s_g) {
  if (int(threadIdx.x) < kChunk) {
    const int i = int(threadIdx.x);
    s_g[i] = i < n ? gcum[pr.row(b, begin + i, h)] : 0.f;
  }
}

// e^x for the decays within a chunk, e^{G_i - G_j}, by one ex2.approx.ftz (mma::exp2_ftz).
// expf's range reduction and denormal fix-ups cost about 8 instructions more, and the
// chunk kernels take a decay for each of a thread's 32 elements of a 64 x 64 mask. Where
// the mask drops an element its decay may be inf (j > i): it is selected away, never
// multiplied.
__device__ __forceinline__ float decay(float exponent) {
  return mma::exp2_ftz(exponent * mma::kLog2e);
}

// Coordinates of accumulator element e of block nb of this lane: row in the warp's 16
// rows' block, column in the 8 nb block.
__device__ __forceinline__ int acc_row(int e) { return mma::lane_id() / 4 + 8 * (e / 2); }
__device__ __forceinline__ int acc_col(int nb, int e) {
  return nb * 8 + 2 * (mma::lane_id() % 4) + e % 2;
}

// Columns c and c + 1 of a bf16 row (`second`: whether c + 1 is wanted) as one 4-byte store
// where the address allows, else one by one. A lane's accumulator elements e and e + 1
// are such a pair; stored 2 bytes at a time, each instruction left every 32-byte sector it
// touched half written.
__device__ __forceinline__ void store_bf16_pair(bf16* to, float x0, float x1, bool second) {
  if (second && (reinterpret_cast<uintptr_t>(to) & 3) == 0) {
    *reinterpret_cast<uint32_t*>(to) = mma::pack_bf16(x0, x1);
    return;
  }
  to[0] = store<bf16>(x0);
  if (second) to[1] = store<bf16>(x1);
}

// A warp's 16 x 8 NB accumulator tile in bf16: row r0 + r, column c to row_at(r0 + r) + c,
// for rows < n and columns < cols, a pair of columns per store. row_at is called once for
// each of the lane's two rows (a 64-bit row address per element pair was most of the
// stores' instructions).
template <int NB, class RowAt>
__device__ __forceinline__ void store_tile_bf16(const float (&acc)[NB][4], int r0, int n,
                                                int cols, RowAt row_at) {
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const int i = r0 + acc_row(e);
    if (i >= n) continue;
    bf16* row = row_at(i);
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const int c = acc_col(nb, e);
      if (c < cols) store_bf16_pair(row + c, acc[nb][e], acc[nb][e + 1], c + 1 < cols);
    }
  }
}

// store_tile_bf16 through shared memory: the warp's 16 rows of its 16 x 8 NB accumulator
// tile go to `staging` (its own 16 rows of kStagedLd<NB> elements, 16-byte aligned) as bf16
// pairs, then out to row_at(r0 + r) + c 16 bytes a lane, rows < n and columns < cols (a
// multiple of 8; each row_at(i) 16-byte aligned). Where store_tile_bf16's stores each fill
// 16 bytes of 8 rows (half of each 32-byte sector they touch: ncu counted 39-42% of the
// prepare and output kernels' global sectors as excess, H200, thirty-seventh session),
// eight lanes here write a row's 128 bytes. The padding of 8 elements keeps both the pair
// writes of 8 rows and a row's 16-byte reads off repeated banks. Warp-synchronous: no
// block barrier.
template <int NB>
constexpr int kStagedLd = NB * 8 + 8;
template <int NB, class RowAt>
__device__ __forceinline__ void store_tile_bf16_staged(const float (&acc)[NB][4], bf16* staging,
                                                       int r0, int n, int cols, RowAt row_at) {
  constexpr int LD = kStagedLd<NB>;
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      *reinterpret_cast<uint32_t*>(staging + acc_row(e) * LD + acc_col(nb, e)) =
          mma::pack_bf16(acc[nb][e], acc[nb][e + 1]);
    }
  }
  __syncwarp();
#pragma unroll
  for (int piece = mma::lane_id(); piece < 16 * NB; piece += 32) {
    const int r = piece / NB, c = piece % NB * 8;
    if (r0 + r < n && c < cols) {
      *reinterpret_cast<uint4*>(row_at(r0 + r) + c) =
          *reinterpret_cast<const uint4*>(staging + r * LD + c);
    }
  }
  __syncwarp();  // the rows are read before the warp stages its next tile
}

// The chunk's M = strict_tril(K K^T * Gamma) in f32 (Gamma only where j < i: no e^{-G}),
// from its key rows sK and G, into sM. Ends with a barrier.
// kWarps warps (4 or 8): warp w takes the 16 rows 16 (w % 4) and, with 8, half of the
// columns (w / 4).
template <int KD, int LDK, int LDF, int kWarps = 4>
__device__ void chunk_decayed_kk(const bf16* sK, const float* s_g, int n, float* sM) {
  constexpr int NB = kChunk / 8 / (kWarps / 4);
  const int warp = int(threadIdx.x / 32), row0 = warp % 4 * 16, col0 = warp / 4 * 8 * NB;
  float kk[NB][4];
  mma::zero(kk);
  mma::rows_times_rows<KD, LDK, LDK, NB>(sK + row0 * LDK, sK + col0 * LDK, kk);
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + acc_row(e), j = col0 + acc_col(nb, e);
      const float gamma = decay(s_g[i] - s_g[j]);
      sM[i * LDF + j] = j < i && i < n ? kk[nb][e] * gamma : 0.f;
    }
  }
  __syncthreads();
}

// acc[r][c] += sum_{m < kDepth} x[(r0 + r) ldf + m] y[m ldf + c0 + c] for this lane's 2 x 4
// elements (r0 = 2 (lane / 4), c0 = 4 (lane % 4)) of a 16 x 16 block of x y, with x
// [16][kDepth] and y [kDepth][16] blocks of f32 matrices in shared memory (row stride LDF),
// m in increasing order. A warp covers the block; a lane's 6 loads feed 8 products.
template <int kDepth, int LDF>
__device__ __forceinline__ void block_times_block(const float* x, const float* y,
                                                  float (&acc)[2][4]) {
  const int r0 = 2 * (mma::lane_id() / 4), c0 = 4 * (mma::lane_id() % 4);
#pragma unroll 8
  for (int m = 0; m < kDepth; ++m) {
    const float x0 = x[r0 * LDF + m], x1 = x[(r0 + 1) * LDF + m];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float ym = y[m * LDF + c0 + c];
      acc[0][c] += x0 * ym;
      acc[1][c] += x1 * ym;
    }
  }
}

// A = (I + L)^-1 with L = diag(beta) M (unit lower triangular; f32 in sAf, bf16 in sA),
// from M (chunk_decayed_kk) and beta, by 16 x 16 blocks (p, q < 4):
//   diagonal blocks, by forward substitution (column j by thread j, its 16 values in
//   registers):
//     A_ij = [i == j] - sum_{j <= m < i} beta_i M_im A_mj      (i, j, m in one block)
//   then the blocks below, in order of p - q = d (1, 2, 3), block (q + d, q) by warp q:
//     X_pq = sum_{q <= r < p} L_pr A_rq,   A_pq = -A_pp X_pq
//   with X_pq kept in the upper block (q, p) of sAf, which is zeroed at the end.
// Each sum runs over m in increasing order. (One 64-deep substitution per column left 64
// threads on a chain of up to 2016 dependent steps; the blocks below, an element a
// thread, waited on two shared loads per product.) Only the prepare kernel runs it; the
// backward kernels read the A it stored. Ends with a barrier.
template <int LDA, int LDF>
__device__ void chunk_inverse(const float* sM, const float* s_beta, float* sAf, bf16* sA) {
  constexpr int kB = 16, kBlocks = kChunk / kB;
  if (int(threadIdx.x) < kChunk) {
    const int j = int(threadIdx.x), first = j / kB * kB;  // column j of diagonal block j / 16
    float column[kB];  // A_{first + r, j}
#pragma unroll
    for (int r = 0; r < kB; ++r) {
      const int i = first + r;
      float x = i == j ? 1.f : 0.f;
#pragma unroll
      for (int rr = 0; rr < r; ++rr) {
        const int m = first + rr;
        if (m >= j) x -= s_beta[i] * sM[i * LDF + m] * column[rr];
      }
      column[r] = x;
    }
#pragma unroll
    for (int r = 0; r < kB; ++r) sAf[(first + r) * LDF + j] = column[r];
  }
  __syncthreads();
  const int warp = int(threadIdx.x / 32);
  const int r0 = 2 * (mma::lane_id() / 4), c0 = 4 * (mma::lane_id() % 4);
  auto level = [&]<int d>() {
    const int q = warp, p = q + d;
    const bool mine = q < kBlocks - d;  // the warp's block (p, q), or none
    if (mine) {  // X_pq into the upper block (q, p)
      float acc[2][4] = {};
      block_times_block<kB * d, LDF>(sM + p * kB * LDF + q * kB, sAf + q * kB * LDF + q * kB,
                                     acc);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float beta = s_beta[p * kB + r0 + r];
#pragma unroll
        for (int c = 0; c < 4; ++c) sAf[(q * kB + r0 + r) * LDF + p * kB + c0 + c] = beta * acc[r][c];
      }
    }
    __syncthreads();
    if (mine) {  // A_pq = -A_pp X_pq (A_pp's zeros above its diagonal add nothing)
      float acc[2][4] = {};
      block_times_block<kB, LDF>(sAf + p * kB * LDF + p * kB, sAf + q * kB * LDF + p * kB, acc);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int c = 0; c < 4; ++c) sAf[(p * kB + r0 + r) * LDF + q * kB + c0 + c] = -acc[r][c];
      }
    }
    __syncthreads();
  };
  static_assert(kMmaThreads / 32 >= kBlocks - 1, "a warp per block of the first level");
  level.template operator()<1>();
  level.template operator()<2>();
  level.template operator()<3>();
  for (int idx = int(threadIdx.x); idx < kChunk * kChunk; idx += int(blockDim.x)) {
    const int i = idx / kChunk, j = idx % kChunk;
    if (j / kB > i / kB) sAf[i * LDF + j] = 0.f;  // the X scratch
    sA[i * LDA + j] = store<bf16>(sAf[i * LDF + j]);
  }
  __syncthreads();
}

// Index of (b, h, chunk) in per-chunk scratch arrays ([B, H, max_chunks, ...]).
__device__ __forceinline__ int64_t chunk_slot(const Problem<bf16>& pr, int64_t b, int64_t h,
                                              int64_t chunk, int64_t max_chunks) {
  return (b * pr.heads + h) * max_chunks + chunk;
}

// A chunk's A in memory: [64][64] bf16, as gdr_prepare_mma stores it for the backward.
// Every reader takes A as bf16 tensor-core operands (sA), rounded from f32 once where the
// prepare kernel forms it, so that the bf16 copy gives the same products, bit for bit, in
// half the bytes of the f32 one (and so does dA, rounded once by the keys kernel).
// store_square_bf16: a 64 x 64 bf16 tile in shared memory (row stride LD, published) to
// memory; load_square_bf16: memory into such a tile, which the caller's barrier publishes.
// 16 bytes a move (LD * 2 a multiple of 16), all of a thread's loads in flight before it
// stores any.
constexpr int kSquarePieces = kChunk * kChunk / 8;  // 16-byte pieces of a 64 x 64 bf16 tile
template <int LD>
__device__ __forceinline__ int square_piece_at(int piece) {
  static_assert(LD * 2 % 16 == 0, "16-byte aligned rows");
  return piece / (kChunk / 8) * LD + piece % (kChunk / 8) * 8;
}
template <int LD, int kThreads = kMmaThreads>
__device__ void store_square_bf16(const bf16* tile, bf16* __restrict__ dst) {
  for (int piece = int(threadIdx.x); piece < kSquarePieces; piece += kThreads) {
    reinterpret_cast<uint4*>(dst)[piece] =
        *reinterpret_cast<const uint4*>(tile + square_piece_at<LD>(piece));
  }
}
template <int LD, int kThreads = kMmaThreads>
__device__ void load_square_bf16(const bf16* __restrict__ src, bf16* tile) {
  constexpr int kEach = kSquarePieces / kThreads;
  static_assert(kSquarePieces % kThreads == 0, "whole rounds of loads");
  uint4 x[kEach];
#pragma unroll
  for (int k = 0; k < kEach; ++k) {
    x[k] = reinterpret_cast<const uint4*>(src)[int(threadIdx.x) + k * kThreads];
  }
#pragma unroll
  for (int k = 0; k < kEach; ++k) {
    *reinterpret_cast<uint4*>(tile + square_piece_at<LD>(int(threadIdx.x) + k * kThreads)) = x[k];
  }
}

template <int KD>
struct MmaPrepareLayout {
  static constexpr int ldk = KD + 8, lda = kChunk + 8, ldv = kMmaVt + 8, ldf = kChunk + 1;
  static constexpr size_t k_bytes = size_t(kChunk) * ldk * 2, a_bytes = size_t(kChunk) * lda * 2,
                          v_bytes = size_t(kChunk) * ldv * 2, f_bytes = size_t(kChunk) * ldf * 4;
  static constexpr size_t bytes = k_bytes + a_bytes + v_bytes + 2 * f_bytes;
};

// a_in: each chunk's A as an earlier call stored it (a_out), read instead of formed (the
// backward's recompute where the forward kept it: GatedDeltaRuleKeep::Inverses); a_out is
// then null. The chunks [chunk_begin, chunk_end) of each row: all of them, or a window
// the forward's state pass then runs on (StateWindow).
// kWarps: 4 (the default), each owning 16 rows of every product, or 8
// (set_gated_delta_rule_prepare_warps), warps w and w + 4 then taking the same 16 rows and
// the left and the right half of each product's columns (of M, of W's 64 key columns, of
// U's 64-column value tile). Each element takes the same products in the same order either
// way: the same to the bit. Why 8: under ncu at the paper's K = 256 (thirty-seventh
// session) the kernel held 2 blocks of 4 warps an SM (shared memory bounds it), 6.7 cycles
// between a warp's issues, 28% of the SM's compute: latency, not throughput. Twice the
// warps in the same shared memory halve each warp's share of the products, copies and
// stores, and give each scheduler twice the warps to hide their waits; the inverse's
// chains (chunk_inverse: 2 warps, then 3) stay as long.
template <int KD, int kWarps = 4>
__global__ void __launch_bounds__(kWarps * 32)
    gdr_prepare_mma(Problem<bf16> pr, bf16* w_out, bf16* u_out, float* gcum_out, bf16* a_out,
                    const bf16* a_in, int64_t max_chunks, int chunk_begin, int chunk_end) {
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  static_assert(kWarps == 4 || kWarps == 8, "4 or 8 warps a block");
  constexpr int kThreads = kWarps * 32, kHalves = kWarps / 4;
  using L = MmaPrepareLayout<KD>;
  constexpr int LDK = L::ldk, LDA = L::lda, LDV = L::ldv, LDF = L::ldf;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);                    // k, then beta E k
  bf16* sA = reinterpret_cast<bf16*>(smem_raw + L::k_bytes);       // A (bf16)
  bf16* sV = reinterpret_cast<bf16*>(smem_raw + L::k_bytes + L::a_bytes);  // beta v tile
  float* sM = reinterpret_cast<float*>(smem_raw + L::k_bytes + L::a_bytes + L::v_bytes);  // M
  float* sAf = sM + kChunk * LDF;                                  // A (f32)
  bf16* sV2 = reinterpret_cast<bf16*>(sM);  // once A is formed: the odd V tiles
  static_assert(size_t(kChunk) * LDV * 2 <= L::f_bytes, "a V tile fits in M's space");
  // Once A is formed: each warp's staged rows of W and U (store_tile_bf16_staged), in the
  // f32 A's space, which the next chunk's inverse writes after the loop's first barrier.
  constexpr int KB = KD < 64 ? KD : 64;  // W's columns a product
  // A warp's share of a product's columns: of W's KB, of U's kMmaVt (NBW, NBU blocks of 8)
  constexpr int kWidthW = KB / kHalves, kWidthU = kMmaVt / kHalves;
  constexpr int NBW = kWidthW / 8, NBU = kWidthU / 8;
  constexpr int kStagedRows = 16 * kStagedLd<NBU>;
  static_assert(kWidthW % 8 == 0 && kWidthW <= kWidthU &&
                    size_t(kWarps) * kStagedRows * 2 <= L::f_bytes,
                "whole 8-column blocks a warp; the warps' staged rows fit the f32 A's space");
  bf16* staging = reinterpret_cast<bf16*>(sAf) + (threadIdx.x / 32) * kStagedRows;
  HAM_STATIC_SHARED(float, s_g, [kChunk]);     // G
  HAM_STATIC_SHARED(float, s_beta, [kChunk]);  // beta
  HAM_STATIC_SHARED(float, s_e, [kChunk]);     // e^G
  const int64_t b = blockIdx.z, h = blockIdx.y, V = pr.value_dim;
  // the warp's 16 rows of each product, and its half of the columns (0 with 4 warps)
  const int warp = int(threadIdx.x / 32);
  const int row0 = (kHalves == 1 ? warp : warp % 4) * 16, half = kHalves == 1 ? 0 : warp / 4;
  const RowChunks row_chunks(pr, b);
  const int count = min(row_chunks.count, chunk_end);  // the row's chunks in the window
  // U's rows go out 16 bytes at a time where each starts on a 16-byte boundary (W's always
  // do: KD is a multiple of 8, and both buffers are the backend's own).
  const bool u_rows_aligned = V % 8 == 0;
  stamped.loop_begins([&] { return strided_chunks(chunk_begin, count); });
  for (int chunk = chunk_begin + int(blockIdx.x); chunk < count; chunk += int(gridDim.x)) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    // V tile t's copies: even tiles into sV, odd ones into M's space (sV2, once A is formed).
    // (With whole value tiles, from a TileStream of the chunk's v rows.)
    using ValueTiles = TileStream<kThreads, kChunk, kMmaVt, LDV>;
    const ChunkRows rows_of(pr, b, h, begin);
    const int64_t v_origin = rows_of.origin(V, 0), v_stride = rows_of.stride(V);
    const bool streamed = V % kMmaVt == 0 && ValueTiles::usable(pr.v, v_origin, v_stride);
    const ValueTiles value_tiles(v_origin, v_stride);
    auto issue_value_tile = [&](int tile) {
      const int64_t v0 = int64_t(tile) * kMmaVt;
      if (streamed) {
        value_tiles.issue(tile % 2 ? sV2 : sV, pr.v, v0, n);
        return;
      }
      issue_tile<kThreads>(tile % 2 ? sV2 : sV, LDV, kChunk, kMmaVt, n,
                           int(min(int64_t(kMmaVt), V - v0)), rows_of(pr.v, V, v0));
    };
    __syncthreads();  // the previous chunk's tiles are no longer read
    issue_tile<kThreads>(sK, LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    issue_value_tile(0);
    async_copy_commit();
    if (a_in) {  // its loads in flight beside the copies
      const int64_t slot = chunk_slot(pr, b, h, chunk, max_chunks);
      load_square_bf16<LDA, kThreads>(a_in + slot * kChunk * kChunk, sA);
    }
    const float gate = chunk_gate(pr, b, h, begin, n);
    if (int(threadIdx.x) < kChunk) {
      const int i = int(threadIdx.x);
      s_beta[i] = i < n ? load(pr.beta[pr.row(b, begin + i, h)]) : 0.f;
    }
    async_copy_wait<0>();  // the barriers of the cumsum publish sK
    chunk_gate_cumsum(gate, n, s_g);
    if (int(threadIdx.x) < n) gcum_out[pr.row(b, begin + threadIdx.x, h)] = s_g[threadIdx.x];
    if (int(threadIdx.x) < kChunk) s_e[threadIdx.x] = expf(s_g[threadIdx.x]);  // published below

    if (a_in) {
      __syncthreads();  // publishes s_e (and sA), as chunk_decayed_kk's barriers do below
    } else {
      chunk_decayed_kk<KD, LDK, LDF, kWarps>(sK, s_g, n, sM);
      chunk_inverse<LDA, LDF>(sM, s_beta, sAf, sA);
    }
    // M is spent once A is formed (or never formed): its space takes the second V tile,
    // whose copies are then in flight during the A store, the K scaling and W's products.
    const int v_tiles = int((V + kMmaVt - 1) / kMmaVt);
    if (v_tiles > 1) {
      issue_value_tile(1);
      async_copy_commit();
    }
    if (a_out) {  // for the backward kernels, which would otherwise form it again
      const int64_t slot = chunk_slot(pr, b, h, chunk, max_chunks);
      store_square_bf16<LDA, kThreads>(sA, a_out + slot * kChunk * kChunk);
    }
    // beta_i e^{G_i} k_i (rows past n stay 0)
    map_tile(sK, LDK, kChunk, KD, [&](int i) {
      const float beta = s_beta[i], e = s_e[i];
      return [beta, e](float x) { return x * beta * e; };
    });
    __syncthreads();

    // W = A diag(beta E) K, 64 key columns (or all K) at a time, the warp's kWidthW of each.
    for (int c0 = half * kWidthW; c0 < KD; c0 += KB) {
      float acc[NBW][4];
      mma::zero(acc);
      mma::rows_times_matrix<kChunk, LDA, LDK, NBW>(sA + row0 * LDA, sK + c0, acc);
      store_tile_bf16_staged(acc, staging, row0, n, kWidthW,
                             [&](int i) { return w_out + pr.row(b, begin + i, h) * KD + c0; });
    }
    // U = A diag(beta) V, one 64-column V tile at a time: tile 0 came with K and tile 1
    // went to M's space; tile t + 2 takes tile t's buffer, its copies in flight during
    // tile t + 1's product.
    for (int tile = 0; tile < v_tiles; ++tile) {
      const int64_t v0 = int64_t(tile) * kMmaVt;
      const int cols = int(min(int64_t(kMmaVt), V - v0));
      bf16* tile_v = tile % 2 ? sV2 : sV;
      if (tile > 0) {  // tile 0 landed with K
        if (tile + 1 < v_tiles) async_copy_wait<1>();
        else async_copy_wait<0>();
      }
      scale_tile(tile_v, LDV, kChunk, kMmaVt, [&](int r) { return s_beta[r]; });  // diag(beta) V
      __syncthreads();
      const int col0 = half * kWidthU;  // the warp's columns of the tile, from col0
      if (kHalves == 1 || col0 < cols) {  // (a part tile's right half may have none)
        float acc[NBU][4];
        mma::zero(acc);
        mma::rows_times_matrix<kChunk, LDA, LDV, NBU>(sA + row0 * LDA, tile_v + col0, acc);
        auto u_row = [&](int i) { return u_out + pr.row(b, begin + i, h) * V + v0 + col0; };
        if (u_rows_aligned) {
          store_tile_bf16_staged(acc, staging, row0, n, cols - col0, u_row);
        } else {
          store_tile_bf16(acc, row0, n, cols - col0, u_row);
        }
      }
      if (tile + 2 < v_tiles) {
        __syncthreads();  // every warp is done with this buffer
        issue_value_tile(tile + 2);
        async_copy_commit();
      }
    }
  }
  stamped.loop_done();
}

// A state-pass block's place: batch row b (blockIdx.z), head h (blockIdx.y), and in
// blockIdx.x = document d * tiles + tile, the value columns [col0, col0 + cols) of its tile
// (`width` wide) and document d's chunks [first_chunk, end_chunk) of its row. Documents
// never share a state, so each gets its own blocks: a row of 20 documents runs 20 short
// sequences side by side, not one long one. Blocks past the row's documents have no
// chunks. The state passes' f32 running state (S forward, dS backward) is a [KD][VT] tile;
// the member functions move it to and from [K, V] states in memory.
struct StateTile {
  int64_t b, h, col0, state_base, value_dim;
  int cols, first_chunk, end_chunk;
  bool first_document, last_document;  // the row's document at t = 0, at t = T - 1
  RowChunks chunks;
  __device__ StateTile(const Problem<bf16>& pr, int width)
      : b(blockIdx.z), h(blockIdx.y),
        state_base((b * pr.heads + h) * pr.key_dim * pr.value_dim), value_dim(pr.value_dim),
        chunks(pr, b) {
    const int tiles = int((pr.value_dim + width - 1) / width);
    const int doc = int(blockIdx.x) / tiles, docs = chunks.documents();
    col0 = int64_t(int(blockIdx.x) % tiles) * width;
    cols = int(min(int64_t(width), pr.value_dim - col0));
    first_chunk = doc < docs ? chunks.document_begin(doc) : 0;
    end_chunk = doc < docs ? chunks.document_begin(doc + 1) : 0;
    first_document = doc == 0;
    last_document = doc == docs - 1;
  }

  // Element (a, c) of the tile within one [K, V] state.
  __device__ int64_t offset(int a, int c) const { return a * value_dim + col0 + c; }

  // tile <- (b, h)'s state in `from` ([B, H, K, V]); 0 where `from` is null or past V.
  template <int KD, int VT, int LDF>
  __device__ void read(float* tile, const bf16* from) const {
    for (int idx = int(threadIdx.x); idx < KD * VT; idx += int(blockDim.x)) {
      const int a = idx / VT, c = idx % VT;
      tile[a * LDF + c] = from && c < cols ? load(from[state_base + offset(a, c)]) : 0.f;
    }
  }

  // (b, h)'s state in `to` ([B, H, K, V]) <- the tile's valid columns, in bf16.
  template <int KD, int VT, int LDF>
  __device__ void write(const float* tile, bf16* to) const {
    for (int idx = int(threadIdx.x); idx < KD * VT; idx += int(blockDim.x)) {
      const int a = idx / VT, c = idx % VT;
      if (c < cols) to[state_base + offset(a, c)] = store<bf16>(tile[a * LDF + c]);
    }
  }

  // At a chunk edge: the tile is zeroed when `reset` (a document boundary), then rounded to
  // bf16 once, into `rounded` (the next mma's operand, row stride LDS) and into `saved`
  // (the chunk's [K, V] copy, which the next kernel reads).
  template <int KD, int VT, int LDF, int LDS>
  __device__ void round_and_save(float* tile, bool reset, bf16* rounded, bf16* saved) const {
    for (int idx = int(threadIdx.x); idx < KD * VT; idx += int(blockDim.x)) {
      const int a = idx / VT, c = idx % VT;
      if (reset) tile[a * LDF + c] = 0.f;
      const bf16 x = store<bf16>(tile[a * LDF + c]);
      rounded[a * LDS + c] = x;
      if (c < cols) saved[offset(a, c)] = x;
    }
  }
};

// The window of chunk indices [begin, end) of each row that one launch of a state pass
// covers (the whole row by default). In the forward's pass, a document that starts before
// `begin` takes its state there from carry_in, and one that goes on past `end` leaves its
// state there in carry_out, both f32 [B, H, K, V]; in the backward's reverse pass, dS comes
// from carry_in at `end` and goes to carry_out at `begin`. So consecutive windows give the
// one launch's results to the bit. Launched in windows, a pass lets the kernels that read
// its results per chunk run on the windows already done beside the pass over the next
// (set_gated_delta_rule_forward_windows, ..._backward_windows). carry_in and carry_out
// differ: a launch may read one document's carry and write another's, of the same row and
// head.
struct StateWindow {
  int begin = 0, end = INT_MAX;
  const float* carry_in = nullptr;
  float* carry_out = nullptr;
};

template <int KD, int VT, int kSlots = 2>
struct MmaStateLayout {
  static constexpr int ldk = KD + 8, lds = VT + 8;
  static constexpr size_t s_bytes = size_t(KD) * lds * 2,   // S0 in bf16
      k_bytes = size_t(kChunk) * ldk * 2,                    // one tile of W or K rows
      v_bytes = size_t(kChunk) * lds * 2;                    // one tile of U or v_new columns
  // S0, kSlots slots of (W, K, U), the decayed v_new
  static constexpr size_t bytes = s_bytes + kSlots * (2 * k_bytes + v_bytes) + v_bytes;
};

// The state passes and the output kernel at K = 256 in one slot of chunk tiles
// (set_gated_delta_rule_one_slot, and wherever two slots do not fit a block's shared memory:
// 171,008 bytes at 32 columns, above an A100's 163 KiB).
constexpr int kOneSlotKeyDim = 256;

// The chunk start state S0 of (b, h, chunk) in the scratch buffer [B, H, max_chunks, K, V].
__device__ __forceinline__ int64_t state_offset(const Problem<bf16>& pr, int64_t b, int64_t h,
                                                int64_t chunk, int64_t max_chunks) {
  return ((b * pr.heads + h) * max_chunks + chunk) * pr.key_dim * pr.value_dim;
}

// The f32 state tile S [K][VT] of a state-pass block (or dS in the backward's), in the
// accumulators of its kWarps warps: warp w holds key rows w 16 + 16 kWarps s
// (s < kSlices), each a 16 x VT mma accumulator, so the update S <- lambda S + K^T X is an
// mma into the registers that hold S.
template <int KD, int VT, int kWarps>
struct StateRegisters {
  static constexpr int kSlices = (KD + 16 * kWarps - 1) / (16 * kWarps), NB = VT / 8;
  float s[kSlices][NB][4];

  __device__ static int first_row(int slice) {
    return int(threadIdx.x / 32) * 16 + 16 * kWarps * slice;
  }
  __device__ static bool owned(int slice) { return first_row(slice) < KD; }

  // fn(element, key row, column) over this thread's elements.
  template <class Fn>
  __device__ void each(Fn&& fn) {
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl) {
      if (!owned(sl)) continue;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) fn(s[sl][nb][e], first_row(sl) + acc_row(e), acc_col(nb, e));
      }
    }
  }
  // Slice sl <- scale * slice + sum, and slice -= sum (sum: an mma accumulator of its shape).
  __device__ void scale_and_add(int sl, float scale, const float (&sum)[NB][4]) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[sl][nb][e] = scale * s[sl][nb][e] + sum[nb][e];
    }
  }
  __device__ void subtract(int sl, const float (&sum)[NB][4]) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[sl][nb][e] -= sum[nb][e];
    }
  }
};

// Copies a state tile in bf16 ([K][LDS] in shared memory, VT columns) to its [K, V] slot
// in `saved`: 16 bytes a thread where the tile's columns allow, else element by element.
// With `whole` (VT divides V, `saved` 16-byte aligned) each of the block's kThreads
// threads copies fixed groups without checks, so that a pass over the chunks keeps their
// places in a state out of its loop.
template <int KD, int VT, int LDS, int kThreads>
__device__ __forceinline__ void save_state(const StateTile& st, bool whole, const bf16* rounded,
                                           bf16* saved) {
  constexpr int kGroups = VT / 8;
  if (whole) {
    for_each_item<kThreads, KD * kGroups>([&](int g) {
      const int a = g / kGroups, c0 = g % kGroups * 8;
      *reinterpret_cast<uint4*>(saved + st.offset(a, c0)) =
          *reinterpret_cast<const uint4*>(rounded + a * LDS + c0);
    });
    return;
  }
  for (int g = int(threadIdx.x); g < KD * kGroups; g += kThreads) {
    const int a = g / kGroups, c0 = (g % kGroups) * 8;
    const bf16* from = rounded + a * LDS + c0;
    bf16* to = saved + st.offset(a, c0);
    if (c0 + 8 <= st.cols && aligned_16(to)) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {
      for (int e = 0; e < 8 && c0 + e < st.cols; ++e) to[e] = from[e];
    }
  }
}

// The lane's two rows i of a state pass's 16-row tile from row0 (acc_row 0 and 2), once
// per chunk step: tau_i = e^{G_last - G_i}, and the offset of (i, col0) in a [B, T, H, V]
// tensor.
struct LaneRows {
  float tau[2];
  int64_t at[2];
  __device__ LaneRows(const Problem<bf16>& pr, int64_t b, int64_t h, int64_t begin, int row0,
                      const float* g, float g_last, int64_t col0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = row0 + acc_row(2 * half);
      tau[half] = expf(g_last - g[i]);
      at[half] = pr.row(b, begin + i, h) * pr.value_dim + col0;
    }
  }
};

// Warps of a forward state-pass block: 8 from K = 128, else 4. The pass runs its chunks one
// after another, each step a few dependent products and barriers, so a step's time is
// latency more than issue (two blocks of 4 warps per SM measured about 2,200 instructions
// and 6 us a step at K = 128); 8 warps halve each warp's share of a step (its rows of S,
// its columns of v_new, its copies) and double the warps that hide each other's waits.
template <int KD>
constexpr int kStateWarps = KD >= 128 ? 8 : 4;

// The state passes whose first product (v_new = U - W S0 forward, du = dvl + diag(tau)
// K dS_end backward) may sum over K in two partial sums, as
// set_gated_delta_rule_state_partial_sums asks: 8 warps on 32 columns, where a warp holds
// two accumulator blocks, each a chain of K / 16 dependent mma (16 at K = 256; v_new had
// about a fifth of a forward step's stall samples under ncu).
template <int KD, int VT>
constexpr bool kStatePartialSums = KD >= 128 && VT == 32;

// The forward's sequential pass, one block per (VT-column V tile, document, h, b) over the
// document's chunks in order (StateTile), those in `window` (StateWindow). Per chunk,
// with S the state at its start (h0 or zero at the document's start):
//   S0 = bf16(S) -> states (the output kernel and the backward read it)
//   v_new = U - W S0 -> v_new;  sVn = e^{G_last - G} v_new
//   S <- e^{G_last} S + K^T sVn
// S stays in f32 registers (StateRegisters) for the whole sequence. The chunk's W, K and U
// rows arrive by cp.async into one of two slots, issued a chunk ahead; its G (from the
// prepare kernel's gcum) and the chunk table entries are read into registers a chunk or
// more ahead, so no step waits on global memory. kSums: v_new's sum over K in that many
// partial sums (kStatePartialSums).
// kSlots 1 (set_gated_delta_rule_one_slot): the chunk's K rows are copied during its v_new
// product and the next chunk's W and U during its state update, each into the one slot's
// part that the step no longer reads; the same products in the same order, so the same bits.
template <int KD, int VT, int kSums = 1, int kSlots = 2>
__global__ void __launch_bounds__(kStateWarps<KD> * 32)
    gdr_state_mma(Problem<bf16> pr, const bf16* __restrict__ w, const bf16* __restrict__ u,
                  const float* __restrict__ gcum, bf16* __restrict__ v_new,
                  bf16* __restrict__ states, int64_t max_chunks, bf16* __restrict__ h_final,
                  StateWindow window) {
  static_assert(kSlots == 1 || kSlots == 2, "one or two slots of chunk tiles");
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  using L = MmaStateLayout<KD, VT, kSlots>;
  constexpr int kWarps = kStateWarps<KD>;
  using Registers = StateRegisters<KD, VT, kWarps>;
  // v_new's product: warp w takes the 16 rows 16 (w % 4) and, with 8 warps, half of the
  // columns (w / 4), NBP blocks of 8
  constexpr int kColumnParts = kWarps / 4, NBP = VT / 8 / kColumnParts;
  static_assert(kWarps % 4 == 0 && NBP >= 1, "4 warps cover a chunk's 64 rows");
  constexpr int LDK = L::ldk, LDS = L::lds, NB = VT / 8;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sSb = reinterpret_cast<bf16*>(smem_raw);                  // S0 [K][vt], bf16
  bf16* slots = reinterpret_cast<bf16*>(smem_raw + L::s_bytes);   // kSlots x (W, K, U)
  bf16* sVn =
      reinterpret_cast<bf16*>(smem_raw + L::s_bytes + kSlots * (2 * L::k_bytes + L::v_bytes));
  constexpr int kSlotElements = 2 * kChunk * LDK + kChunk * LDS;
  auto slot_w = [&](int chunk) { return slots + (chunk % kSlots) * kSlotElements; };
  auto slot_k = [&](int chunk) { return slot_w(chunk) + kChunk * LDK; };
  auto slot_u = [&](int chunk) { return slot_w(chunk) + 2 * kChunk * LDK; };
  HAM_STATIC_SHARED(float, s_g, [2][kChunk]);
  const StateTile st(pr, VT);
  // The document's chunks in the window (none past the row's documents)
  const int first = max(st.first_chunk, window.begin), end_chunk = min(st.end_chunk, window.end);
  if (first >= end_chunk) return;
  const bool carried_in = st.first_chunk < window.begin, carried_on = st.end_chunk > window.end;
  const int64_t b = st.b, h = st.h, V = pr.value_dim, col0 = st.col0;
  const int cols = st.cols, count = st.chunks.count, warp = int(threadIdx.x / 32);
  const int i_row = int(threadIdx.x);  // the chunk row whose G this thread carries (< 64)
  const RowChunks& row_chunks = st.chunks;

  // Chunk c's copies into slot c % kSlots ([begin, end) its tokens). With whole value tiles
  // they come from TileStreams of the rows of W, K and U from the first chunk's tokens on,
  // offset by the chunk's first token.
  using KeyTiles = TileStream<kWarps * 32, kChunk, KD, LDK>;
  using ValueTiles = TileStream<kWarps * 32, kChunk, VT, LDS>;
  const int64_t stream_begin = row_chunks.begin(first);
  const ChunkRows stream_rows(pr, b, h, stream_begin);
  const int64_t key_origin = stream_rows.origin(KD, 0), key_stride = stream_rows.stride(KD);
  const int64_t u_origin = stream_rows.origin(V, col0), u_stride = stream_rows.stride(V);
  const bool streamed = V % VT == 0 && KeyTiles::usable(w, key_origin, key_stride) &&
                        KeyTiles::usable(pr.k, key_origin, key_stride) &&
                        ValueTiles::usable(u, u_origin, u_stride);
  const KeyTiles key_tiles(key_origin, key_stride);
  const ValueTiles u_tiles(u_origin, u_stride);
  const bool whole_tiles = V % VT == 0 && (reinterpret_cast<uintptr_t>(v_new) & 3) == 0;
  const bool whole_states = V % VT == 0 && aligned_16(states);
  auto issue_chunk = [&](int chunk, int64_t begin, int64_t end) {
    const int n = int(end - begin);
    if (streamed) {
      const int64_t rows_in = (begin - stream_begin) * pr.heads;  // rows of width 1
      key_tiles.issue(slot_w(chunk), w, rows_in * KD, n);
      key_tiles.issue(slot_k(chunk), pr.k, rows_in * KD, n);
      u_tiles.issue(slot_u(chunk), u, rows_in * V, n);
      return;
    }
    const ChunkRows rows_of(pr, b, h, begin);
    issue_tile<kWarps * 32>(slot_w(chunk), LDK, kChunk, KD, n, KD, rows_of(w, KD, 0));
    issue_tile<kWarps * 32>(slot_k(chunk), LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    issue_tile<kWarps * 32>(slot_u(chunk), LDS, kChunk, VT, n, cols, rows_of(u, V, col0));
  };
  // kSlots 1: the same copies in two parts, the K rows, then the W and U rows.
  auto issue_keys = [&](int chunk, int64_t begin, int64_t end) {
    const int n = int(end - begin);
    if (streamed) {
      key_tiles.issue(slot_k(chunk), pr.k, (begin - stream_begin) * pr.heads * KD, n);
      return;
    }
    const ChunkRows rows_of(pr, b, h, begin);
    issue_tile<kWarps * 32>(slot_k(chunk), LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
  };
  auto issue_w_and_u = [&](int chunk, int64_t begin, int64_t end) {
    const int n = int(end - begin);
    if (streamed) {
      const int64_t rows_in = (begin - stream_begin) * pr.heads;
      key_tiles.issue(slot_w(chunk), w, rows_in * KD, n);
      u_tiles.issue(slot_u(chunk), u, rows_in * V, n);
      return;
    }
    const ChunkRows rows_of(pr, b, h, begin);
    issue_tile<kWarps * 32>(slot_w(chunk), LDK, kChunk, KD, n, KD, rows_of(w, KD, 0));
    issue_tile<kWarps * 32>(slot_u(chunk), LDS, kChunk, VT, n, cols, rows_of(u, V, col0));
  };
  auto g_of = [&](int64_t begin, int64_t end) {  // G of row i_row of the chunk [begin, end)
    return i_row < kChunk && begin + i_row < end ? gcum[pr.row(b, begin + i_row, h)] : 0.f;
  };
  auto begin_of = [&](int chunk) {  // begin(count) = T
    return chunk <= count ? row_chunks.begin(chunk) : pr.seq_len;
  };

  Registers S;  // h0 seeds the document at t = 0; the others start from 0, or the carry
  S.each([&](float& x, int a, int c) {
    if (carried_in) {
      x = c < cols ? window.carry_in[st.state_base + st.offset(a, c)] : 0.f;
    } else {
      x = pr.h0 && st.first_document && c < cols ? load(pr.h0[st.state_base + st.offset(a, c)])
                                                 : 0.f;
    }
  });
  // Registers ahead of chunk c: its tokens [begin, end), the starts of chunks c + 2, c + 3,
  // c + 4 (end_next, end_after, end_later), chunk c + 1's G.
  int64_t begin = begin_of(first), end = begin_of(first + 1), end_next = begin_of(first + 2);
  int64_t end_after = begin_of(first + 3), end_later = begin_of(first + 4);
  float g_next = 0.f;
  if (i_row < kChunk) s_g[first % 2][i_row] = g_of(begin, end);
  // (G only of the window's chunks: the next window's may be forming beside this pass)
  g_next = first + 1 < end_chunk ? g_of(end, end_next) : 0.f;
  if constexpr (kSlots == 2) {
    issue_chunk(first, begin, end);
  } else {
    issue_w_and_u(first, begin, end);
  }
  async_copy_commit();
  S.each([&](float& x, int a, int c) { sSb[a * LDS + c] = store<bf16>(x); });

  // Two barriers a chunk: the one below publishes the chunk's tiles with S0 (written at the
  // end of the step before), and the one between the products publishes sVn.
  stamped.loop_begins([&] { return end_chunk - first; });
  for (int chunk = first; chunk < end_chunk; ++chunk) {
    const int n = int(end - begin);
    async_copy_wait<0>();  // this chunk's W, K, U (the only copies in flight); kSlots 1: W, U
    __syncthreads();  // also: the previous chunk's tiles, sVn and s_g slot are no longer read
    if (i_row < kChunk) {
      s_g[(chunk + 1) % 2][i_row] = g_next;
      g_next = chunk + 2 < end_chunk ? g_of(end_next, end_after) : 0.f;  // chunk + 2
    }
    if constexpr (kSlots == 2) {
      if (chunk + 1 < end_chunk) issue_chunk(chunk + 1, end, end_next);
    } else {
      issue_keys(chunk, begin, end);  // read only after the barrier between the products
    }
    async_copy_commit();
    const float* g = s_g[chunk % 2];
    const float g_last = n > 0 ? g[n - 1] : 0.f;

    // v_new = U - W S0 for the warp's 16 rows and columns; e^{G_last - G} v_new into sVn.
    {
      const bf16 *sW = slot_w(chunk), *sU = slot_u(chunk);
      const int row0 = warp % 4 * 16, col_part = warp / 4 * (VT / kColumnParts);
      const LaneRows lane_rows(pr, b, h, begin, row0, g, g_last, col0);
      const float* tau = lane_rows.tau;
      const int64_t* out_at = lane_rows.at;
      float acc[NBP][4];
      mma::zero(acc);
      mma::rows_times_matrix_in_sums<kSums, KD, LDK, LDS, NBP>(sW + row0 * LDK, sSb + col_part,
                                                              acc);
      // A chunk of 64 rows on a whole value tile (every chunk but a document's last, where
      // VT divides V): no row or column checks, and a pair of columns moves as 4 bytes.
      if (whole_tiles && n == kChunk) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // the lane's rows i and i + 8
          const int i = row0 + acc_row(2 * half), c = col_part + acc_col(0, 0);
          bf16* out = v_new + out_at[half] + c;
          const bf16* u_row = sU + i * LDS + c;
          bf16* scaled = sVn + i * LDS + c;
#pragma unroll
          for (int nb = 0; nb < NBP; ++nb) {  // columns c + 8 nb, c + 8 nb + 1
            const Pack<bf16, 2> u2 = *reinterpret_cast<const Pack<bf16, 2>*>(u_row + 8 * nb);
            Pack<bf16, 2> vn, x;
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              vn.v[k] = store<bf16>(load(u2.v[k]) - acc[nb][2 * half + k]);
              x.v[k] = store<bf16>(load(vn.v[k]) * tau[half]);
            }
            *reinterpret_cast<Pack<bf16, 2>*>(out + 8 * nb) = vn;
            *reinterpret_cast<Pack<bf16, 2>*>(scaled + 8 * nb) = x;
          }
        }
      } else {
#pragma unroll
        for (int nb = 0; nb < NBP; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; e += 2) {  // columns c, c + 1 of row i
            const int i = row0 + acc_row(e), c = col_part + acc_col(nb, e);
            float vn[2] = {0.f, 0.f}, x[2] = {0.f, 0.f};
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              if (i < n && c + k < cols) {
                vn[k] = load(store<bf16>(load(sU[i * LDS + c + k]) - acc[nb][e + k]));
                x[k] = vn[k] * tau[e / 2];
              }
            }
            if (i < n && c < cols) {
              store_bf16_pair(v_new + out_at[e / 2] + c, vn[0], vn[1], c + 1 < cols);
            }
            sVn[i * LDS + c] = store<bf16>(x[0]);
            sVn[i * LDS + c + 1] = store<bf16>(x[1]);
          }
        }
      }
    }
    // S0 to memory here, where a warp done with its rows would wait for the others
    save_state<KD, VT, LDS, kWarps * 32>(st, whole_states, sSb,
                                         states + state_offset(pr, b, h, chunk, max_chunks));
    if constexpr (kSlots == 1) async_copy_wait<0>();  // this chunk's K
    __syncthreads();  // sVn written; S0 and the chunk's W and U no longer read
    if constexpr (kSlots == 1) {  // the next chunk's W and U, beside this update
      if (chunk + 1 < end_chunk) issue_w_and_u(chunk + 1, end, end_next);
      async_copy_commit();
    }
    // S <- e^{G_last} S + K^T sVn, each warp on its own key rows.
    const float total = expf(g_last);
    const bf16* sK = slot_k(chunk);
#pragma unroll
    for (int sl = 0; sl < Registers::kSlices; ++sl) {
      if (!Registers::owned(sl)) continue;
      float acc[NB][4];
      mma::zero(acc);
      mma::columns_times_matrix<kChunk, LDK, LDS, NB>(sK, Registers::first_row(sl), sVn, acc);
      S.scale_and_add(sl, total, acc);
    }
    S.each([&](float& x, int a, int c) { sSb[a * LDS + c] = store<bf16>(x); });  // next S0
    // Move the registers on by a chunk (the loads are used a chunk or more later).
    begin = end;
    end = end_next;
    end_next = end_after;
    end_after = end_later;
    end_later = begin_of(min(chunk + 5, count));
  }
  stamped.loop_done();
  if (carried_on) {  // the state at the window's end, for the next window's launch
    S.each([&](float& x, int a, int c) {
      if (c < cols) window.carry_out[st.state_base + st.offset(a, c)] = x;
    });
    return;
  }
  if (!st.last_document) return;
  // The state after token T - 1.
  S.each([&](float& x, int a, int c) {
    if (c < cols) h_final[st.state_base + st.offset(a, c)] = store<bf16>(x);
  });
}

// The output kernel's blocks: 8 warps, 16 rows each. With the fit error, warps 0-3 on the
// output rows and 4-7 on the prediction rows of one chunk (two independent products of the
// same shape: twice the warps per SM of a block that ran both in turn); without it, warps
// 0-3 on the left and 4-7 on the right half of each value tile's output columns.
constexpr int kOutputThreads = 256;

// kFit: with the fit error, whose prediction rows also read v.
template <int KD, bool kFit>
struct MmaOutputLayout {
  static constexpr int ldk = KD + 8, lds = kMmaVt + 8;
  static constexpr size_t k_bytes = size_t(kChunk) * ldk * 2,  // the Q or K rows
      s_bytes = size_t(KD) * lds * 2,                           // one S0 column tile
      v_bytes = size_t(kChunk) * lds * 2;                       // one v_new or v column tile
  static constexpr int value_tiles = kFit ? 2 : 1;              // v_new (and v)
  static constexpr int slot_elements = KD * lds + value_tiles * kChunk * lds;
  // Q, K and `slots` slots of (S0, v_new and, with the fit error, v) value tiles: two
  // where V has more than one.
  static constexpr size_t bytes(int slots) {
    return 2 * k_bytes + size_t(slots) * (s_bytes + value_tiles * v_bytes);
  }
};

// Blocks of the output kernel an SM must hold: two up to K = 128 (106 KB of shared memory
// each at K = 128), where registers could otherwise allow fewer; one beyond.
template <int KD>
constexpr int kOutputMinBlocks = KD <= 128 ? 2 : 1;

// The output and the fit error's prediction of a chunk, one block per (chunk, b h) over
// every 64-column value tile. Per chunk, with E = e^G:
//   warps 0-3:  O    = diag(E) Q S0 + P v_new,     P = tril(Q K^T * Gamma)
//   warps 4-7:  pred = diag(E) K S0 + M v_new,     M = strict_tril(K K^T * Gamma)
// Q and K are staged once per chunk, and P and M are formed once and kept as bf16
// A-fragments for every tile. Each tile's S0, v_new and v columns arrive by cp.async in
// one of two slots, the next tile's copies in flight during this one's products (one block
// per tile had staged Q and K again for every tile, V / 64 times). The prediction warps
// add up (<pred, v>, <pred, pred>, <v, v>) of each row over the tiles and write its fit
// error 1 - <pred, v> / (||pred|| ||v|| + 1e-6) after the last (gated_delta_rule_fit.cuh's
// sums in its order; a separate kernel over per-tile sums took a launch and 6 us a call at
// B2 T16384 H16 on the H200, thirty-seventh session's profile).
// Without the fit error (kFit false) every warp forms O: warps w and w + 4 the same 16
// rows, each forming those rows of P itself (the same product, repeated so that neither
// waits for the other), and the left and the right 32 columns of each tile; v is not
// copied. Each element of O takes the same products in the same order either way: the
// same to the bit.
// The chunks [chunk_begin, chunk_end) of each row: all of them, or a window the state pass
// has finished (StateWindow).
// kPrefetch (set_gated_delta_rule_output_prefetch): the host launches about one wave of
// blocks, each taking every gridDim.x-th chunk of its row, and where V has two or more
// tiles a block copies its next chunk's first two value tiles into the slots as its last
// two tiles of this chunk free them, so that they land during this chunk's last products
// and its stores, not after the next chunk's start. Each element takes the same products
// in the same order either way: the same to the bit.
// kOneSlot (set_gated_delta_rule_one_slot; `slots` 1): each value tile is copied once every
// warp is done with the tile before, none in flight during a tile's products.
template <int KD, bool kFit, bool kPrefetch = false, bool kOneSlot = false>
__global__ void __launch_bounds__(kOutputThreads, kOutputMinBlocks<KD>)
    gdr_output_mma(Problem<bf16> pr, const bf16* v_new, const bf16* states, const float* gcum,
                   int64_t max_chunks, int slots, bf16* o, bf16* fit_error, int chunk_begin,
                   int chunk_end) {
  static_assert(!(kOneSlot && kPrefetch), "the prefetch copies into the second slot");
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  using L = MmaOutputLayout<KD, kFit>;
  // NB 8-column blocks of a warp's accumulator, from column col_part of each tile
  constexpr int LDK = L::ldk, LDS = L::lds, NB = kMmaVt / 8 / (kFit ? 1 : 2);
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kChunk * LDK;
  bf16* slot0 = sK + kChunk * LDK;
  // Value tiles take the slots in turn, `at` counted from this chunk's tile 0, whose slot is
  // first_slot (0 but with kPrefetch, where the turn runs on from chunk to chunk).
  int first_slot = 0;
  auto slot_s = [&](int at) {  // [K][vt]
    return slot0 + ((first_slot + at) % slots) * L::slot_elements;
  };
  auto slot_vn = [&](int at) { return slot_s(at) + KD * LDS; };  // v_new [64][vt]
  auto slot_v = [&](int at) { return slot_vn(at) + kChunk * LDS; };  // v [64][vt] (kFit)
  HAM_STATIC_SHARED(float, s_g, [kChunk]);
  // kFit: each row's fit sums (<pred, v>, <pred, pred>, <v, v>) over the value tiles so far,
  // kept by the one lane that forms them (in shared memory: the kFit instances at K <= 128
  // already take their 128 registers).
  HAM_STATIC_SHARED(float, s_fit, [kFit ? kChunk : 1][3]);
  const int64_t b = blockIdx.z / pr.heads, h = blockIdx.z % pr.heads, V = pr.value_dim;
  const int tiles = pr.tiles;
  const int warp = int(threadIdx.x / 32), t4 = mma::lane_id() % 4;
  const bool predicting = kFit && warp >= 4;  // else the output
  const int r0 = (warp % 4) * 16;             // the warp's first row of the chunk
  const int col_part = kFit ? 0 : warp / 4 * (kMmaVt / 2);
  const bf16* warp_rows = (predicting ? sK : sQ) + r0 * LDK;
  // Without the fit error no warp reads K past P = tril(Q K^T * Gamma), so from the first
  // tile's barrier on K's rows take each warp's staged rows of O (store_tile_bf16_staged),
  // where they fit (K >= 128) and O's rows start on 16-byte boundaries; the next chunk's K
  // is copied after the chunk loop's first barrier.
  constexpr bool kStageInK = !kFit && size_t(kOutputThreads / 32) * 16 * kStagedLd<NB> * 2 <=
                                          L::k_bytes;
  const bool staged = kStageInK && pr.value_dim % 8 == 0;
  bf16* staging = sK + (threadIdx.x / 32) * 16 * kStagedLd<NB>;
  const RowChunks row_chunks(pr, b);
  const int count = min(row_chunks.count, chunk_end);  // the row's chunks in the window
  auto tile_cols = [&](int tile) { return int(min(int64_t(kMmaVt), V - int64_t(tile) * kMmaVt)); };
  // (With whole value tiles, v_new and v from a TileStream of the chunk's rows.)
  constexpr int kThreads = kOutputThreads;
  using TokenTiles = TileStream<kThreads, kChunk, kMmaVt, LDS>;
  const int64_t v_stride = pr.heads * V;
  auto whole_tiles = [&](int64_t v_origin) {
    return V % kMmaVt == 0 && TokenTiles::usable(v_new, v_origin, v_stride) &&
           TokenTiles::usable(pr.v, v_origin, v_stride);
  };
  // One commit group: value tile `tile` (its S0, v_new and, with the fit error, v columns)
  // of the chunk of `rows` (n_rows tokens from its start state `start`) into the slot of `at`.
  auto issue_chunk_tile = [&](const ChunkRows& rows, const bf16* start, int n_rows, bool whole,
                              const TokenTiles& stream, int tile, int at) {
    const int64_t col0 = int64_t(tile) * kMmaVt;
    const int cols = tile_cols(tile);
    issue_tile<kThreads>(slot_s(at), LDS, KD, kMmaVt, KD, cols, RowSource<bf16>{start + col0, V});
    if (whole) {
      stream.issue(slot_vn(at), v_new, col0, n_rows);
      if (kFit) stream.issue(slot_v(at), pr.v, col0, n_rows);
    } else {
      issue_tile<kThreads>(slot_vn(at), LDS, kChunk, kMmaVt, n_rows, cols,
                           rows(v_new, V, col0));
      if (kFit) {
        issue_tile<kThreads>(slot_v(at), LDS, kChunk, kMmaVt, n_rows, cols,
                             rows(pr.v, V, col0));
      }
    }
    async_copy_commit();
  };
  int ahead = 0;  // kPrefetch: this chunk's first tiles, issued during the block's last chunk
  stamped.loop_begins([&] { return strided_chunks(chunk_begin, count); });
  for (int chunk = chunk_begin + int(blockIdx.x); chunk < count; chunk += int(gridDim.x)) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    const ChunkRows rows_of(pr, b, h, begin);
    const bf16* saved = states + state_offset(pr, b, h, chunk, max_chunks);
    const int64_t v_origin = rows_of.origin(V, 0);
    const bool streamed = whole_tiles(v_origin);
    const TokenTiles token_tiles(v_origin, v_stride);
    auto issue_value_tile = [&](int tile) {
      issue_chunk_tile(rows_of, saved, n, streamed, token_tiles, tile, tile);
    };
    // kPrefetch: the block's next chunk, whose tile `tile` goes into the slot of `tiles +
    // tile` (two on from this chunk's last two).
    const int next = chunk + int(gridDim.x);
    const bool has_next = kPrefetch && next < count;
    auto issue_next_tile = [&](int tile) {
      const int64_t next_begin = row_chunks.begin(next);
      const ChunkRows next_rows(pr, b, h, next_begin);
      const int64_t next_origin = next_rows.origin(V, 0);
      issue_chunk_tile(next_rows, states + state_offset(pr, b, h, next, max_chunks),
                       int(row_chunks.begin(next + 1) - next_begin), whole_tiles(next_origin),
                       TokenTiles(next_origin, v_stride), tile, tiles + tile);
    };
    __syncthreads();  // the previous chunk's tiles are no longer read
    issue_tile<kOutputThreads>(sQ, LDK, kChunk, KD, n, KD, rows_of(pr.q, KD, 0));
    issue_tile<kOutputThreads>(sK, LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    if (ahead == 0) issue_value_tile(0);  // with Q and K
    else async_copy_commit();             // Q and K alone: tiles 0 and 1 came ahead
    const bool tile_1_now = !kOneSlot && tiles > 1 && ahead < 2;
    if (tile_1_now) issue_value_tile(1);
    load_gcum(gcum, pr, b, h, begin, n, s_g);
    if (tile_1_now) async_copy_wait<1>();
    else async_copy_wait<0>();
    __syncthreads();  // Q, K, G and tile 0

    // The warp's 16 rows of P (or M) as A-fragments, and E of this lane's two rows.
    uint32_t x_frag[kChunk / 16][4];
    {
      float x[kChunk / 8][4];
      mma::zero(x);
      mma::rows_times_rows<KD, LDK, LDK, kChunk / 8>(warp_rows, sK, x);
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = r0 + acc_row(e), j = acc_col(nb, e);
          const bool kept = (predicting ? j < i : j <= i) && i < n;
          x[nb][e] = kept ? x[nb][e] * decay(s_g[i] - s_g[j]) : 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < kChunk / 16; ++j) mma::accumulator_as_a(x, j, x_frag[j]);
    }
    const float e_top = expf(s_g[r0 + acc_row(0)]), e_bottom = expf(s_g[r0 + acc_row(2)]);

    for (int tile = 0; tile < tiles; ++tile) {
      if (tile > 0) {
        // The group issued after this tile's (at the last tile's end) may stay in flight.
        if (!kOneSlot && (tile + 1 < tiles || has_next)) async_copy_wait<1>();
        else async_copy_wait<0>();
        __syncthreads();  // this tile's copies, from every thread
      } else if (staged) {
        __syncthreads();  // every warp's P is formed: K's rows are free for the staging
      }
      const int64_t col0 = int64_t(tile) * kMmaVt;
      const int cols = tile_cols(tile);
      const bf16 *sS = slot_s(tile), *sVn = slot_vn(tile);
      float acc[NB][4];
      mma::zero(acc);
      mma::rows_times_matrix<KD, LDK, LDS, NB>(warp_rows, sS + col_part, acc);
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nb][e] *= e < 2 ? e_top : e_bottom;
      }
#pragma unroll
      for (int j = 0; j < kChunk / 16; ++j) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          uint32_t bf[2];
          mma::load_b_kn<LDS>(bf, sVn, j * 16, col_part + nb * 8);
          mma::mma_bf16_16816(acc[nb], x_frag[j], bf);
        }
      }
      if (!predicting) {
        auto o_row = [&](int i) { return o + pr.row(b, begin + i, h) * V + col0 + col_part; };
        if (staged) {
          store_tile_bf16_staged(acc, staging, r0, n, cols - col_part, o_row);
        } else {
          store_tile_bf16(acc, r0, n, cols - col_part, o_row);
        }
      } else if constexpr (kFit) {
        // The fit partial sums of this tile's columns per row (a row's 4 lanes add up); v
        // is zero past the chunk's rows and the tile's columns.
        const bf16* sV = slot_v(tile);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = r0 + mma::lane_id() / 4 + 8 * half;
          float pv = 0.f, pp = 0.f, vv = 0.f;
#pragma unroll
          for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
            for (int e = 2 * half; e < 2 * half + 2; ++e) {
              const int c = acc_col(nb, e);
              if (c >= cols) continue;
              const float val = load(sV[i * LDS + c]);
              pv += acc[nb][e] * val;
              pp += acc[nb][e] * acc[nb][e];
              vv += val * val;
            }
          }
          pv = mma::quad_sum(pv);
          pp = mma::quad_sum(pp);
          vv = mma::quad_sum(vv);
          if (i < n && t4 == 0) {  // added in tile order from 0, as fit_error_kernel adds
            float* sums = s_fit[i];
            sums[0] = (tile == 0 ? 0.f : sums[0]) + pv;
            sums[1] = (tile == 0 ? 0.f : sums[1]) + pp;
            sums[2] = (tile == 0 ? 0.f : sums[2]) + vv;
          }
        }
      }
      if constexpr (kOneSlot) {
        if (tile + 1 < tiles) {
          __syncthreads();  // every warp is done with the slot
          issue_value_tile(tile + 1);
        }
      } else if (tile + 2 < tiles) {
        __syncthreads();  // every warp is done with this tile's slot
        issue_value_tile(tile + 2);
      } else if (has_next && tiles > 1) {  // two slots: the next chunk's tile 0, then 1
        __syncthreads();
        issue_next_tile(tile + 2 - tiles);
      }
    }
    if constexpr (kFit) {  // the chunk's fit errors, from this lane's own sums
      if (predicting && t4 == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = r0 + mma::lane_id() / 4 + 8 * half;
          if (i < n) {
            fit_error[pr.row(b, begin + i, h)] =
                store<bf16>(fit_error_of(s_fit[i][0], s_fit[i][1], s_fit[i][2]));
          }
        }
      }
    }
    if constexpr (kPrefetch) {
      ahead = has_next && tiles > 1 ? 2 : 0;
      first_slot = (first_slot + tiles) % slots;
    }
  }
  stamped.loop_done();
}

// ---- Tensor-core backward (bf16) -----------------------------------------------------
// The backward of the WY form, for the inputs the tensor-core forward takes. Per chunk,
// with u = v_new, tau_i = e^{G_last - G_i}, lambda = e^{G_last}, Kbg = diag(beta E) K and
// Vb = diag(beta) V (so W = A Kbg, U = A Vb, u = U - W S0):
//   du    = P^T dO + diag(tau) K dS_end           (dS_end: the gradient of the chunk's end state)
//   dS0   = lambda dS_end + Q^T diag(E) dO - W^T du          (the previous chunk's dS_end)
//   dP    = tril(dO u^T),   dq = diag(E) dO S0^T + (dP * Gamma) K
//   dW    = -du S0^T,   dKbg = A^T dW,   dVb = A^T du,   dA = du Vb^T + dW Kbg^T
//   dL    = -strict_tril(A^T dA A^T),   dM = diag(beta) dL           (L = diag(beta) M)
//   dk    = diag(tau) u dS_end^T + (dP * Gamma)^T Q + diag(beta E) dKbg
//           + (dM * Gamma) K + (dM * Gamma)^T K
//   dv    = diag(beta) dVb
//   dbeta = <dVb_i, V_i> + E_i <dKbg_i, K_i> + sum_j dL_ij M_ij
//   dG_i  = E_i (<dO_i, (Q S0)_i> + beta_i <dKbg_i, K_i>) - tau_i <(K dS_end)_i, u_i>
//           + rowsum(Z)_i - colsum(Z)_i,   Z = dP * P + dM * M
//   dG_last += lambda <S0, dS_end> + sum_i tau_i <(K dS_end)_i, u_i>;  dg = reverse cumsum
// (the CPU's backward, core/ops/gated_delta_rule.h, is the same gradient written with the
// forward substitution). After the forward's prepare and state kernels recompute W, U, S0
// and u (the prepare kernel storing each chunk's A in bf16, so that no backward kernel
// forms it again; or reading the A the forward kept, GatedDeltaRuleKeep::Inverses, as
// FLA's backward reads its forward's), five kernels, all but the second parallel over
// chunks:
//   1. gdr_bwd_local_mma   per chunk, over V tiles: dvl = P^T dO
//   2. gdr_bwd_state_mma   per (V tile, h, b), the chunks in reverse: dS_end -> scratch,
//                          du = dvl + diag(tau) K dS_end, dS0; the last dS0 is dh0
//   3. gdr_bwd_values_mma  per chunk, over double-buffered V tiles: dP, du Vb^T, dv and
//                          the row sums <dVb, V>
//   4. gdr_bwd_keys_mma    per chunk, over 64-wide key blocks and double-buffered
//                          32-column V tiles: dq, dW, dA + dW Kbg^T (stored in bf16), dk's
//                          first two terms, and the sums that need S0 or dS_end: <dO, Q S0> as
//                          <Q, dO S0^T>, <K dS_end, u> as <K, u dS_end^T> (both products
//                          are dq's and dk's own) and <S0, dS_end>
//   5. gdr_bwd_wy_mma      per chunk: dL (chunk_inverse_grad), dM, the rest of dk,
//                          dbeta, dg
// Per-chunk matrices and row sums pass between them in f32 scratch (dP * Gamma in bf16:
// its one reader, the keys kernel, takes it as tensor-core operands).

// Scratch and outputs of the tensor-core backward. Per-chunk arrays are indexed by
// chunk_slot; per-row arrays like [B, T, H] (times the width).
struct MmaBackward {
  const bf16 *grad_o, *grad_h_final;  // grad_h_final may be null
  const bf16 *w, *v_new, *states;     // from the forward's kernels
  const bf16* a_inv;                  // A per chunk, [slots, 64, 64], from gdr_prepare_mma
  bf16* dstates;                      // dS_end per chunk, [B, H, max_chunks, K, V]
  float* dvl;                         // [rows, V]
  bf16* du;                           // [rows, V], rounded once as the products take it
  bf16* dpg;                          // dP * Gamma per chunk, [slots, 64, 64], rounded once
                                      // as the keys kernel's products take it
  float* da;                          // dA per chunk, [slots, 64, 64]: du Vb^T diag(beta)
  bf16* da_rounded;                   // da + dW Kbg^T, rounded once as the wy products take it
  bf16* dw;                           // [rows, K], rounded once as the wy products take it
  float* dk_part;                     // [rows, K]
  float *row_dbeta, *row_deo, *row_dtau, *row_zp;  // [rows]
  float* chunk_dlambda;                            // [slots]
  const float* gcum;                               // G, [B, T, H]
  int64_t max_chunks;
  bf16 *dq, *dk, *dv, *dbeta, *dh0;  // outputs; null when not wanted
  void* dg;                          // f32 when the gates are f32, else bf16; may be null
  bool dg_f32;
  // The chunks of each row the reverse state pass and the values, keys and WY kernels
  // cover (all by default; set_gated_delta_rule_backward_windows), and the reverse pass's
  // carried dS: carry_in from the window after, carry_out to the window before.
  StateWindow window;
};

// A-fragment of the 16 x 16 block (rows m0.., columns k0..) of an f32 matrix in shared
// memory (row stride ld), or of its transpose, rounded to bf16.
template <bool kTranspose>
__device__ __forceinline__ void load_a_f32(uint32_t (&frag)[4], const float* x, int ld, int m0,
                                           int k0) {
  const int g = mma::lane_id() / 4, t = mma::lane_id() % 4;
  auto at = [&](int r, int c) {
    return kTranspose ? x[(k0 + c) * ld + m0 + r] : x[(m0 + r) * ld + k0 + c];
  };
  frag[0] = mma::pack_bf16(at(g, 2 * t), at(g, 2 * t + 1));
  frag[1] = mma::pack_bf16(at(g + 8, 2 * t), at(g + 8, 2 * t + 1));
  frag[2] = mma::pack_bf16(at(g, 2 * t + 8), at(g, 2 * t + 9));
  frag[3] = mma::pack_bf16(at(g + 8, 2 * t + 8), at(g + 8, 2 * t + 9));
}

// acc (16 x 8 NB) += X B with X the 16 rows m0.. of the 64 x 64 f32 matrix x (or of its
// transpose), B the rows [0, 64) of a bf16 tile [64][...] (columns n0 + 8 nb): the WY
// kernel's dM * Gamma, formed in f32 in place of dL.
template <bool kTranspose, int LDB, int NB>
__device__ __forceinline__ void square_times_matrix(const float* x, int ldx, int m0,
                                                    const bf16* b_tile, float (&acc)[NB][4]) {
#pragma unroll
  for (int kk = 0; kk < kChunk; kk += 16) {
    uint32_t af[4];
    load_a_f32<kTranspose>(af, x, ldx, m0, kk);
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      uint32_t bf[2];
      mma::load_b_kn<LDB>(bf, b_tile, kk, nb * 8);
      mma::mma_bf16_16816(acc[nb], af, bf);
    }
  }
}

// The value-tile width of the backward kernels: 64 columns, 32 for K = 256 (shared memory).
template <int KD>
constexpr int kBackwardVt = KD > 128 ? 32 : 64;

// Per-chunk quantities every backward kernel starts from: G (s_g), beta, E, tau.
struct ChunkScalars {
  float *g, *beta;
};

__device__ void load_beta(const Problem<bf16>& pr, int64_t b, int64_t h, int64_t begin, int n,
                          float* s_beta) {
  if (int(threadIdx.x) < kChunk) {
    const int i = int(threadIdx.x);
    s_beta[i] = i < n ? load(pr.beta[pr.row(b, begin + i, h)]) : 0.f;
  }
}

template <int KD>
struct BwdLocalLayout {
  static constexpr int ldk = KD + 8, ldv = kMmaVt + 8;
  // Q, K and `slots` dO tiles of 64 columns: two where V has more than one.
  static constexpr size_t bytes(int slots) {
    return size_t(2 * kChunk * ldk + slots * kChunk * ldv) * 2;
  }
};

// dvl = P^T dO, one block per (chunk, b h) over 64-column value tiles: Q and K are staged
// once and P^T formed once, kept as bf16 A-fragments for every tile; each dO tile arrives
// by cp.async in one of two slots, the next tile's copies in flight during this one's
// product. (One block per tile had staged Q and K again for every tile: 12 times per
// chunk at the paper's K = 256, V = 384.)
template <int KD>
__global__ void __launch_bounds__(kMmaThreads)
    gdr_bwd_local_mma(Problem<bf16> pr, MmaBackward bw, int slots) {
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  constexpr int LDK = BwdLocalLayout<KD>::ldk, LDV = BwdLocalLayout<KD>::ldv, NB = kMmaVt / 8;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kChunk * LDK;
  auto slot_do = [&](int tile) { return sK + kChunk * LDK + (tile % slots) * kChunk * LDV; };
  HAM_STATIC_SHARED(float, s_g, [kChunk]);
  const int64_t b = blockIdx.z / pr.heads, h = blockIdx.z % pr.heads, V = pr.value_dim;
  const int tiles = int((V + kMmaVt - 1) / kMmaVt);
  const int warp = int(threadIdx.x / 32);
  const RowChunks row_chunks(pr, b);
  const int count = row_chunks.count;
  stamped.loop_begins([&] { return strided_chunks(0, count); });
  for (int chunk = int(blockIdx.x); chunk < count; chunk += int(gridDim.x)) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    const ChunkRows rows_of{pr, b, h, begin};
    auto tile_cols = [&](int tile) { return int(min(int64_t(kMmaVt), V - int64_t(tile) * kMmaVt)); };
    // (With whole value tiles, from a TileStream of the chunk's dO rows.)
    using TokenTiles = TileStream<kMmaThreads, kChunk, kMmaVt, LDV>;
    const int64_t v_origin = rows_of.origin(V, 0), v_stride = rows_of.stride(V);
    const bool streamed =
        V % kMmaVt == 0 && TokenTiles::usable(bw.grad_o, v_origin, v_stride);
    const TokenTiles do_tiles(v_origin, v_stride);
    auto issue_do_tile = [&](int tile) {  // one commit group
      if (streamed) {
        do_tiles.issue(slot_do(tile), bw.grad_o, int64_t(tile) * kMmaVt, n);
      } else {
        issue_tile<kMmaThreads>(slot_do(tile), LDV, kChunk, kMmaVt, n, tile_cols(tile),
                                rows_of(bw.grad_o, V, int64_t(tile) * kMmaVt));
      }
      async_copy_commit();
    };
    __syncthreads();  // the previous chunk's tiles are no longer read
    issue_tile<kMmaThreads>(sQ, LDK, kChunk, KD, n, KD, rows_of(pr.q, KD, 0));
    issue_tile<kMmaThreads>(sK, LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    issue_do_tile(0);  // with Q and K
    if (tiles > 1) issue_do_tile(1);
    load_gcum(bw.gcum, pr, b, h, begin, n, s_g);
    if (tiles > 1) async_copy_wait<1>();
    else async_copy_wait<0>();
    __syncthreads();  // Q, K, G and the first dO tile
    // P^T for the warp's rows j: (K Q^T)_ji Gamma_ij where i >= j.
    uint32_t pt_frag[kChunk / 16][4];
    {
      float pt[kChunk / 8][4];
      mma::zero(pt);
      mma::rows_times_rows<KD, LDK, LDK, kChunk / 8>(sK + warp * 16 * LDK, sQ, pt);
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = warp * 16 + acc_row(e), i = acc_col(nb, e);
          const float gamma = decay(s_g[i] - s_g[j]);
          pt[nb][e] = i >= j && i < n ? pt[nb][e] * gamma : 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < kChunk / 16; ++j) mma::accumulator_as_a(pt, j, pt_frag[j]);
    }
    for (int tile = 0; tile < tiles; ++tile) {
      if (tile > 0) {
        if (tile + 1 < tiles) async_copy_wait<1>();
        else async_copy_wait<0>();
        __syncthreads();  // this tile's copies, from every thread
      }
      const bf16* sdO = slot_do(tile);
      const int64_t col0 = int64_t(tile) * kMmaVt;
      const int cols = tile_cols(tile);
      float out[NB][4];
      mma::zero(out);
#pragma unroll
      for (int j = 0; j < kChunk / 16; ++j) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          uint32_t bf[2];
          mma::load_b_kn<LDV>(bf, sdO, j * 16, nb * 8);
          mma::mma_bf16_16816(out[nb], pt_frag[j], bf);
        }
      }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = warp * 16 + acc_row(e), c = acc_col(nb, e);
          if (j < n && c < cols) bw.dvl[pr.row(b, begin + j, h) * V + col0 + c] = out[nb][e];
        }
      }
      if (tile + 2 < tiles) {
        __syncthreads();  // every warp is done with this tile's slot
        issue_do_tile(tile + 2);
      }
    }
  }
  stamped.loop_done();
}

// kSlots of gdr_bwd_state_mma beside 1 and 2: K and dvl, which a step's first product
// reads, in two slots and copied a chunk ahead; Q, W and dO, which its second reads, in
// one, copied at the step's start to land during the first product
// (set_gated_delta_rule_backward_keys_ahead). Where two whole slots do not fit (K = 256:
// 251 KB), this does (180 KB), where one slot waits for all five tiles every step.
constexpr int kKeysAheadSlots = 3;

template <int KD, int VT, int kSlots>
struct BwdStateLayout {
  static constexpr int ldk = KD + 8, lds = VT + 8, ldf = VT + 4;
  static constexpr size_t k_bytes = size_t(kChunk) * ldk * 2,  // Q, K or W rows
      v_bytes = size_t(kChunk) * lds * 2,                      // dO or du columns (bf16)
      f_bytes = size_t(kChunk) * ldf * 4,                      // dvl columns (f32)
      s_bytes = size_t(KD) * lds * 2;                          // dS_end in bf16
  static constexpr size_t slot_bytes = 3 * k_bytes + v_bytes + f_bytes;
  // kKeysAheadSlots: two of (K, dvl), then one of (Q, W, dO)
  static constexpr size_t keys_slot_bytes = k_bytes + f_bytes;
  static constexpr size_t bytes =
      s_bytes + v_bytes +
      (kSlots == kKeysAheadSlots ? 2 * keys_slot_bytes + 2 * k_bytes + v_bytes
                                 : kSlots * slot_bytes);
};

// The backward's sequential pass, one block per (V tile, document, h, b) over the
// document's chunks in reverse (StateTile). Per chunk, with dS the gradient of its end
// state (grad_h_final after the row's last chunk, zero after any other document's):
//   dS_end = bf16(dS) -> dstates;  du = dvl + diag(tau) K dS_end -> du
//   dS <- lambda dS + Q^T diag(E) dO - W^T du   (= dS0, the previous chunk's dS_end)
// dS stays in f32 registers; the chunk's Q, K, W, dO and dvl tiles arrive by cp.async, a
// chunk ahead with two slots (where they fit the device's shared memory: K <= 128 on an
// H100/H200), else at the chunk's start, all in flight at once; G (gcum) and the chunk
// table are read into registers ahead of use. kSlots: 1, 2 or kKeysAheadSlots. kSums:
// du's sum over K in that many partial sums (kStatePartialSums).
template <int KD, int VT, int kSlots, int kSums = 1>
__global__ void __launch_bounds__(kStateWarps<KD> * 32)
    gdr_bwd_state_mma(Problem<bf16> pr, MmaBackward bw) {
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  static_assert(kSlots == 1 || kSlots == 2 || kSlots == kKeysAheadSlots,
                "one or two slots of chunk tiles, or the keys ahead");
  constexpr bool kKeysAhead = kSlots == kKeysAheadSlots;
  using L = BwdStateLayout<KD, VT, kSlots>;
  constexpr int LDK = L::ldk, LDS = L::lds, LDF = L::ldf, NB = VT / 8;
  constexpr int kWarps = kStateWarps<KD>;
  using Registers = StateRegisters<KD, VT, kWarps>;
  // du's product: warp w takes the 16 rows 16 (w % 4) and, with 8 warps, half of the
  // columns (w / 4), NBP blocks of 8 (as the forward's v_new)
  constexpr int kColumnParts = kWarps / 4, NBP = VT / 8 / kColumnParts;
  static_assert(kWarps % 4 == 0 && NBP >= 1, "4 warps cover a chunk's 64 rows");
  // dS's update forms its two products one after the other in one accumulator, not side by
  // side in two, where the second's 32 registers made ptxas (sm_90a, nvcc 13) spill in the
  // step loop: 64 columns at K = 32 and 64 (at K = 128 one accumulator spilled and two did
  // not). The sums are the same to the bit.
  constexpr bool kOneProductAtATime = VT == 64 && KD >= 32 && KD <= 64;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* dSb = reinterpret_cast<bf16*>(smem_raw);  // dS_end [K][VT] in bf16
  unsigned char* slots = smem_raw + L::s_bytes;
  bf16* sDu = reinterpret_cast<bf16*>(smem_raw + L::bytes - L::v_bytes);
  auto slot = [&](int chunk) { return slots + (kSlots == 2 ? chunk % 2 : 0) * L::slot_bytes; };
  // With the keys ahead: (K, dvl) of chunk c in slot c % 2, then Q, W and dO's one slot.
  auto keys_slot = [&](int chunk) { return slots + chunk % 2 * L::keys_slot_bytes; };
  bf16* const rest_slot = reinterpret_cast<bf16*>(slots + 2 * L::keys_slot_bytes);
  auto slot_q = [&](int chunk) {
    return kKeysAhead ? rest_slot : reinterpret_cast<bf16*>(slot(chunk));
  };
  auto slot_k = [&](int chunk) {
    return kKeysAhead ? reinterpret_cast<bf16*>(keys_slot(chunk)) : slot_q(chunk) + kChunk * LDK;
  };
  auto slot_w = [&](int chunk) {
    return kKeysAhead ? rest_slot + kChunk * LDK : slot_q(chunk) + 2 * kChunk * LDK;
  };
  auto slot_do = [&](int chunk) {
    return kKeysAhead ? rest_slot + 2 * kChunk * LDK : slot_q(chunk) + 3 * kChunk * LDK;
  };
  auto slot_dvl = [&](int chunk) {
    return reinterpret_cast<float*>(kKeysAhead ? keys_slot(chunk) + L::k_bytes
                                               : slot(chunk) + 3 * L::k_bytes + L::v_bytes);
  };
  HAM_STATIC_SHARED(float, s_g, [2][kChunk]);
  const StateTile st(pr, VT);
  // The document's chunks in the window (none past the row's documents)
  const StateWindow& window = bw.window;
  const int first = max(st.first_chunk, window.begin), last = min(st.end_chunk, window.end) - 1;
  if (first > last) return;
  // dS from the window after (the document goes on past this one), to the window before
  const bool carried_in = st.end_chunk > window.end, carried_on = st.first_chunk < window.begin;
  const int64_t b = st.b, h = st.h, V = pr.value_dim, col0 = st.col0;
  const int cols = st.cols, warp = int(threadIdx.x / 32);
  const int i_row = int(threadIdx.x);  // the chunk row whose G this thread carries (< 64)
  const RowChunks& row_chunks = st.chunks;

  // Chunk c's copies into its slot ([begin, end) its tokens). With whole value tiles they
  // come from TileStreams of the document's rows of Q, K, W, dO and dv_local from its
  // first token on, offset by the chunk's first token.
  constexpr int kThreads = kWarps * 32;
  using KeyTiles = TileStream<kThreads, kChunk, KD, LDK>;
  using ValueTiles = TileStream<kThreads, kChunk, VT, LDS>;
  using LocalTiles = TileStream<kThreads, kChunk, VT, LDF, float>;
  const int64_t stream_begin = row_chunks.begin(first);
  const ChunkRows stream_rows(pr, b, h, stream_begin);
  const int64_t key_origin = stream_rows.origin(KD, 0), key_stride = stream_rows.stride(KD);
  const int64_t v_origin = stream_rows.origin(V, col0), v_stride = stream_rows.stride(V);
  const float* dvl = bw.dvl;
  const bool streamed = V % VT == 0 && KeyTiles::usable(pr.q, key_origin, key_stride) &&
                        KeyTiles::usable(pr.k, key_origin, key_stride) &&
                        KeyTiles::usable(bw.w, key_origin, key_stride) &&
                        ValueTiles::usable(bw.grad_o, v_origin, v_stride) &&
                        LocalTiles::usable(dvl, v_origin, v_stride);
  const KeyTiles key_tiles(key_origin, key_stride);
  const ValueTiles do_tiles(v_origin, v_stride);
  const LocalTiles dvl_tiles(v_origin, v_stride);
  const bool whole_tiles = V % VT == 0 && (reinterpret_cast<uintptr_t>(bw.du) & 3) == 0;
  const bool whole_states = V % VT == 0 && aligned_16(bw.dstates);
  // Which of a chunk's tiles to copy: Keys, K and dvl (the du product's); Rest, Q, W and dO
  // (the dS update's); All.
  enum class Tiles { All, Keys, Rest };
  auto issue_chunk = [&](int chunk, int64_t begin, int64_t end, Tiles tiles = Tiles::All) {
    const int n = int(end - begin);
    const bool keys = tiles != Tiles::Rest, rest = tiles != Tiles::Keys;
    if (streamed) {
      const int64_t rows_in = (begin - stream_begin) * pr.heads;  // rows of width 1
      if (rest) key_tiles.issue(slot_q(chunk), pr.q, rows_in * KD, n);
      if (keys) key_tiles.issue(slot_k(chunk), pr.k, rows_in * KD, n);
      if (rest) key_tiles.issue(slot_w(chunk), bw.w, rows_in * KD, n);
      if (rest) do_tiles.issue(slot_do(chunk), bw.grad_o, rows_in * V, n);
      if (keys) dvl_tiles.issue(slot_dvl(chunk), dvl, rows_in * V, n);
      return;
    }
    const ChunkRows rows_of(pr, b, h, begin);
    if (rest) {
      issue_tile<kWarps * 32>(slot_q(chunk), LDK, kChunk, KD, n, KD, rows_of(pr.q, KD, 0));
    }
    if (keys) {
      issue_tile<kWarps * 32>(slot_k(chunk), LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    }
    if (rest) {
      issue_tile<kWarps * 32>(slot_w(chunk), LDK, kChunk, KD, n, KD, rows_of(bw.w, KD, 0));
      issue_tile<kWarps * 32>(slot_do(chunk), LDS, kChunk, VT, n, cols,
                              rows_of(bw.grad_o, V, col0));
    }
    if (keys) {
      issue_tile<kWarps * 32>(slot_dvl(chunk), LDF, kChunk, VT, n, cols, rows_of(dvl, V, col0));
    }
  };
  auto g_of = [&](int64_t begin, int64_t end) {  // G of row i_row of the chunk [begin, end)
    return i_row < kChunk && begin + i_row < end ? bw.gcum[pr.row(b, begin + i_row, h)] : 0.f;
  };
  // Tokens before the document's first chunk are never read (begin_of clamps there).
  auto begin_of = [&](int chunk) { return row_chunks.begin(max(chunk, first)); };

  Registers dS;  // the gradient of the document's end state: grad_h_final after token T - 1
  dS.each([&](float& x, int a, int c) {
    if (carried_in) {
      x = c < cols ? window.carry_in[st.state_base + st.offset(a, c)] : 0.f;
    } else {
      x = bw.grad_h_final && st.last_document && c < cols
              ? load(bw.grad_h_final[st.state_base + st.offset(a, c)])
              : 0.f;
    }
  });
  // Registers ahead of chunk c = [begin, end): the starts of chunks c - 1, c - 2, c - 3 and
  // chunk c - 1's G.
  int64_t end = row_chunks.begin(last + 1), begin = begin_of(last), begin_p1 = begin_of(last - 1);
  int64_t begin_p2 = begin_of(last - 2), begin_p3 = begin_of(last - 3);
  float g_next = 0.f;
  if (i_row < kChunk) s_g[last % 2][i_row] = g_of(begin, end);
  g_next = g_of(begin_p1, begin);
  if (kSlots == 2 || kKeysAhead) {
    issue_chunk(last, begin, end, kKeysAhead ? Tiles::Keys : Tiles::All);
    async_copy_commit();
  }
  dS.each([&](float& x, int a, int c) { dSb[a * LDS + c] = store<bf16>(x); });
  __syncthreads();  // the last chunk's G, which the first step reads before its barrier

  // With two slots, two barriers a chunk: the one below publishes the chunk's tiles (their
  // copies issued a chunk ahead) with dS_end (written at the end of the step before), and
  // the one between the products publishes du. One slot takes a third, between the
  // chunk's copies and their use. With the keys ahead, two: the one below publishes K and
  // dvl (copied a chunk ahead), the second Q, W and dO (copied after the first) with du.
  stamped.loop_begins([&] { return last - first + 1; });
  for (int chunk = last; chunk >= first; --chunk) {
    const int n = int(end - begin);
    const float* g = s_g[chunk % 2];  // written before the last step's second barrier
    bf16* sdO = slot_do(chunk);
    // diag(E) dO, on this thread's own copies once they land (kPending: the copy groups
    // committed after dO's that may still be in flight)
    auto scale_do = [&]<int kPending = 0>() {
      async_copy_wait<kPending>();
      scale_tile(sdO, LDS, kChunk, VT, [&](int r) { return expf(g[r]); });
    };
    if (kSlots == 2) scale_do();  // this chunk's tiles (the only copies in flight)
    if (kKeysAhead) async_copy_wait<0>();  // this chunk's K and dvl (the only copies in flight)
    __syncthreads();  // also: the next chunk's tiles, du and s_g slot are no longer read
    if (i_row < kChunk) {
      s_g[(chunk + 1) % 2][i_row] = g_next;  // chunk - 1's G (slot (chunk - 1) % 2)
      g_next = g_of(begin_p2, begin_p1);     // chunk - 2
    }
    if (kSlots == 2) {
      if (chunk > first) issue_chunk(chunk - 1, begin_p1, begin);
      async_copy_commit();
    } else if (kKeysAhead) {
      issue_chunk(chunk, begin, end, Tiles::Rest);  // their slot's readers are done
      async_copy_commit();
      if (chunk > first) issue_chunk(chunk - 1, begin_p1, begin, Tiles::Keys);
      async_copy_commit();
    } else {
      issue_chunk(chunk, begin, end);
      async_copy_commit();
      scale_do();
      __syncthreads();
    }
    const float g_last = n > 0 ? g[n - 1] : 0.f;
    // du = dvl + diag(tau) K dS_end for the warp's 16 rows and columns.
    {
      const float* sDvl = slot_dvl(chunk);
      const int row0 = warp % 4 * 16, col_part = warp / 4 * (VT / kColumnParts);
      const LaneRows lane_rows(pr, b, h, begin, row0, g, g_last, col0);
      const float* tau = lane_rows.tau;
      const int64_t* out_at = lane_rows.at;
      float acc[NBP][4];
      mma::zero(acc);
      mma::rows_times_matrix_in_sums<kSums, KD, LDK, LDS, NBP>(slot_k(chunk) + row0 * LDK,
                                                              dSb + col_part, acc);
      if (whole_tiles && n == kChunk) {  // as the forward's v_new: no checks, pairs at once
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // the lane's rows i and i + 8
          const int i = row0 + acc_row(2 * half), c = col_part + acc_col(0, 0);
          bf16* out = bw.du + out_at[half] + c;
          const float* dvl_row = sDvl + i * LDF + c;
          bf16* du_row = sDu + i * LDS + c;
#pragma unroll
          for (int nb = 0; nb < NBP; ++nb) {  // columns c + 8 nb, c + 8 nb + 1
            const Pack<float, 2> local = *reinterpret_cast<const Pack<float, 2>*>(dvl_row + 8 * nb);
            Pack<bf16, 2> du;
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              du.v[k] = store<bf16>(local.v[k] + tau[half] * acc[nb][2 * half + k]);
            }
            *reinterpret_cast<Pack<bf16, 2>*>(out + 8 * nb) = du;
            *reinterpret_cast<Pack<bf16, 2>*>(du_row + 8 * nb) = du;
          }
        }
      } else {
#pragma unroll
        for (int nb = 0; nb < NBP; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; e += 2) {  // columns c, c + 1 of row i
            const int i = row0 + acc_row(e), c = col_part + acc_col(nb, e);
            float du[2] = {0.f, 0.f};
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              if (i < n && c + k < cols) {
                du[k] = sDvl[i * LDF + c + k] + tau[e / 2] * acc[nb][e + k];
              }
            }
            if (i < n && c < cols) {
              store_bf16_pair(bw.du + out_at[e / 2] + c, du[0], du[1], c + 1 < cols);
            }
            sDu[i * LDS + c] = store<bf16>(du[0]);
            sDu[i * LDS + c + 1] = store<bf16>(du[1]);
          }
        }
      }
    }
    // dS_end to memory here, where a warp done with its rows would wait for the others
    save_state<KD, VT, LDS, kThreads>(st, whole_states, dSb,
                                      bw.dstates + state_offset(pr, b, h, chunk, bw.max_chunks));
    // With the keys ahead: this chunk's Q, W and dO (the next chunk's K and dvl may fly on)
    if constexpr (kKeysAhead) scale_do.template operator()<1>();
    __syncthreads();  // du written; dS_end and the chunk's K and dvl no longer read
    // dS0 = lambda dS_end + Q^T (diag(E) dO) - W^T du, each warp on its own key rows.
    const float lambda = expf(g_last);
    const bf16 *sQ = slot_q(chunk), *sW = slot_w(chunk);
#pragma unroll
    for (int sl = 0; sl < Registers::kSlices; ++sl) {
      if (!Registers::owned(sl)) continue;
      const int a0 = Registers::first_row(sl);
      if constexpr (kOneProductAtATime) {
        float product[NB][4];
        mma::zero(product);
        mma::columns_times_matrix<kChunk, LDK, LDS, NB>(sQ, a0, sdO, product);
        dS.scale_and_add(sl, lambda, product);
        mma::zero(product);
        mma::columns_times_matrix<kChunk, LDK, LDS, NB>(sW, a0, sDu, product);
        dS.subtract(sl, product);
      } else {
        float plus[NB][4], minus[NB][4];
        mma::zero(plus);
        mma::zero(minus);
        mma::columns_times_matrix<kChunk, LDK, LDS, NB>(sQ, a0, sdO, plus);
        mma::columns_times_matrix<kChunk, LDK, LDS, NB>(sW, a0, sDu, minus);
        dS.scale_and_add(sl, lambda, plus);
        dS.subtract(sl, minus);
      }
    }
    dS.each([&](float& x, int a, int c) { dSb[a * LDS + c] = store<bf16>(x); });  // next dS_end
    // Move the registers back by a chunk (the loads are used a chunk or more later).
    end = begin;
    begin = begin_p1;
    begin_p1 = begin_p2;
    begin_p2 = begin_p3;
    begin_p3 = begin_of(chunk - 4);
  }
  stamped.loop_done();
  if (carried_on) {  // dS at the window's first chunk, for the window before
    dS.each([&](float& x, int a, int c) {
      if (c < cols) window.carry_out[st.state_base + st.offset(a, c)] = x;
    });
    return;
  }
  if (bw.dh0 && st.first_document) {  // dS0 of the document at t = 0
    dS.each([&](float& x, int a, int c) {
      if (c < cols) bw.dh0[st.state_base + st.offset(a, c)] = store<bf16>(x);
    });
  }
}

// bf16 sQ, sK [64][ldk] and sA [64][lda], then one region that holds in turn two slots of
// the value loop's tiles (sdO, sU, sDu, sVb [64][ldv]; sS0, sdS [KD][ldv]) and the f32
// Z = dP * P at the end. (With the kernel forming A itself and its f32 matrices apart,
// 168 KB at K = 128: one block per SM, 6% occupancy on the H200.)
template <int KD, int VT>
struct BwdValuesLayout {
  static constexpr int ldk = KD + 8, ldv = VT + 8, lda = kChunk + 8, ldf = kChunk + 1;
  static constexpr size_t fixed_bytes = size_t(2 * kChunk * ldk + kChunk * lda) * 2;
  static constexpr int slot_elements = 4 * kChunk * ldv;  // dO, u, du, V [64][VT]
  static constexpr size_t tile_bytes = size_t(2 * slot_elements) * 2;
  static constexpr size_t f32_bytes = size_t(kChunk * ldf) * 4;
  static constexpr size_t bytes = fixed_bytes + (tile_bytes > f32_bytes ? tile_bytes : f32_bytes);
  static_assert(fixed_bytes % 16 == 0, "the shared region must stay 16-byte aligned");
};

// The value tile of gdr_bwd_values_mma, sized so that its two slots leave three blocks per
// SM up to K = 128 (16 columns at K = 128: 67 KB; 32 below: 67 KB at K = 64) and two at
// K = 256 (16 columns: 99 KB). Its registers are bounded to match (kValuesMinBlocks).
template <int KD>
constexpr int kBackwardValuesVt = KD <= 64 ? 32 : 16;
template <int KD>
constexpr int kValuesMinBlocks = KD <= 128 ? 3 : 2;

template <int KD, int VT>
__global__ void __launch_bounds__(kMmaThreads, kValuesMinBlocks<KD>)
    gdr_bwd_values_mma(Problem<bf16> pr, MmaBackward bw) {
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  using L = BwdValuesLayout<KD, VT>;
  constexpr int LDK = L::ldk, LDV = L::ldv, LDA = L::lda, LDF = L::ldf;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kChunk * LDK;
  bf16* sA = sK + kChunk * LDK;
  unsigned char* region = smem_raw + L::fixed_bytes;  // see BwdValuesLayout
  float* sZ = reinterpret_cast<float*>(region);  // dP * P, after the value loop
  bf16* slots = reinterpret_cast<bf16*>(region);
  auto slot_do = [&](int tile) { return slots + (tile % 2) * L::slot_elements; };
  auto slot_u = [&](int tile) { return slot_do(tile) + kChunk * LDV; };  // u = v_new
  auto slot_du = [&](int tile) { return slot_u(tile) + kChunk * LDV; };
  auto slot_vb = [&](int tile) { return slot_du(tile) + kChunk * LDV; };
  HAM_STATIC_SHARED(float, s_g, [kChunk]);
  HAM_STATIC_SHARED(float, s_beta, [kChunk]);
  const int64_t b = blockIdx.z / pr.heads, h = blockIdx.z % pr.heads, V = pr.value_dim;
  const int warp = int(threadIdx.x / 32), t4 = mma::lane_id() % 4;
  const RowChunks row_chunks(pr, b);
  const int count = min(row_chunks.count, bw.window.end);  // the row's chunks in the window
  stamped.loop_begins([&] { return strided_chunks(bw.window.begin, count); });
  for (int chunk = bw.window.begin + int(blockIdx.x); chunk < count; chunk += int(gridDim.x)) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    const int64_t slot = chunk_slot(pr, b, h, chunk, bw.max_chunks);
    __syncthreads();
    const ChunkRows rows_of{pr, b, h, begin};
    // Value tile t's copies go to slot t % 2, tile t + 1's in flight during tile t's
    // products. (Issued and waited for at once, each tile's copies had left their whole
    // latency exposed.) With whole value tiles, each tile's copies come from a TileStream
    // (the chunk's dO, u, v and du rows, offset by the tile's first column).
    const int v_tiles = int((V + VT - 1) / VT);
    using TokenTiles = TileStream<kMmaThreads, kChunk, VT, LDV>;
    const int64_t v_origin = rows_of.origin(V, 0), v_stride = rows_of.stride(V);
    const bf16* du = bw.du;
    const bool streamed = V % VT == 0 && TokenTiles::usable(bw.grad_o, v_origin, v_stride) &&
                          TokenTiles::usable(bw.v_new, v_origin, v_stride) &&
                          TokenTiles::usable(pr.v, v_origin, v_stride) &&
                          TokenTiles::usable(du, v_origin, v_stride);
    const TokenTiles token_tiles(v_origin, v_stride);
    auto issue_value_tile = [&](int tile) {
      const int64_t v0 = int64_t(tile) * VT;
      if (streamed) {
        token_tiles.issue(slot_do(tile), bw.grad_o, v0, n);
        token_tiles.issue(slot_u(tile), bw.v_new, v0, n);
        token_tiles.issue(slot_vb(tile), pr.v, v0, n);
        token_tiles.issue(slot_du(tile), du, v0, n);
        return;
      }
      const int cols = int(min(int64_t(VT), V - v0));
      issue_tile<kMmaThreads>(slot_do(tile), LDV, kChunk, VT, n, cols, rows_of(bw.grad_o, V, v0));
      issue_tile<kMmaThreads>(slot_u(tile), LDV, kChunk, VT, n, cols, rows_of(bw.v_new, V, v0));
      issue_tile<kMmaThreads>(slot_vb(tile), LDV, kChunk, VT, n, cols, rows_of(pr.v, V, v0));
      issue_tile<kMmaThreads>(slot_du(tile), LDV, kChunk, VT, n, cols, rows_of(du, V, v0));
    };
    issue_tile<kMmaThreads>(sQ, LDK, kChunk, KD, n, KD, rows_of(pr.q, KD, 0));
    issue_tile<kMmaThreads>(sK, LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    if (v_tiles > 0) issue_value_tile(0);
    async_copy_commit();
    load_square_bf16<LDA>(bw.a_inv + slot * kChunk * kChunk, sA);
    load_beta(pr, b, h, begin, n, s_beta);
    load_gcum(bw.gcum, pr, b, h, begin, n, s_g);
    async_copy_wait<0>();
    __syncthreads();

    float dp[kChunk / 8][4], dav[kChunk / 8][4];
    mma::zero(dp);
    mma::zero(dav);
    float dbv[2] = {0.f, 0.f};
    for (int tile = 0; tile < v_tiles; ++tile) {
      const int64_t v0 = int64_t(tile) * VT;
      const int cols = int(min(int64_t(VT), V - v0));
      __syncthreads();  // the other slot (the previous tile) is no longer read
      if (tile + 1 < v_tiles) {
        issue_value_tile(tile + 1);
        async_copy_commit();
      }
      bf16 *sdO = slot_do(tile), *sU = slot_u(tile), *sDu = slot_du(tile), *sVb = slot_vb(tile);
      if (tile + 1 < v_tiles) async_copy_wait<1>();
      else async_copy_wait<0>();
      __syncthreads();
      mma::rows_times_rows<VT, LDV, LDV, kChunk / 8>(sdO + warp * 16 * LDV, sU, dp);
      // du V^T; the tile of V stays unscaled (dA = du Vb^T = (du V^T) diag(beta) takes
      // beta per column after the last tile), so <dVb_i, V_i> below reads V from it.
      mma::rows_times_rows<VT, LDV, LDV, kChunk / 8>(sDu + warp * 16 * LDV, sVb, dav);
      // dVb = A^T du -> dv = diag(beta) dVb and <dVb_i, V_i>.
      {
        float dvb[VT / 8][4];
        mma::zero(dvb);
        mma::columns_times_matrix<kChunk, LDA, LDV, VT / 8>(sA, warp * 16, sDu, dvb);
#pragma unroll
        for (int nb = 0; nb < VT / 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = warp * 16 + acc_row(e), c = acc_col(nb, e);
            if (i < n && c < cols) dbv[e / 2] += dvb[nb][e] * load(sVb[i * LDV + c]);
            dvb[nb][e] *= s_beta[i];
          }
        }
        // dv in column pairs from one row address per row (see store_tile_bf16)
        if (bw.dv) {
          store_tile_bf16(dvb, warp * 16, n, cols,
                          [&](int i) { return bw.dv + pr.row(b, begin + i, h) * V + v0; });
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = warp * 16 + mma::lane_id() / 4 + 8 * half;
      const float a = mma::quad_sum(dbv[half]);
      if (i < n && t4 == 0) bw.row_dbeta[pr.row(b, begin + i, h)] = a;
    }
    // dP * Gamma and dA = du Vb^T = (du V^T) diag(beta) to scratch; Z = dP * P for dG.
    float p[kChunk / 8][4];
    mma::zero(p);
    mma::rows_times_rows<KD, LDK, LDK, kChunk / 8>(sQ + warp * 16 * LDK, sK, p);
    bf16* dpg = bw.dpg + slot * kChunk * kChunk;
    float* da = bw.da + slot * kChunk * kChunk;
    __syncthreads();  // sZ overlays the slots, which the last tile's products read
#pragma unroll
    for (int nb = 0; nb < kChunk / 8; ++nb) {
      float dp_gamma[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = warp * 16 + acc_row(e), j = acc_col(nb, e);
        const float gamma = j <= i && i < n ? decay(s_g[i] - s_g[j]) : 0.f;
        dp_gamma[e] = dp[nb][e] * gamma;
        da[i * kChunk + j] = dav[nb][e] * s_beta[j];
        sZ[i * LDF + j] = dp[nb][e] * p[nb][e] * gamma;
      }
      // (elements e and e + 1 are adjacent columns: one 4-byte store a pair)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = warp * 16 + acc_row(e), j = acc_col(nb, e);
        *reinterpret_cast<uint32_t*>(dpg + i * kChunk + j) =
            mma::pack_bf16(dp_gamma[e], dp_gamma[e + 1]);
      }
    }
    __syncthreads();
    if (int(threadIdx.x) < n) {
      const int i = int(threadIdx.x);
      float z = 0.f;
      for (int j = 0; j < kChunk; ++j) z += sZ[i * LDF + j] - sZ[j * LDF + i];
      bw.row_zp[pr.row(b, begin + i, h)] = z;
    }
  }
  stamped.loop_done();
}

// The keys kernel's value tiles: 32 columns, so that two slots of them fit beside Q and K
// with two blocks per SM at K = 128 (102 KB).
constexpr int kKeysVt = 32;

template <int KD, int VT>
struct BwdKeysLayout {
  static constexpr int kb = KD < 64 ? KD : 64;  // key columns per block
  static constexpr int ldk = KD + 8, ldv = VT + 8, ldb = kb + 8, ldp = kChunk + 8;
  static constexpr int ldf = kChunk + 1;  // the f32 dA exchange between column parts
  // One step's tiles: dO, du, U [64][VT] and the key block's rows of S0, dS [KB][VT].
  static constexpr int slot_elements = 3 * kChunk * ldv + 2 * kb * ldv;
  static constexpr size_t bytes =
      size_t(kChunk * ldp + 2 * kChunk * ldk + 2 * slot_elements + kChunk * ldb) * 2;
  // (the exchange overlays the slots once the last step has read them)
  static_assert(size_t(kChunk * ldf) * 4 <= size_t(2 * slot_elements) * 2, "dA fits the slots");
};

// Warps of a keys block: 8 from K = 64, two to each 16 rows of the chunk, each with half of
// a key block's 64 columns (its products, and dq, dW, dk's terms there); else 4. With 4
// warps the three 16 x 64 accumulators of a step took 255 registers at K = 128: two
// blocks of 4 warps per SM.
template <int KD>
constexpr int kKeysWarps = KD >= 64 ? 8 : 4;

template <int KD, int VT>
__global__ void __launch_bounds__(kKeysWarps<KD> * 32, 2)
    gdr_bwd_keys_mma(Problem<bf16> pr, MmaBackward bw) {
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  using L = BwdKeysLayout<KD, VT>;
  constexpr int KB = L::kb, LDK = L::ldk, LDV = L::ldv, LDB = L::ldb, LDP = L::ldp;
  constexpr int LDF = L::ldf;
  constexpr int kWarps = kKeysWarps<KD>, kThreads = kWarps * 32, kParts = kWarps / 4;
  constexpr int KBP = KB / kParts;
  static_assert(kWarps % 4 == 0 && KBP % 16 == 0, "whole 16-column blocks per warp");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sDpg = reinterpret_cast<bf16*>(smem_raw);  // [64][LDP]: dP * Gamma
  bf16* sQ = sDpg + kChunk * LDP;
  bf16* sK = sQ + kChunk * LDK;
  bf16* slots = sK + kChunk * LDK;  // two slots of a step's tiles
  float* sExchange = reinterpret_cast<float*>(slots);  // [64][LDF], after the last step
  bf16* sKbg = slots + 2 * L::slot_elements;  // [64][KB]: beta E K, the key block's columns
  auto slot_do = [&](int step) { return slots + (step % 2) * L::slot_elements; };
  auto slot_du = [&](int step) { return slot_do(step) + kChunk * LDV; };
  auto slot_u = [&](int step) { return slot_du(step) + kChunk * LDV; };
  auto slot_s0 = [&](int step) { return slot_u(step) + kChunk * LDV; };  // [KB][VT]
  auto slot_ds = [&](int step) { return slot_s0(step) + KB * LDV; };     // [KB][VT]
  using Eight = Pack<bf16, 8>;
  HAM_STATIC_SHARED(float, s_g, [kChunk]);
  HAM_STATIC_SHARED(float, s_beta, [kChunk]);
  HAM_STATIC_SHARED(float, s_beta_e, [kChunk]);  // s_beta_e: beta E
  HAM_STATIC_SHARED(float, s_row_part, [2][kChunk]);  // the second column part's row sums
  const int64_t b = blockIdx.z / pr.heads, h = blockIdx.z % pr.heads, V = pr.value_dim;
  // The warp's rows [row0, row0 + 16) and key columns [part0, part0 + KBP) of a key block
  const int warp = int(threadIdx.x / 32), row0 = warp % 4 * 16, part = warp / 4;
  const int part0 = part * KBP;
  const RowChunks row_chunks(pr, b);
  const int count = min(row_chunks.count, bw.window.end);  // the row's chunks in the window
  stamped.loop_begins([&] { return strided_chunks(bw.window.begin, count); });
  for (int chunk = bw.window.begin + int(blockIdx.x); chunk < count; chunk += int(gridDim.x)) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    const int64_t slot = chunk_slot(pr, b, h, chunk, bw.max_chunks);
    __syncthreads();
    const ChunkRows rows_of{pr, b, h, begin};
    const int64_t s_origin = state_offset(pr, b, h, chunk, bw.max_chunks);
    const bf16 *saved = bw.states + s_origin, *dsaved = bw.dstates + s_origin;
    // Step s takes key block s / v_tiles and value tile s % v_tiles; its tiles go to slot
    // s % 2, step s + 1's copies in flight during step s's products. (Issued and waited
    // for at once, each step's copies had left their whole latency exposed.)
    // With whole value tiles, each tile's copies come from a TileStream: the dO, u and du
    // rows of the chunk's tokens and the S0, dS rows of its states, offset by the step's key
    // block and value tile.
    const int v_tiles = int((V + VT - 1) / VT);
    using TokenTiles = TileStream<kThreads, kChunk, VT, LDV>;
    using StateTiles = TileStream<kThreads, KB, VT, LDV>;
    const int64_t v_origin = rows_of.origin(V, 0), v_stride = rows_of.stride(V);
    const bf16* du = bw.du;
    const bool streamed = V % VT == 0 && TokenTiles::usable(bw.grad_o, v_origin, v_stride) &&
                          TokenTiles::usable(bw.v_new, v_origin, v_stride) &&
                          TokenTiles::usable(du, v_origin, v_stride) &&
                          StateTiles::usable(bw.states, s_origin, V) &&
                          StateTiles::usable(bw.dstates, s_origin, V);
    const TokenTiles token_tiles(v_origin, v_stride);
    const StateTiles state_tiles(s_origin, V);
    auto issue_step = [&](int step, int64_t k0, int v_tile) {
      const int64_t v0 = int64_t(v_tile) * VT;
      if (streamed) {
        token_tiles.issue(slot_do(step), bw.grad_o, v0, n);
        token_tiles.issue(slot_u(step), bw.v_new, v0, n);
        state_tiles.issue(slot_s0(step), bw.states, k0 * V + v0, KB);
        state_tiles.issue(slot_ds(step), bw.dstates, k0 * V + v0, KB);
        token_tiles.issue(slot_du(step), du, v0, n);
        return;
      }
      const int cols = int(min(int64_t(VT), V - v0));
      issue_tile<kThreads>(slot_do(step), LDV, kChunk, VT, n, cols, rows_of(bw.grad_o, V, v0));
      issue_tile<kThreads>(slot_u(step), LDV, kChunk, VT, n, cols, rows_of(bw.v_new, V, v0));
      issue_tile<kThreads>(slot_s0(step), LDV, KB, VT, KB, cols,
                           RowSource<bf16>{saved + k0 * V + v0, V});
      issue_tile<kThreads>(slot_ds(step), LDV, KB, VT, KB, cols,
                           RowSource<bf16>{dsaved + k0 * V + v0, V});
      issue_tile<kThreads>(slot_du(step), LDV, kChunk, VT, n, cols, rows_of(du, V, v0));
    };
    issue_tile<kThreads>(sQ, LDK, kChunk, KD, n, KD, rows_of(pr.q, KD, 0));
    issue_tile<kThreads>(sK, LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    issue_tile<kThreads>(sDpg, LDP, kChunk, kChunk, kChunk, kChunk,
                         RowSource<bf16>{bw.dpg + slot * kChunk * kChunk, kChunk});
    issue_step(0, 0, 0);
    async_copy_commit();
    load_beta(pr, b, h, begin, n, s_beta);
    load_gcum(bw.gcum, pr, b, h, begin, n, s_g);
    async_copy_wait<0>();
    __syncthreads();
    if (int(threadIdx.x) < kChunk) {  // published by the first step's barriers
      s_beta_e[threadIdx.x] = s_beta[threadIdx.x] * expf(s_g[threadIdx.x]);
    }

    float dA2[kChunk / 8][4];  // dW Kbg^T
    mma::zero(dA2);
    // This lane's parts of <Q_i, (dO S0^T)_i> = <dO_i, (Q S0)_i> and of
    // <K_i, (u dS_end^T)_i> = <(K dS_end)_i, u_i> for its rows i (halves), and of
    // <S0, dS_end>.
    float deo[2] = {0.f, 0.f}, dtau[2] = {0.f, 0.f}, dlambda = 0.f;
    int step = 0;
    for (int k0 = 0; k0 < KD; k0 += KB) {
      float x1[KBP / 8][4], x2[KBP / 8][4], x3[KBP / 8][4];
      mma::zero(x1);
      mma::zero(x2);
      mma::zero(x3);
      for (int v_tile = 0; v_tile < v_tiles; ++v_tile, ++step) {
        __syncthreads();  // the other slot (step - 1's tiles) is no longer read
        const bool last_tile = v_tile + 1 == v_tiles;
        if (!last_tile || k0 + KB < KD) {
          issue_step(step + 1, last_tile ? k0 + KB : k0, last_tile ? 0 : v_tile + 1);
          async_copy_commit();
          async_copy_wait<1>();
        } else {
          async_copy_wait<0>();
        }
        __syncthreads();  // this step's tiles, from every thread
        const bf16 *sdO = slot_do(step), *sDu = slot_du(step), *sU = slot_u(step);
        const bf16 *sS0 = slot_s0(step), *sdS = slot_ds(step);
        const bf16 *s0_part = sS0 + part0 * LDV, *ds_part = sdS + part0 * LDV;
        mma::rows_times_rows<VT, LDV, LDV, KBP / 8>(sdO + row0 * LDV, s0_part, x1);  // dO S0^T
        mma::rows_times_rows<VT, LDV, LDV, KBP / 8>(sDu + row0 * LDV, s0_part, x2);  // du S0^T
        mma::rows_times_rows<VT, LDV, LDV, KBP / 8>(sU + row0 * LDV, ds_part, x3);   // u dS^T
        // <S0, dS_end> over this step's block, 8 columns a 16-byte shared load of each (the
        // padding columns are zero)
        constexpr int kGroups = VT / 8;
        for_each_item<kThreads, KB * kGroups>([&](int g) {
          const int r = g / kGroups, c0 = g % kGroups * 8;
          const Eight s0 = *reinterpret_cast<const Eight*>(sS0 + r * LDV + c0);
          const Eight ds = *reinterpret_cast<const Eight*>(sdS + r * LDV + c0);
#pragma unroll
          for (int e = 0; e < 8; ++e) dlambda += load(s0.v[e]) * load(ds.v[e]);
        });
      }
#pragma unroll
      for (int nb = 0; nb < KBP / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row0 + acc_row(e), c = k0 + part0 + acc_col(nb, e);
          deo[e / 2] += x1[nb][e] * load(sQ[i * LDK + c]);
          dtau[e / 2] += x3[nb][e] * load(sK[i * LDK + c]);
        }
      }
      // dq = diag(E) dO S0^T + (dP * Gamma) K
#pragma unroll
      for (int nb = 0; nb < KBP / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) x1[nb][e] *= expf(s_g[row0 + acc_row(e)]);
      }
      mma::rows_times_matrix<kChunk, LDP, LDK, KBP / 8>(sDpg + row0 * LDP, sK + k0 + part0, x1);
      // dk's terms diag(tau) u dS_end^T + (dP * Gamma)^T Q
      const float g_last = n > 0 ? s_g[n - 1] : 0.f;
#pragma unroll
      for (int nb = 0; nb < KBP / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) x3[nb][e] *= expf(g_last - s_g[row0 + acc_row(e)]);
      }
      mma::columns_times_matrix<kChunk, LDP, LDK, KBP / 8>(sDpg, row0, sQ + k0 + part0, x3);
      // dW = -du S0^T
#pragma unroll
      for (int nb = 0; nb < KBP / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) x2[nb][e] = -x2[nb][e];
      }
      // A lane's elements e and e + 1 are adjacent columns: stored in pairs (4 bytes of
      // bf16, 8 of f32) from one row offset per row, 24 stores a key block where one per
      // element, each with its own 64-bit address, took 48. dw and dk_part are this op's
      // scratch, so their pairs are aligned (K is even); dq is the caller's.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = row0 + acc_row(2 * half), e = 2 * half;
        if (i >= n) continue;
        const int64_t row = pr.row(b, begin + i, h) * KD + k0 + part0;
#pragma unroll
        for (int nb = 0; nb < KBP / 8; ++nb) {
          const int64_t at = row + acc_col(nb, 0);
          if (bw.dq) store_bf16_pair(bw.dq + at, x1[nb][e], x1[nb][e + 1], true);
          *reinterpret_cast<uint32_t*>(bw.dw + at) = mma::pack_bf16(x2[nb][e], x2[nb][e + 1]);
          mma::store_f32x2(bw.dk_part + at, x3[nb][e], x3[nb][e + 1]);
        }
      }
      // dA += dW Kbg^T over this key block (the warp's part of its columns)
      __syncthreads();  // sKbg of the previous block is no longer read
      // Kbg = diag(beta E) K, 8 columns a 16-byte shared load and store
      for_each_item<kThreads, kChunk * (KB / 8)>([&](int g) {
        const int j = g / (KB / 8), c0 = g % (KB / 8) * 8;
        Eight x = *reinterpret_cast<const Eight*>(sK + j * LDK + k0 + c0);
        const float factor = s_beta_e[j];
#pragma unroll
        for (int e = 0; e < 8; ++e) x.v[e] = store<bf16>(load(x.v[e]) * factor);
        *reinterpret_cast<Eight*>(sKbg + j * LDB + c0) = x;
      });
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < KBP / 16; ++kk) {
        uint32_t af[4];
        mma::accumulator_as_a(x2, kk, af);
#pragma unroll
        for (int nb = 0; nb < kChunk / 8; ++nb) {
          uint32_t bf[2];
          mma::load_b_nk<LDB>(bf, sKbg, nb * 8, part0 + kk * 16);
          mma::mma_bf16_16816(dA2[nb], af, bf);
        }
      }
    }
    // (block_sum's barriers also order every warp's last reads of the slots before the
    // writes of the second part's dA2 into sExchange below)
    dlambda = block_sum(dlambda);
    if (threadIdx.x == 0) bw.chunk_dlambda[slot] = dlambda;
    // The row sums and dA2 of the second column part, if any, through shared memory to the
    // first part's warp of the same rows, which adds them (parts in order) and stores.
    float eo[2], tau_sum[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      eo[half] = mma::quad_sum(deo[half]);
      tau_sum[half] = mma::quad_sum(dtau[half]);
    }
    if constexpr (kParts == 2) {
      if (part == 1) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = row0 + acc_row(2 * half);
          if (mma::lane_id() % 4 == 0) {
            s_row_part[0][i] = eo[half];
            s_row_part[1][i] = tau_sum[half];
          }
#pragma unroll
          for (int nb = 0; nb < kChunk / 8; ++nb) {
            const int j = acc_col(nb, 0);
            sExchange[i * LDF + j] = dA2[nb][2 * half];
            sExchange[i * LDF + j + 1] = dA2[nb][2 * half + 1];
          }
        }
      }
      __syncthreads();
      if (part == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = row0 + acc_row(2 * half);
          eo[half] += s_row_part[0][i];
          tau_sum[half] += s_row_part[1][i];
#pragma unroll
          for (int nb = 0; nb < kChunk / 8; ++nb) {
            const int j = acc_col(nb, 0);
            dA2[nb][2 * half] += sExchange[i * LDF + j];
            dA2[nb][2 * half + 1] += sExchange[i * LDF + j + 1];
          }
        }
      }
    }
    if (part == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = row0 + mma::lane_id() / 4 + 8 * half;
        if (i < n && mma::lane_id() % 4 == 0) {
          const int64_t row = pr.row(b, begin + i, h);
          bw.row_deo[row] = eo[half];
          bw.row_dtau[row] = tau_sum[half];
        }
      }
      // da + dA2 into da_rounded (bf16, as the wy kernel takes it), all of the lane's loads
      // issued before its first store (the compiler cannot tell the two buffers apart, so a
      // fused loop would wait on each load).
      const float* da = bw.da + slot * kChunk * kChunk;
      bf16* da_rounded = bw.da_rounded + slot * kChunk * kChunk;
      float2 earlier[kChunk / 8][2];
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = row0 + acc_row(2 * half), j = acc_col(nb, 0);
          earlier[nb][half] = *reinterpret_cast<const float2*>(da + i * kChunk + j);
        }
      }
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = row0 + acc_row(2 * half), j = acc_col(nb, 0);
          const float2 x = earlier[nb][half];
          *reinterpret_cast<uint32_t*>(da_rounded + i * kChunk + j) =
              mma::pack_bf16(x.x + dA2[nb][2 * half], x.y + dA2[nb][2 * half + 1]);
        }
      }
    }
  }
  stamped.loop_done();
}

// dL = -strict_tril(A^T dA A^T), the gradient of L = diag(beta) M through A = (I + L)^-1:
// dL_ij = -sum_m (A^T dA)_im A_jm for j < i, -0 elsewhere, into sD (f32, row stride LDF).
// On the tensor cores, with bf16 operands and f32 sums, as FLA's WY backward (which keeps
// A in bf16) forms it, from A and dA in bf16 as the prepare and keys kernels stored them
// (sA, sDA: [64][LDA]): warp w forms T = A^T dA for its 16 rows [row0, row0 + 16) and all
// 64 columns (a row of A^T is a column of A: ldmatrix's transposing load), and its columns
// of T A^T from T's registers, rounded, with A's rows as B^T. The terms A's zeros add are
// exact zeros.
// (In f32 on the CUDA cores, 4 x 4 elements a thread at 256 threads, the two products had
// taken about 1,700 of the WY kernel's executed instructions a thread a chunk at K = 128,
// by the sizes and trip counts of their loops in the sm_90a SASS: the most of any part of
// it. Here they are 48 tensor-core products a warp of 8, 64 of 4.) Ends with a barrier.
template <int LDA, int LDF, int kWarps>
__device__ void chunk_inverse_grad(const bf16* sA, const bf16* sDA, float* sD) {
  constexpr int kParts = kWarps / 4, kCols = kChunk / kParts;  // a warp's columns of dL
  static_assert(kWarps % 4 == 0 && kCols % 8 == 0, "4 row tiles by whole column blocks");
  const int warp = int(threadIdx.x / 32), row0 = warp % 4 * 16, col0 = warp / 4 * kCols;
  float t[kChunk / 8][4], dl[kCols / 8][4];
  mma::zero(t);
  mma::zero(dl);
  mma::columns_times_matrix<kChunk, LDA, LDA, kChunk / 8>(sA, row0, sDA, t);  // A^T dA
  mma::accumulator_times_rows<kChunk / 8, LDA, kCols / 8>(t, sA + col0 * LDA, dl);  // T A^T
#pragma unroll
  for (int nb = 0; nb < kCols / 8; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + acc_row(e), j = col0 + acc_col(nb, e);
      sD[i * LDF + j] = j < i ? -dl[nb][e] : -0.f;
    }
  }
  __syncthreads();
}

template <int KD>
struct BwdWyLayout {
  static constexpr int kb = KD < 64 ? KD : 64;
  static constexpr int ldk = KD + 8, lda = kChunk + 8, ldb = kb + 8, ldf = kChunk + 1;
  static constexpr size_t f_bytes = size_t(2 * kChunk * ldf) * 4;  // M, dL
  // K, A, dA in bf16 (chunk_inverse_grad), a key block of dW
  static constexpr size_t bytes =
      f_bytes + size_t(kChunk * ldk + 2 * kChunk * lda + kChunk * ldb) * 2;
};

// Warps of a WY block: 8 from K = 64 (dL's, M's and the key blocks' products in row tiles
// by column halves, as the keys kernel's), else 4.
template <int KD>
constexpr int kWyWarps = KD >= 64 ? 8 : 4;

template <int KD>
__global__ void __launch_bounds__(kWyWarps<KD> * 32, 2)
    gdr_bwd_wy_mma(Problem<bf16> pr, MmaBackward bw) {
  begin_dependent_kernel();
  const StampedBlock stamped(pr.timeline);
  using L = BwdWyLayout<KD>;
  constexpr int KB = L::kb, LDK = L::ldk, LDA = L::lda, LDB = L::ldb, LDF = L::ldf;
  constexpr int kWarps = kWyWarps<KD>, kThreads = kWarps * 32, kParts = kWarps / 4;
  constexpr int KBP = KB / kParts;  // key columns of a warp in a key block
  static_assert(kWarps % 4 == 0 && KBP % 8 == 0, "whole 8-column blocks per warp");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  float* sM = reinterpret_cast<float*>(smem_raw);
  float* sD = sM + kChunk * LDF;  // dL, then dM * Gamma
  bf16* sK = reinterpret_cast<bf16*>(smem_raw + L::f_bytes);
  bf16* sA = sK + kChunk * LDK;
  bf16* sDA = sA + kChunk * LDA;   // dA in bf16, as the keys kernel rounded it
  bf16* sdW = sDA + kChunk * LDA;  // [64][KB]: the key block of dW
  constexpr int kRowParts = kThreads / kChunk;  // threads that share a row's Z sums
  HAM_STATIC_SHARED(float, s_g, [kChunk]);
  HAM_STATIC_SHARED(float, s_beta, [kChunk]);
  HAM_STATIC_SHARED(float, s_dg, [kParts][kChunk]);
  HAM_STATIC_SHARED(float, s_part, [kRowParts][2][kChunk]);
  HAM_STATIC_SHARED(float, s_upper_total);
  const int64_t b = blockIdx.z / pr.heads, h = blockIdx.z % pr.heads;
  const int warp = int(threadIdx.x / 32), t4 = mma::lane_id() % 4;
  // The warp's rows [row0, row0 + 16) and key columns [part0, part0 + KBP) of a key block
  const int row0 = warp % 4 * 16, part = warp / 4, part0 = part * KBP;
  const RowChunks row_chunks(pr, b);
  const int count = min(row_chunks.count, bw.window.end);  // the row's chunks in the window
  stamped.loop_begins([&] { return strided_chunks(bw.window.begin, count); });
  for (int chunk = bw.window.begin + int(blockIdx.x); chunk < count; chunk += int(gridDim.x)) {
    const int64_t begin = row_chunks.begin(chunk);
    const int n = int(row_chunks.begin(chunk + 1) - begin);
    const int64_t slot = chunk_slot(pr, b, h, chunk, bw.max_chunks);
    __syncthreads();
    const ChunkRows rows_of(pr, b, h, begin);
    issue_tile<kThreads>(sK, LDK, kChunk, KD, n, KD, rows_of(pr.k, KD, 0));
    // dW's first key block
    issue_tile<kThreads>(sdW, LDB, kChunk, KB, n, KB, rows_of(bw.dw, KD, 0));
    async_copy_commit();
    // Row sums of the earlier kernels for row threadIdx.x (< n), read now, used at the end.
    struct {
      float dbeta = 0.f, deo = 0.f, dtau = 0.f, zp = 0.f;
    } rows;
    const int64_t row_at = int(threadIdx.x) < n ? pr.row(b, begin + threadIdx.x, h) : 0;
    if (int(threadIdx.x) < n) {
      rows.dbeta = bw.row_dbeta[row_at];
      rows.deo = bw.row_deo[row_at];
      rows.dtau = bw.row_dtau[row_at];
      rows.zp = bw.row_zp[row_at];
    }
    const float chunk_dlambda = bw.chunk_dlambda[slot];
    load_square_bf16<LDA, kThreads>(bw.da_rounded + slot * kChunk * kChunk, sDA);
    load_square_bf16<LDA, kThreads>(bw.a_inv + slot * kChunk * kChunk, sA);
    load_beta(pr, b, h, begin, n, s_beta);
    load_gcum(bw.gcum, pr, b, h, begin, n, s_g);
    async_copy_wait<0>();
    __syncthreads();
    chunk_decayed_kk<KD, LDK, LDF, kWarps>(sK, s_g, n, sM);
    chunk_inverse_grad<LDA, LDF, kWarps>(sA, sDA, sD);  // dL into sD
    // dbeta's L term and Z = dM * M by rows and columns (before sD becomes dM * Gamma):
    // thread t sums the columns of part t / 64 (of kRowParts) of row t % 64, and thread
    // i < 64 adds the other parts' sums (s_part) to its own, in order.
    float dbeta_l = 0.f, zm = 0.f;
    {
      constexpr int kSpan = kChunk / kRowParts;
      const int i = int(threadIdx.x) % kChunk, row_part = int(threadIdx.x) / kChunk;
      const int j0 = row_part * kSpan;
      for (int j = j0; j < j0 + kSpan; ++j) {
        dbeta_l += sD[i * LDF + j] * sM[i * LDF + j];
        zm += s_beta[i] * sD[i * LDF + j] * sM[i * LDF + j] -
              s_beta[j] * sD[j * LDF + i] * sM[j * LDF + i];
      }
      if (row_part > 0) {
        s_part[row_part][0][i] = dbeta_l;
        s_part[row_part][1][i] = zm;
      }
    }
    __syncthreads();
    if (int(threadIdx.x) < kChunk) {
#pragma unroll
      for (int row_part = 1; row_part < kRowParts; ++row_part) {
        dbeta_l += s_part[row_part][0][threadIdx.x];
        zm += s_part[row_part][1][threadIdx.x];
      }
    }
    for (int idx = int(threadIdx.x); idx < kChunk * kChunk; idx += int(blockDim.x)) {
      const int i = idx / kChunk, j = idx % kChunk;  // dM * Gamma, dM = diag(beta) dL
      const float gamma = decay(s_g[i] - s_g[j]);
      sD[i * LDF + j] = j < i && i < n ? s_beta[i] * sD[i * LDF + j] * gamma : 0.f;
    }
    __syncthreads();

    // dk = dk_part + (dM * Gamma) K + (dM * Gamma)^T K + diag(beta E) A^T dW, by key blocks.
    float dbk[2] = {0.f, 0.f};  // <dKbg_i, K_i> of the lane's two rows
    float beta_e[2];            // beta_i E_i of the lane's two rows (once, not per element)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = row0 + acc_row(2 * half);
      beta_e[half] = s_beta[i] * expf(s_g[i]);
    }
    for (int k0 = 0; k0 < KD; k0 += KB) {
      if (k0 > 0) {  // the first block came with sK
        __syncthreads();  // sdW of the previous block is no longer read
        issue_tile<kThreads>(sdW, LDB, kChunk, KB, n, KB, rows_of(bw.dw, KD, k0));
        async_copy_commit();
      }
      // The lane's dk_part elements (row acc_row(e), columns acc_col(nb, e) and the next,
      // which the epilogue adds), loaded now so that they are in flight with the products.
      float2 dk_part[KBP / 8][2];
#pragma unroll
      for (int nb = 0; nb < KBP / 8; ++nb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = row0 + acc_row(2 * half), c = k0 + part0 + acc_col(nb, 0);
          dk_part[nb][half] = bw.dk && i < n
                                  ? *reinterpret_cast<const float2*>(
                                        bw.dk_part + pr.row(b, begin + i, h) * KD + c)
                                  : float2{0.f, 0.f};
        }
      }
      async_copy_wait<0>();
      __syncthreads();
      float dkbg[KBP / 8][4], dm[KBP / 8][4];
      mma::zero(dkbg);
      mma::zero(dm);
      mma::columns_times_matrix<kChunk, LDA, LDB, KBP / 8>(sA, row0, sdW + part0, dkbg);
      square_times_matrix<false, LDK, KBP / 8>(sD, LDF, row0, sK + k0 + part0, dm);
      square_times_matrix<true, LDK, KBP / 8>(sD, LDF, row0, sK + k0 + part0, dm);
#pragma unroll
      for (int nb = 0; nb < KBP / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row0 + acc_row(e), c = k0 + part0 + acc_col(nb, e);
          dbk[e / 2] += dkbg[nb][e] * load(sK[i * LDK + c]);
          const float part_x = e % 2 ? dk_part[nb][e / 2].y : dk_part[nb][e / 2].x;
          dm[nb][e] = part_x + dm[nb][e] + beta_e[e / 2] * dkbg[nb][e];  // now dk
        }
      }
      // dk in column pairs from one row address per row (see store_tile_bf16)
      if (bw.dk) {
        store_tile_bf16(dm, row0, n, KBP, [&](int i) {
          return bw.dk + pr.row(b, begin + i, h) * KD + k0 + part0;
        });
      }
    }
    // Per row: dbeta and dG (the lane t4 == 0 of a row's quad, per column part; then thread
    // i for zm, adding the parts in order).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = row0 + mma::lane_id() / 4 + 8 * half;
      const float k_dot = mma::quad_sum(dbk[half]);
      if (t4 == 0) s_dg[part][i] = k_dot;  // <dKbg_i, K_i> over the part's columns
    }
    __syncthreads();
    const int i_row = int(threadIdx.x);  // thread i < n has row i's sums (rows below)
    float dG = 0.f, to_last = 0.f;  // to_last: tau_i <(K dS_end)_i, u_i>, a term of dG_last
    if (i_row < n) {
      float k_dot = s_dg[0][i_row];
#pragma unroll
      for (int p = 1; p < kParts; ++p) k_dot += s_dg[p][i_row];
      const float e_i = expf(s_g[i_row]);
      const float tau = expf(s_g[n - 1] - s_g[i_row]);
      if (bw.dbeta) bw.dbeta[row_at] = store<bf16>(rows.dbeta + e_i * k_dot + dbeta_l);
      dG = e_i * (rows.deo + s_beta[i_row] * k_dot) - tau * rows.dtau + rows.zp + zm;
      to_last = tau * rows.dtau;
    }
    // dG_last's chunk-end terms, lambda <S0, dS_end> + sum_i tau_i <(K dS_end)_i, u_i>.
    const float last = block_sum(to_last) + (n > 0 ? expf(s_g[n - 1]) * chunk_dlambda : 0.f);
    // dg = reverse chunk-local cumsum of dG (dG_last with its chunk-end terms): a suffix
    // scan within each of the two warps of rows, then warp 0 adds warp 1's total.
    float suffix = dG + (i_row == n - 1 ? last : 0.f);
    if (i_row < kChunk) {
      const int lane = i_row % 32;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const float later = __shfl_down_sync(0xffffffffu, suffix, d);
        if (lane + d < 32) suffix += later;
      }
      if (i_row == 32) s_upper_total = suffix;
    }
    __syncthreads();
    if (i_row < 32) suffix += s_upper_total;
    if (bw.dg && i_row < n) {
      if (bw.dg_f32) static_cast<float*>(bw.dg)[row_at] = suffix;
      else static_cast<bf16*>(bw.dg)[row_at] = store<bf16>(suffix);
    }
  }
  stamped.loop_done();
}

// ---- Host side -----------------------------------------------------------------------

struct Dims {
  int64_t batch, seq_len, heads, key_dim, value_dim;
};

Dims dims_of(const GatedDeltaRuleArgs& a) {
  return {a.q.size(0), a.q.size(1), a.q.size(2), a.q.size(3), a.v.size(3)};
}

// Largest dynamic shared memory a block of `kernel` may use on the current device.
template <class Kernel>
size_t shared_memory_limit(Kernel kernel) {
  const size_t optin = max_shared_per_block();
  const size_t static_bytes = static_shared_bytes("gated_delta_rule", kernel);
  return optin > static_bytes ? optin - static_bytes : 0;
}

// V tile width: the smallest of 8, 16, 32, 64 that covers V (64 when V > 64), halved until
// the block's shared memory fits. Tiles of 8..64 columns give 32..4 lanes per column.
// `hint` ends the error where nothing fits.
template <class Bytes>
int choose_value_tile(const char* op, const Dims& d, size_t limit, Bytes bytes_for,
                      const char* hint = "") {
  int vt = 8;
  while (vt < 64 && vt < d.value_dim) vt *= 2;
  for (; vt >= 8; vt /= 2) {
    if (bytes_for(vt) <= limit) return vt;
  }
  HAM_FAIL(op, ": K = ", d.key_dim, " needs ", bytes_for(8),
           " bytes of shared memory per block even with 8-column V tiles; the device allows ",
           limit, hint);
}

// The chunked SIMT kernels' hint where they do not fit even so, bf16 taking other kernels.
template <class T>
const char* smaller_gpu_hint() {
  return std::is_same_v<T, bf16> ? ""
                                 : "; bf16 inputs (ham train --precision bf16) at K = 16, "
                                   "32, 64, 128 or 256 take the tensor-core kernels, which "
                                   "fit an A100's 163 KiB";
}

// A chunked SIMT kernel for these inputs, its value tile width and dynamic shared memory.
template <class Kernel>
struct SimtLaunch {
  Kernel kernel;
  int vt;
  size_t bytes;
};

// The kernel that stages a chunk's Q rows in shared memory (`staging`) wherever its 8-column
// tiles fit with them, else, for f32 and f64, the one that reads them from global memory
// (`from_global`; bf16 has none and passes `staging`): f32 at K = 256 on an A100's 163 KiB,
// where its K and Q rows alone take 131 KB. With the widest value tile that fits
// (choose_value_tile).
template <class T, class Kernel>
SimtLaunch<Kernel> choose_simt_launch(const char* op, const Dims& d, bool backward,
                                      Kernel staging, Kernel from_global) {
  const bool q_in_shared =
      std::is_same_v<T, bf16> ||
      SmemLayout(d.key_dim, 8, sizeof(T), sizeof(compute_t<T>), backward).bytes <=
          shared_memory_limit(staging);
  const Kernel kernel = q_in_shared ? staging : from_global;
  auto bytes_for = [&](int tile) {
    return SmemLayout(d.key_dim, tile, sizeof(T), sizeof(compute_t<T>), backward, q_in_shared)
        .bytes;
  };
  const int vt =
      choose_value_tile(op, d, shared_memory_limit(kernel), bytes_for, smaller_gpu_hint<T>());
  return {kernel, vt, bytes_for(vt)};
}

template <class T>
Problem<T> make_problem(const GatedDeltaRuleArgs& a, const Dims& d, const ChunkTable& table,
                        int vt) {
  Problem<T> pr;
  pr.q = ptr<const T>(a.q);
  pr.k = ptr<const T>(a.k);
  pr.v = ptr<const T>(a.v);
  const bool f32_gates = a.g.dtype() == DType::F32 && !std::is_same_v<T, float>;
  pr.g = f32_gates ? nullptr : ptr<const T>(a.g);
  pr.g_f32 = f32_gates ? ptr<const float>(a.g) : nullptr;
  pr.beta = ptr<const T>(a.beta);
  pr.h0 = ptr_or_null<const T>(a.h0);
  pr.chunk_begin = table.begin.defined() ? ptr<const int32_t>(table.begin) : nullptr;
  pr.chunk_doc_start = table.doc_start.defined() ? ptr<const int32_t>(table.doc_start) : nullptr;
  pr.chunk_count = table.count.defined() ? ptr<const int32_t>(table.count) : nullptr;
  pr.doc_chunk = table.doc_chunk.defined() ? ptr<const int32_t>(table.doc_chunk) : nullptr;
  pr.doc_count = table.count.defined() ? ptr<const int32_t>(table.count) + d.batch : nullptr;
  pr.batch = d.batch;
  pr.seq_len = d.seq_len;
  pr.heads = d.heads;
  pr.key_dim = d.key_dim;
  pr.value_dim = d.value_dim;
  pr.vt = vt;
  pr.tiles = int((d.value_dim + vt - 1) / vt);
  return pr;
}

dim3 grid_of(const char* op, const Dims& d, int tiles) {
  HAM_CHECK(d.heads < 65536 && d.batch < 65536, op, ": B = ", d.batch, ", H = ", d.heads,
            " exceed the grid (at most 65535 each)");
  return dim3(unsigned(tiles), unsigned(d.heads), unsigned(d.batch));
}

// The state passes' grid: (tile, document) pairs along x (StateTile), heads, batch rows.
dim3 state_pass_grid(const char* op, const Dims& d, int tiles, int64_t docs) {
  HAM_CHECK(int64_t(tiles) * docs < (int64_t(1) << 31), op, ": ", docs, " documents in a row",
            " times ", tiles, " value tiles exceed the grid");
  dim3 grid = grid_of(op, d, tiles);
  grid.x = unsigned(int64_t(tiles) * std::max<int64_t>(docs, 1));
  return grid;
}

void check_sizes(const char* op, const Dims& d) {
  HAM_CHECK(d.seq_len < (int64_t(1) << 30), op, ": T = ", d.seq_len, " is too long");
}

// fit_error from the per-tile partial sums, where the caller wants it (defined).
template <class T>
void finish_fit_error(const Tensor& fit_part, const Dims& d, int tiles, Tensor& fit_error) {
  if (!fit_error.defined()) return;  // not wanted (GatedDeltaRuleArgs::want_fit_error)
  launch_fit_error<T>(fit_part, d.batch * d.seq_len * d.heads, tiles, fit_error);
}

// Largest chunk and document counts over the batch rows. Without doc_ids every row is one
// document of ceil(T / 64) chunks, known here; with them, one device-to-host read of the
// table's counts on the launch stream, which waits for the stream (an idle gap on the GPU
// until the host launches again, and no running ahead of the GPU across it).
struct ChunkCounts {
  int64_t chunks = 0, docs = 0;
};
ChunkCounts max_chunk_counts(const GatedDeltaRuleArgs& a, const ChunkTable& table,
                             int64_t batch, int64_t seq_len) {
  if (!a.doc_ids.defined()) {
    return {(seq_len + kChunk - 1) / kChunk, seq_len > 0 ? 1 : 0};
  }
  std::vector<int32_t> counts(static_cast<size_t>(2 * batch));
  cudaStream_t stream = launch_stream();
  HAM_CUDA_CHECK(cudaMemcpyAsync(counts.data(), ptr<const int32_t>(table.count),
                                 counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream));
  ChunkCounts most;
  for (int64_t b = 0; b < batch; ++b) {
    most.chunks = std::max<int64_t>(most.chunks, counts[size_t(b)]);
    most.docs = std::max<int64_t>(most.docs, counts[size_t(batch + b)]);
  }
  return most;
}

// Launches a tensor-core kernel `name` on `threads` threads a block, first raising its
// shared-memory limit when it needs more than the default 48 KiB, with its block stamps in
// pr.timeline while recording (cuda/block_timeline.h), as a dependent launch where
// set_dependent_launches (cuda/dependent_launch.h).
template <class Kernel, class... Args>
void launch_kernel(const KernelName& name, Kernel kernel, dim3 grid, int threads, size_t bytes,
                   Problem<bf16> pr, Args... args) {
  allow_dynamic_shared("gated_delta_rule", kernel, bytes);
  pr.timeline = block_timeline_for_launch(name, int64_t(grid.x) * grid.y * grid.z);
  HAM_LAUNCH_DEPENDENT(grid, threads, bytes, launch_stream(), kernel)(pr, args...);
  HAM_CUDA_CHECK_LAUNCH();
}

template <class Kernel, class... Args>
void launch_mma(const KernelName& name, Kernel kernel, dim3 grid, size_t bytes, Args... args) {
  launch_kernel(name, kernel, grid, kMmaThreads, bytes, args...);
}

// Blocks along the chunks of a row (each loops over chunks beyond the grid).
unsigned mma_chunk_blocks(const Dims& d) {
  return unsigned(std::max<int64_t>(1, (d.seq_len + kChunk - 1) / kChunk));
}

// Calls fn.template operator()<K>() for the key dims with tensor-core kernels; false for
// the others.
template <class Fn>
bool dispatch_mma_key_dim(int64_t key_dim, Fn&& fn) {
  switch (key_dim) {
    case 16: return fn.template operator()<16>();
    case 32: return fn.template operator()<32>();
    case 64: return fn.template operator()<64>();
    case 128: return fn.template operator()<128>();
    case 256: return fn.template operator()<256>();
    default: return false;
  }
}

// What the forward's first two kernels leave for its output kernel and for the backward:
// the chunk table, W and U of every chunk, every chunk's start state S0 and v_new.
struct MmaChunkStates {
  ChunkTable table;
  Problem<bf16> pr;  // 64-column value tiles (the output kernel's)
  int64_t max_chunks = 0, max_docs = 0;  // over the batch rows
  Tensor w, u, v_new, states;
  Tensor gcum;  // G, the chunk-local cumsum of the gates, f32 [B, T, H]
  Tensor a_inv;  // each chunk's A, bf16 [B, H, max_chunks, 64, 64], for the backward only
};

int64_t bytes_of(std::initializer_list<const Tensor*> tensors) {
  int64_t total = 0;
  for (const Tensor* t : tensors) {
    total += t->defined() ? t->numel() * int64_t(dtype_size(t->dtype())) : 0;
  }
  return total;
}

// What the tensor-core forward keeps for its backward, for inputs of `dims` on `device`.
struct MmaSaved : GatedDeltaRuleSaved {
  Dims dims{};
  Device device;
};

// GatedDeltaRuleKeep::ChunkStates: the chunk table and every chunk term the backward reads
// (MmaChunkStates without U, which only the state pass reads).
struct MmaSavedChunkStates final : MmaSaved {
  MmaChunkStates chunk;
  int64_t bytes() const override {
    return bytes_of({&chunk.table.begin, &chunk.table.doc_start, &chunk.table.doc_chunk,
                     &chunk.table.count, &chunk.w, &chunk.v_new, &chunk.states, &chunk.gcum,
                     &chunk.a_inv});
  }
};

// GatedDeltaRuleKeep::Inverses: the chunk table (with its largest counts, read back once
// by the forward) and each chunk's A, from which the backward's prepare kernel forms W and
// U without K K^T or the inverse.
struct MmaSavedInverses final : MmaSaved {
  ChunkTable table;
  int64_t max_chunks = 0, max_docs = 0;
  Tensor a_inv;  // bf16 [B, H, max_chunks, 64, 64]
  int64_t bytes() const override {
    return bytes_of({&table.begin, &table.doc_start, &table.doc_chunk, &table.count, &a_inv});
  }
};

// `saved` as the tensor-core forward's, checked against the backward's inputs (a one-line
// error naming both shapes when they differ, or when another kind of forward made it).
const MmaSaved& saved_by_mma_forward(const char* op, const GatedDeltaRuleSaved& saved,
                                     const Dims& d, const Device& device) {
  const auto* kept = dynamic_cast<const MmaSaved*>(&saved);
  HAM_CHECK(kept != nullptr, op, ": the saved forward state was not made by the CUDA "
            "tensor-core forward");
  const Dims& s = kept->dims;
  HAM_CHECK(s.batch == d.batch && s.seq_len == d.seq_len && s.heads == d.heads &&
                s.key_dim == d.key_dim && s.value_dim == d.value_dim && kept->device == device,
            op, ": the saved forward state is for [B, T, H, K, V] = [", s.batch, ", ", s.seq_len,
            ", ", s.heads, ", ", s.key_dim, ", ", s.value_dim, "] on ", kept->device.str(),
            ", the inputs are [", d.batch, ", ", d.seq_len, ", ", d.heads, ", ", d.key_dim, ", ",
            d.value_dim, "] on ", device.str());
  return *kept;
}

std::atomic<int> g_state_columns{0};  // set_gated_delta_rule_state_columns
std::atomic<bool> g_backward_keys_ahead{true};   // set_gated_delta_rule_backward_keys_ahead
std::atomic<int64_t> g_keys_ahead_passes{0};     // gated_delta_rule_keys_ahead_passes
std::atomic<int64_t> g_kept_inverse_reads{0};  // gated_delta_rule_kept_inverse_reads
std::atomic<int> g_forward_windows{1};        // set_gated_delta_rule_forward_windows
std::atomic<int64_t> g_windowed_forwards{0};   // gated_delta_rule_windowed_forwards
std::atomic<int> g_backward_windows{1};       // set_gated_delta_rule_backward_windows
std::atomic<int64_t> g_windowed_backwards{0};  // gated_delta_rule_windowed_backwards
std::atomic<bool> g_backward_overlap{true};     // set_gated_delta_rule_backward_overlap
std::atomic<bool> g_one_slot{false};             // set_gated_delta_rule_one_slot
std::atomic<int64_t> g_one_slot_launches{0};     // gated_delta_rule_one_slot_launches
std::atomic<int64_t> g_overlapped_local_passes{0};  // gated_delta_rule_overlapped_local_passes
std::atomic<int> g_state_partial_sums{1};      // set_gated_delta_rule_state_partial_sums
std::atomic<int64_t> g_partial_sum_passes{0};  // gated_delta_rule_partial_sum_passes
std::atomic<int> g_prepare_warps{4};            // set_gated_delta_rule_prepare_warps
std::atomic<int64_t> g_eight_warp_prepares{0};  // gated_delta_rule_eight_warp_prepares
std::atomic<bool> g_forward_prepare_windows{true};  // ..._forward_prepare_windows
std::atomic<int64_t> g_windowed_prepares{0};    // gated_delta_rule_windowed_prepares
std::atomic<int> g_recompute_windows{1};        // set_gated_delta_rule_recompute_windows
std::atomic<int64_t> g_windowed_recomputes{0};  // gated_delta_rule_windowed_recomputes
std::atomic<int> g_output_prefetch{0};          // set_gated_delta_rule_output_prefetch
std::atomic<int64_t> g_prefetching_output_passes{0};  // ..._prefetching_output_passes

// The forward's state pass at K = KD on VT columns, with v_new in two partial sums where
// set and where they apply (kStatePartialSums; counted).
// `one_slot`: in one slot of chunk tiles (forward_state_one_slot).
template <int KD, int VT>
auto forward_state_kernel(KernelName& name, bool one_slot) {
  name = one_slot ? KernelName{"gdr_state_mma", {KD, VT, 1, 1}, 4}
                  : KernelName{"gdr_state_mma", {KD, VT, 1}, 3};
  if constexpr (kStatePartialSums<KD, VT>) {
    if (g_state_partial_sums.load() == 2) {
      g_partial_sum_passes.fetch_add(1);
      name.arguments[2] = 2;
      if constexpr (KD == kOneSlotKeyDim) {
        if (one_slot) return &gdr_state_mma<KD, VT, 2, 1>;
      }
      return &gdr_state_mma<KD, VT, 2>;
    }
  }
  if constexpr (KD == kOneSlotKeyDim) {
    if (one_slot) return &gdr_state_mma<KD, VT, 1, 1>;
  }
  return &gdr_state_mma<KD, VT, 1>;
}

// Whether the forward's state pass on VT columns takes one slot of chunk tiles
// (gdr_state_mma<KD, VT, kSums, 1>): at K = 256, where set_gated_delta_rule_one_slot asks or two do
// not fit.
template <int KD, int VT>
bool forward_state_one_slot() {
  if constexpr (KD != kOneSlotKeyDim) {
    return false;
  } else {
    return g_one_slot.load() ||
           MmaStateLayout<KD, VT>::bytes > shared_memory_limit(&gdr_state_mma<KD, VT, 1>);
  }
}

// The same for the output kernel, whose value tiles take two slots where there are two or
// more (`slots`).
template <int KD, bool kFit>
bool output_one_slot(int slots) {
  if constexpr (KD != kOneSlotKeyDim) {
    return false;
  } else {
    return slots == 2 && (g_one_slot.load() || MmaOutputLayout<KD, kFit>::bytes(2) >
                                                   shared_memory_limit(&gdr_output_mma<KD, kFit>));
  }
}

// The same for the backward's, with kSlots slots of chunk tiles, and du.
template <int KD, int VT, int kSlots>
auto backward_state_kernel(KernelName& name) {
  name = KernelName{"gdr_bwd_state_mma", {KD, VT, kSlots, 1}, 4};
  if constexpr (kStatePartialSums<KD, VT>) {
    if (g_state_partial_sums.load() == 2) {
      g_partial_sum_passes.fetch_add(1);
      name.arguments[3] = 2;
      return &gdr_bwd_state_mma<KD, VT, kSlots, 2>;
    }
  }
  return &gdr_bwd_state_mma<KD, VT, kSlots, 1>;
}

// Whether a state pass's blocks of 32 columns number no more than the SMs, one block each.
// Its blocks run the chunks in sequence, so its time is about (chunks) x (time of a chunk
// step) where each block has an SM to itself; 32-column tiles halve a step's products and
// double the blocks, which paid on the H200 while each still had an SM to itself (B = 2,
// T = 16384, H = 16, K = V = 128: 128 blocks; the paper's H = 5, K = 256, V = 384: 60-120)
// and not when two shared one (B = 4, T = 4096, H = 16, K = V = 128: 256 blocks, the
// forward's 64-column pass 0.96x the 32's time on 2026-11-27).
bool narrow_state_pass_has_sms(const Dims& d) {
  const int64_t blocks = d.batch * d.heads * ((d.value_dim + 31) / 32);
  return blocks <= int64_t(multiprocessor_count());
}

// Value columns per block of gdr_state_mma: 32 where narrow_state_pass_has_sms, else 64.
template <int KD>
int state_columns(const Dims& d) {
  if (const int forced = g_state_columns.load(); forced != 0) return forced;
  return narrow_state_pass_has_sms(d) ? 32 : 64;
}

// Value columns per block of the backward's sequential pass (gdr_bwd_state_mma), chosen as
// the forward's where its 32-column blocks fit a block's shared memory with two slots of
// chunk tiles, else VT, the backward's tile width (kBackwardVt: already 32 at K = 256).
// set_gated_delta_rule_state_columns forces the width here too where VT is 64.
template <int KD, int VT>
int backward_state_columns(const Dims& d) {
  if constexpr (VT == 32) {
    return 32;
  } else {
    if (const int forced = g_state_columns.load(); forced != 0) return forced;
    using Narrow = BwdStateLayout<KD, 32, 2>;
    if (Narrow::bytes > shared_memory_limit(&gdr_bwd_state_mma<KD, 32, 2>)) return VT;
    return narrow_state_pass_has_sms(d) ? 32 : VT;
  }
}

// A state pass in `windows` windows of the rows' max_chunks chunks (the last first where
// `reverse`, as the backward's pass runs): pass(window) on the device's high-priority
// second stream, then, once that window's pass is done, after(window) on the current
// stream, beside the pass over the next window (where given). Where given, before(window)
// runs first for every window, in the passes' order, on the current stream, each window's
// pass waiting for its own (the prepare kernel by windows: the pass over the first window
// starts once that window's W and U are formed, while the next windows' are formed beside
// it), and then beside(), on the current stream beside the passes. The state crossing a
// window's edge goes through two f32 [B, H, K, V] buffers of state_elements each, used in
// turn (StateWindow). `windowed` counts the calls whose passes took a stream of the
// greatest priority.
using WindowPass = std::function<void(const StateWindow&)>;
void run_in_windows(const Device& device, int windows, int64_t max_chunks,
                    int64_t state_elements, bool reverse, std::atomic<int64_t>& windowed,
                    const WindowPass& pass, const WindowPass& after,
                    const WindowPass& before = nullptr,
                    const std::function<void()>& beside = nullptr) {
  Tensor carry = Tensor::empty(Shape{2 * state_elements}, DType::F32, device);
  std::vector<StateWindow> in_order(size_t(windows), StateWindow{});  // as the passes run
  for (int i = 0; i < windows; ++i) {
    const int j = reverse ? windows - 1 - i : i;  // the window's place in the rows
    StateWindow& window = in_order[size_t(i)];
    window.begin = int(max_chunks * j / windows);
    window.end = j + 1 == windows ? INT_MAX : int(max_chunks * (j + 1) / windows);
    window.carry_in = ptr<const float>(carry) + (i % 2) * state_elements;
    window.carry_out = ptr<float>(carry) + ((i + 1) % 2) * state_elements;
  }
  // Forked before any `before`, so that the first pass waits for its window's only.
  ForkedStream passes(device.index, StreamPriority::High);
  std::vector<Event> ready;  // before(window i) issued (destroyed pending: CUDA allows it)
  if (before) {
    ready.reserve(size_t(windows));
    for (const StateWindow& window : in_order) {
      before(window);
      ready.emplace_back(device.index);
      ready.back().record(launch_stream());
    }
  }
  if (beside) beside();
  for (int i = 0; i < windows; ++i) {
    passes.run([&] {
      // Counted by the stream the pass takes, not by the setting.
      if (i == 0 && has_greatest_priority(launch_stream())) windowed.fetch_add(1);
      if (before) {
        HAM_CUDA_CHECK(cudaStreamWaitEvent(launch_stream(), ready[size_t(i)].handle(), 0));
      }
      pass(in_order[size_t(i)]);
    });
    if (after) {
      passes.join_so_far();
      after(in_order[size_t(i)]);
    }
  }
  passes.join();
}

// Runs gdr_prepare_mma and gdr_state_mma; the state after the last token goes to h_end.
// With keep_inverse (the backward, and the forwards that keep A), the prepare kernel also
// stores every chunk's A; with `inverses` (what such a forward kept), it reads the chunk
// table and A from there instead of forming them.
// run_state_pass (where given) issues the prepare kernel and the state pass, functions it
// is handed, with the chunk table formed: where, beside what, and in which windows of
// chunks (the prepare kernel on the chunks [begin, end) of each row, the state pass on a
// StateWindow; StateWindow{} for the whole rows); the state pass of a window after the
// prepare kernel of its chunks.
using StatePass = WindowPass;
using PreparePass = std::function<void(int chunk_begin, int chunk_end)>;
using StatePassRunner = std::function<void(const MmaChunkStates&, const PreparePass& prepare,
                                           const StatePass& state_pass)>;
template <int KD>
MmaChunkStates chunk_states_mma(const char* op, const GatedDeltaRuleArgs& a, const Dims& d,
                                Tensor& h_end, bool keep_inverse,
                                const MmaSavedInverses* inverses = nullptr,
                                const StatePassRunner& run_state_pass = nullptr) {
  HAM_CHECK(d.heads * d.batch < 65536, op, ": B * H = ", d.heads * d.batch, " exceeds the grid");
  MmaChunkStates c;
  if (inverses) {
    c.table = inverses->table;
    c.max_chunks = inverses->max_chunks;
    c.max_docs = inverses->max_docs;
    c.a_inv = inverses->a_inv;
  } else {
    c.table = build_chunk_table(a, d.batch, d.seq_len);
    const ChunkCounts most = max_chunk_counts(a, c.table, d.batch, d.seq_len);
    c.max_chunks = most.chunks;
    c.max_docs = most.docs;
  }
  c.pr = make_problem<bf16>(a, d, c.table, kMmaVt);
  const Device device = a.q.device();
  const int64_t rows = d.batch * d.seq_len * d.heads;
  c.w = Tensor::empty(Shape{rows * d.key_dim}, DType::BF16, device);
  c.u = Tensor::empty(Shape{rows * d.value_dim}, DType::BF16, device);
  c.v_new = Tensor::empty(Shape{rows * d.value_dim}, DType::BF16, device);
  c.states = Tensor::empty(Shape{d.batch * d.heads * c.max_chunks * d.key_dim * d.value_dim},
                           DType::BF16, device);
  c.gcum = Tensor::empty(Shape{rows}, DType::F32, device);
  const bool forms_inverse = inverses == nullptr;
  if (keep_inverse && forms_inverse) {
    c.a_inv = Tensor::empty(Shape{d.batch * d.heads * c.max_chunks * kChunk * kChunk},
                            DType::BF16, device);
  }
  const bf16* a_in = forms_inverse ? nullptr : ptr<const bf16>(c.a_inv);
  const int prepare_warps = g_prepare_warps.load();
  if (prepare_warps == 8) g_eight_warp_prepares.fetch_add(1);
  if (a_in) g_kept_inverse_reads.fetch_add(1);
  const PreparePass launch_prepare = [&](int chunk_begin, int chunk_end) {
    const int64_t window = std::min<int64_t>(chunk_end, c.max_chunks) - chunk_begin;
    const dim3 grid(unsigned(std::min<int64_t>(mma_chunk_blocks(d), window)),
                    unsigned(d.heads), unsigned(d.batch));
    launch_kernel(KernelName{"gdr_prepare_mma", {KD, prepare_warps}, 2},
                  prepare_warps == 8 ? &gdr_prepare_mma<KD, 8> : &gdr_prepare_mma<KD, 4>, grid,
                  prepare_warps * 32, MmaPrepareLayout<KD>::bytes, c.pr, ptr<bf16>(c.w),
                  ptr<bf16>(c.u), ptr<float>(c.gcum),
                  keep_inverse && forms_inverse ? ptr<bf16>(c.a_inv) : nullptr, a_in,
                  c.max_chunks, chunk_begin, chunk_end);
  };
  auto state_pass = [&]<int VT>(const StateWindow& window) {
    const int tiles = int((d.value_dim + VT - 1) / VT);
    KernelName name{};
    const bool one_slot = forward_state_one_slot<KD, VT>();
    if (one_slot) g_one_slot_launches.fetch_add(1);
    const auto kernel = forward_state_kernel<KD, VT>(name, one_slot);
    launch_kernel(name, kernel, state_pass_grid(op, d, tiles, c.max_docs),
                  kStateWarps<KD> * 32,
                  one_slot ? MmaStateLayout<KD, VT, 1>::bytes : MmaStateLayout<KD, VT>::bytes,
                  c.pr, ptr<const bf16>(c.w),
                  ptr<const bf16>(c.u), ptr<const float>(c.gcum), ptr<bf16>(c.v_new),
                  ptr<bf16>(c.states), c.max_chunks, ptr<bf16>(h_end), window);
  };
  const StatePass launch_state_pass = [&](const StateWindow& window) {
    if (state_columns<KD>(d) == 32) state_pass.template operator()<32>(window);
    else state_pass.template operator()<64>(window);
  };
  if (run_state_pass) {
    run_state_pass(c, launch_prepare, launch_state_pass);
  } else {
    launch_prepare(0, INT_MAX);
    launch_state_pass(StateWindow{});
  }
  return c;
}

// The tensor-core forward (above) when it applies: bf16 q, k, v, K in {16, 32, 64, 128,
// 256}. Returns whether it ran. With doc_ids it reads the chunk counts back to size the S0
// scratch (one stream synchronisation), which holds every chunk's start state in bf16 as
// FLA's does.
// Where a.keep asks for anything it also stores every chunk's A, and keeps in out.saved
// the chunk table and A (Inverses: MmaSavedInverses) or every chunk term (ChunkStates:
// MmaSavedChunkStates).
bool gated_delta_rule_forward_mma(const GatedDeltaRuleArgs& a, const Dims& d,
                                  GatedDeltaRuleResult& out) {
  if (a.q.dtype() != DType::BF16 || d.value_dim == 0 || d.seq_len == 0) return false;
  auto run = [&]<int KD>() {
    const char* op = "gated_delta_rule (cuda, tensor cores)";
    const bool keeps = a.keep != GatedDeltaRuleKeep::Nothing;
    const Device device = a.q.device();
    const bool fit = out.fit_error.defined();  // [B, T, H] in q's dtype, bf16 here
    // The output kernel on the chunks [chunk_begin, chunk_end) of each row.
    auto output_pass = [&](const MmaChunkStates& chunks, int chunk_begin, int chunk_end) {
      const int slots = chunks.pr.tiles > 1 ? 2 : 1;
      const int64_t window = std::min<int64_t>(chunk_end, chunks.max_chunks) - chunk_begin;
      const dim3 grid(unsigned(std::min<int64_t>(mma_chunk_blocks(d), window)), 1,
                      unsigned(d.batch * d.heads));
      // Without the fit error the kernel may store O's rows 16 bytes at a time.
      HAM_CHECK(fit || aligned_16(out.o.raw_data()), op, ": o off a 16-byte boundary");
      // One slot of value tiles at K = 256 where set or where two do not fit.
      const bool one_slot =
          fit ? output_one_slot<KD, true>(slots) : output_one_slot<KD, false>(slots);
      // set_gated_delta_rule_output_prefetch: about one wave of blocks, each taking every
      // gridDim.x-th chunk of its row and copying its next chunk's first tiles ahead (into
      // the second slot: not with one).
      const int prefetch_blocks = g_output_prefetch.load();
      const bool prefetch = prefetch_blocks != 0 && !one_slot;
      if (prefetch) g_prefetching_output_passes.fetch_add(1);
      auto launch = [&]<bool kFit>() {
        auto* kernel = prefetch ? &gdr_output_mma<KD, kFit, true> : &gdr_output_mma<KD, kFit>;
        KernelName name{"gdr_output_mma", {KD, int(kFit), int(prefetch)}, 3};
        int kernel_slots = slots;
        if constexpr (KD == kOneSlotKeyDim) {
          if (one_slot) {
            g_one_slot_launches.fetch_add(1);
            kernel = &gdr_output_mma<KD, kFit, false, true>;
            name = KernelName{"gdr_output_mma", {KD, int(kFit), 0, 1}, 4};
            kernel_slots = 1;
          }
        }
        const size_t bytes = MmaOutputLayout<KD, kFit>::bytes(kernel_slots);
        dim3 blocks = grid;
        if (prefetch) {
          const int64_t wave =
              int64_t(resident_blocks_per_sm(op, kernel, kOutputThreads, bytes)) *
              multiprocessor_count();
          const int64_t rows_of_blocks = int64_t(grid.z);
          const int64_t per_row = prefetch_blocks > 0
                                      ? int64_t(prefetch_blocks)
                                      : (wave + rows_of_blocks - 1) / rows_of_blocks;
          blocks.x = unsigned(std::clamp<int64_t>(per_row, 1, int64_t(grid.x)));
        }
        launch_kernel(name, kernel, blocks, kOutputThreads, bytes, chunks.pr,
                      ptr<const bf16>(chunks.v_new), ptr<const bf16>(chunks.states),
                      ptr<const float>(chunks.gcum), chunks.max_chunks, kernel_slots,
                      ptr<bf16>(out.o), fit ? ptr<bf16>(out.fit_error) : nullptr, chunk_begin,
                      chunk_end);
      };
      if (fit) launch.template operator()<true>();
      else launch.template operator()<false>();
    };
    // set_gated_delta_rule_forward_windows: the state pass in windows of chunks on a
    // high-priority fork, the output kernel of each window on the current stream once that
    // window's pass is done, beside the next window's (the state pass alone leaves SMs idle:
    // 60 blocks at the paper's heads, one row). The state of a document that crosses a
    // window's end goes through `carry` in f32, so the results are the same to the bit.
    // The prepare kernel runs by the same windows where set
    // (set_gated_delta_rule_forward_prepare_windows), each window's ahead of its pass, else
    // once over every chunk before the first pass.
    const int windows_asked = g_forward_windows.load();
    StatePassRunner in_windows;
    if (windows_asked > 1) {
      in_windows = [&](const MmaChunkStates& chunks, const PreparePass& prepare,
                       const StatePass& state_pass) {
        WindowPass prepare_window;
        if (g_forward_prepare_windows.load()) {
          g_windowed_prepares.fetch_add(1);
          prepare_window = [&](const StateWindow& window) { prepare(window.begin, window.end); };
        } else {
          prepare(0, INT_MAX);
        }
        run_in_windows(device, int(std::min<int64_t>(windows_asked, chunks.max_chunks)),
                       chunks.max_chunks, d.batch * d.heads * d.key_dim * d.value_dim,
                       /*reverse=*/false, g_windowed_forwards, state_pass,
                       [&](const StateWindow& window) {
                         output_pass(chunks, window.begin, window.end);
                       },
                       prepare_window);
      };
    }
    const MmaChunkStates c =
        chunk_states_mma<KD>(op, a, d, out.h_final, keeps, nullptr, in_windows);
    auto kept_for = [&](auto kept) {
      kept->dims = d;
      kept->device = a.q.device();
      out.saved = std::move(kept);
    };
    if (a.keep == GatedDeltaRuleKeep::ChunkStates) {
      auto kept = std::make_shared<MmaSavedChunkStates>();
      kept->chunk = c;
      kept->chunk.u = Tensor();
      kept_for(std::move(kept));
    } else if (a.keep == GatedDeltaRuleKeep::Inverses) {
      auto kept = std::make_shared<MmaSavedInverses>();
      kept->table = c.table;
      kept->max_chunks = c.max_chunks;
      kept->max_docs = c.max_docs;
      kept->a_inv = c.a_inv;
      kept_for(std::move(kept));
    }
    if (!in_windows) output_pass(c, 0, INT_MAX);
    return true;
  };
  return dispatch_mma_key_dim(d.key_dim, run);
}

// What the autotuner (cuda/autotune.h) keys the tensor-core passes by, and the settings it
// tunes there: each variant gives the same results to the bit.
std::string tune_shape(const GatedDeltaRuleArgs& a, const Dims& d) {
  return detail::concat("bf16 B", d.batch, " T", d.seq_len, " H", d.heads, " K", d.key_dim, " V",
                        d.value_dim, a.doc_ids.defined() ? ", documents" : "",
                        a.h0.defined() ? ", h0" : "");
}

TuneProblem forward_tune_problem(const GatedDeltaRuleArgs& a, const Dims& d,
                                 const GatedDeltaRuleResult& out) {
  const char* kept = a.keep == GatedDeltaRuleKeep::ChunkStates ? ", keeps chunk states"
                     : a.keep == GatedDeltaRuleKeep::Inverses  ? ", keeps inverses"
                                                               : "";
  std::vector<TunedSetting> settings = {{"gated_delta_rule_prepare_warps", {"4", "8"}},
                                        {"gated_delta_rule_forward_windows", {"1", "2", "4", "8"}}};
  // An output kernel in one slot of value tiles does not prefetch: not timed twice.
  const bool fit = out.fit_error.defined();
  const bool one_slot_output = d.key_dim == kOneSlotKeyDim && d.value_dim > kMmaVt &&
                               (fit ? output_one_slot<kOneSlotKeyDim, true>(2)
                                    : output_one_slot<kOneSlotKeyDim, false>(2));
  if (!one_slot_output) settings.push_back({"gated_delta_rule_output_prefetch", {"0", "-1"}});
  return {tune_shape(a, d) + (fit ? ", fit error" : "") + kept, settings,
          {{"o", &out.o}, {"h_final", &out.h_final}, {"fit_error", &out.fit_error}}};
}

// recomputes: the backward runs the forward's state pass again (no chunk states kept).
TuneProblem backward_tune_problem(const GatedDeltaRuleArgs& a, const Dims& d, bool recomputes,
                                  const GatedDeltaRuleGrads& grads) {
  std::vector<TunedSetting> settings = {{"gated_delta_rule_prepare_warps", {"4", "8"}}};
  if (recomputes) settings.push_back({"gated_delta_rule_recompute_windows", {"1", "4"}});
  settings.push_back({"gated_delta_rule_backward_windows", {"1", "4"}});
  if (d.key_dim == 256) settings.push_back({"gated_delta_rule_backward_keys_ahead", {"on", "off"}});
  return {tune_shape(a, d) + (recomputes ? "" : ", from chunk states"), settings,
          {{"dq", &grads.dq},
           {"dk", &grads.dk},
           {"dv", &grads.dv},
           {"dg", &grads.dg},
           {"dbeta", &grads.dbeta},
           {"dh0", &grads.dh0}}};
}

void gated_delta_rule_chunked(const GatedDeltaRuleArgs& a, GatedDeltaRuleResult& out) {
  const char* op = "gated_delta_rule (cuda)";
  const Dims d = dims_of(a);
  check_sizes(op, d);
  out.saved.reset();  // a reused result must not hand an earlier call's to the backward
  if (d.batch == 0 || d.heads == 0) return;
  use_device_of(a.q);
  if (run_tuned(
          "gated_delta_rule forward", [&] { return forward_tune_problem(a, d, out); },
          [&] { return gated_delta_rule_forward_mma(a, d, out); })) {
    return;
  }
  dispatch_floating(op, a.q.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    const auto simt = choose_simt_launch<T>(op, d, false, &gdr_forward_kernel<T>, [] {
      if constexpr (std::is_same_v<T, bf16>) return &gdr_forward_kernel<T>;
      else return &gdr_forward_kernel<T, false>;
    }());
    const int vt = simt.vt;
    const ChunkTable table = build_chunk_table(a, d.batch, d.seq_len);
    const Problem<T> pr = make_problem<T>(a, d, table, vt);
    const int64_t rows = d.batch * d.seq_len * d.heads;
    Tensor fit_part = Tensor::empty(Shape{rows * pr.tiles * 3}, compute_dtype<T>(), a.q.device());
    if (pr.tiles > 0) {
      const auto kernel = simt.kernel;  // a plain name, which the emulator looks up
      allow_dynamic_shared(op, kernel, simt.bytes);
      HAM_LAUNCH(grid_of(op, d, pr.tiles), kBlock, simt.bytes, launch_stream(), kernel)(
          pr, ptr<T>(out.o), ptr<T>(out.h_final), ptr<C>(fit_part));
      HAM_CUDA_CHECK_LAUNCH();
    }
    finish_fit_error<T>(fit_part, d, pr.tiles, out.fit_error);
  });
}

void gated_delta_rule_recurrent(const GatedDeltaRuleArgs& a, GatedDeltaRuleResult& out) {
  const char* op = "gated_delta_rule_naive (cuda)";
  const Dims d = dims_of(a);
  if (d.batch == 0 || d.heads == 0) return;
  use_device_of(a.q);
  dispatch_floating(op, a.q.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    auto run = [&]<class Index>(const Index* doc_ids) {
      const size_t limit = shared_memory_limit(gdr_recurrent_kernel<T, Index>);
      const int vt = choose_value_tile(op, d, limit, [&](int tile) {
        return RecurrentLayout(d.key_dim, tile, sizeof(C)).bytes;
      });
      const Problem<T> pr = make_problem<T>(a, d, ChunkTable{}, vt);
      const int64_t rows = d.batch * d.seq_len * d.heads;
      Tensor fit_part = Tensor::empty(Shape{rows * pr.tiles * 3}, compute_dtype<T>(), a.q.device());
      if (pr.tiles > 0) {
        const size_t bytes = RecurrentLayout(d.key_dim, vt, sizeof(C)).bytes;
        allow_dynamic_shared(op, gdr_recurrent_kernel<T, Index>, bytes);
        HAM_LAUNCH(grid_of(op, d, pr.tiles), kBlock, bytes, launch_stream(),
                   gdr_recurrent_kernel<T, Index>)(pr, doc_ids, ptr<T>(out.o), ptr<T>(out.h_final),
                                                   ptr<C>(fit_part));
        HAM_CUDA_CHECK_LAUNCH();
      }
      finish_fit_error<T>(fit_part, d, pr.tiles, out.fit_error);
    };
    if (a.doc_ids.defined()) {
      dispatch_index(op, a.doc_ids.dtype(),
                     [&]<class Index>() { run(ptr<const Index>(a.doc_ids)); });
    } else {
      run(static_cast<const int64_t*>(nullptr));
    }
  });
}


// The tensor-core backward (above) when it applies: the tensor-core forward's inputs, T > 0.
// Returns whether it ran. Recomputes the forward's W, U, S0 and v_new first (its prepare
// kernel and sequential state pass), unless the forward kept them (`saved`,
// MmaSavedChunkStates); where it kept only the chunk table and A (MmaSavedInverses), the
// prepare kernel reads A instead of forming it.
bool gated_delta_rule_backward_mma(const GatedDeltaRuleArgs& a, const Dims& d,
                                   const Tensor& grad_o, const Tensor& grad_h_final,
                                   const GatedDeltaRuleSaved* saved, GatedDeltaRuleGrads& grads) {
  if (a.q.dtype() != DType::BF16 || d.value_dim == 0 || d.seq_len == 0) return false;
  auto run = [&]<int KD>() {
    constexpr int VT = kBackwardVt<KD>;
    const char* op = "gated_delta_rule_backward (cuda, tensor cores)";
    const Device device = a.q.device();
    const int64_t K = d.key_dim, V = d.value_dim;
    const MmaSaved* kept = saved ? &saved_by_mma_forward(op, *saved, d, device) : nullptr;
    const auto* states = dynamic_cast<const MmaSavedChunkStates*>(kept);
    const int64_t rows = d.batch * d.seq_len * d.heads;
    auto scratch = [&](int64_t n, DType dtype) { return Tensor::empty(Shape{n}, dtype, device); };
    Tensor dvl = scratch(rows * V, DType::F32);  // before the recompute, which it may run beside
    const unsigned chunk_blocks = mma_chunk_blocks(d);
    const unsigned bh = unsigned(d.batch * d.heads);
    // dvl = P^T dO, from the chunk table, q, k, dO and G alone.
    auto local_pass = [&](const MmaChunkStates& chunks) {
      MmaBackward local{};
      local.grad_o = ptr<const bf16>(grad_o);
      local.gcum = ptr<const float>(chunks.gcum);
      local.dvl = ptr<float>(dvl);
      const int local_slots = d.value_dim > kMmaVt ? 2 : 1;
      launch_mma(KernelName{"gdr_bwd_local_mma", {KD}, 1}, &gdr_bwd_local_mma<KD>,
                 dim3(chunk_blocks, 1, bh),
                 BwdLocalLayout<KD>::bytes(local_slots), make_problem<bf16>(a, d, chunks.table, VT),
                 local, local_slots);
    };
    // With set_gated_delta_rule_backward_overlap, the local pass runs beside the recompute's
    // state pass, whose blocks (one per document, head and value tile: about the SMs or
    // fewer at the shapes timed) leave each SM room for two more. The state pass, the
    // backward's critical path, goes on the device's high-priority second stream, forked
    // after the prepare kernel, and the local pass stays on the current stream (the lowest
    // priority), so that the block scheduler places the state pass's blocks first and the
    // local pass's in what they leave; with equal priorities the blocks of the kernel
    // launched first take the SMs first.
    // With set_gated_delta_rule_recompute_windows (and the overlap), the recompute's state
    // pass runs in windows on that stream, each after its window's prepare kernel, and the
    // local pass beside them once every window's prepare kernel is issued (run_in_windows).
    std::optional<ForkedStream> beside;
    bool local_pass_issued = false;
    const int recompute_windows = g_recompute_windows.load();
    auto recomputed = [&] {
      Tensor h_end = Tensor::empty(Shape{d.batch * d.heads * K * V}, DType::BF16, device);
      StatePassRunner state_pass_beside;
      if (g_backward_overlap.load() && recompute_windows > 1) {
        state_pass_beside = [&](const MmaChunkStates& chunks, const PreparePass& prepare,
                                const StatePass& state_pass) {
          run_in_windows(
              device, int(std::min<int64_t>(recompute_windows, chunks.max_chunks)),
              chunks.max_chunks, d.batch * d.heads * K * V, /*reverse=*/false,
              g_windowed_recomputes, state_pass, /*after=*/nullptr,
              [&](const StateWindow& window) { prepare(window.begin, window.end); },
              [&] { local_pass(chunks); });
          local_pass_issued = true;
        };
      } else if (g_backward_overlap.load()) {
        state_pass_beside = [&](const MmaChunkStates& chunks, const PreparePass& prepare,
                                const StatePass& state_pass) {
          prepare(0, INT_MAX);
          beside.emplace(device.index, StreamPriority::High);
          local_pass(chunks);
          beside->run([&] {
            // Counted by the stream the state pass takes, not by the setting.
            if (has_greatest_priority(launch_stream())) g_overlapped_local_passes.fetch_add(1);
            state_pass(StateWindow{});
          });
        };
      }
      return chunk_states_mma<KD>(op, a, d, h_end, true,
                                  dynamic_cast<const MmaSavedInverses*>(kept), state_pass_beside);
    };
    const MmaChunkStates c = states ? states->chunk : recomputed();
    if (beside) {
      beside->join();
    } else if (!local_pass_issued) {
      local_pass(c);
    }
    const Problem<bf16> pr = make_problem<bf16>(a, d, c.table, VT);
    const int64_t max_chunks = c.max_chunks;
    const int64_t slots = d.batch * d.heads * max_chunks;
    Tensor dstates = scratch(slots * K * V, DType::BF16);
    Tensor du = scratch(rows * V, DType::BF16);
    Tensor dpg = scratch(slots * kChunk * kChunk, DType::BF16);
    Tensor da = scratch(slots * kChunk * kChunk, DType::F32);
    Tensor da_rounded = scratch(slots * kChunk * kChunk, DType::BF16);
    Tensor dw = scratch(rows * K, DType::BF16), dk_part = scratch(rows * K, DType::F32);
    Tensor row_sums = scratch(4 * rows, DType::F32), dlambda = scratch(slots, DType::F32);

    MmaBackward bw{};
    bw.grad_o = ptr<const bf16>(grad_o);
    bw.grad_h_final = ptr_or_null<const bf16>(grad_h_final);
    bw.w = ptr<const bf16>(c.w);
    bw.v_new = ptr<const bf16>(c.v_new);
    bw.states = ptr<const bf16>(c.states);
    bw.a_inv = ptr<const bf16>(c.a_inv);
    bw.dstates = ptr<bf16>(dstates);
    bw.dvl = ptr<float>(dvl);
    bw.gcum = ptr<const float>(c.gcum);
    bw.du = ptr<bf16>(du);
    bw.dpg = ptr<bf16>(dpg);
    bw.da = ptr<float>(da);
    bw.da_rounded = ptr<bf16>(da_rounded);
    bw.dw = ptr<bf16>(dw);
    bw.dk_part = ptr<float>(dk_part);
    bw.row_dbeta = ptr<float>(row_sums);
    bw.row_deo = bw.row_dbeta + rows;
    bw.row_dtau = bw.row_deo + rows;
    bw.row_zp = bw.row_dtau + rows;
    bw.chunk_dlambda = ptr<float>(dlambda);
    bw.max_chunks = max_chunks;
    bw.dq = ptr_or_null<bf16>(grads.dq);
    bw.dk = ptr_or_null<bf16>(grads.dk);
    bw.dv = ptr_or_null<bf16>(grads.dv);
    bw.dbeta = ptr_or_null<bf16>(grads.dbeta);
    bw.dh0 = a.h0.defined() ? ptr_or_null<bf16>(grads.dh0) : nullptr;
    bw.dg = grads.dg.defined() ? grads.dg.raw_data() : nullptr;
    bw.dg_f32 = grads.dg.defined() && grads.dg.dtype() == DType::F32;

    // The sequential pass over SVT-column tiles, with two slots of chunk tiles (the next
    // chunk's copies in flight) where they fit; else, with
    // set_gated_delta_rule_backward_keys_ahead, K and dvl a chunk ahead (kKeysAheadSlots).
    // On the chunks of windowed.window.
    // One slot wherever neither fits, and at K = 256 where set_gated_delta_rule_one_slot asks.
    auto state_pass = [&]<int SVT>(const MmaBackward& windowed) {
      const dim3 grid = state_pass_grid(op, d, int((d.value_dim + SVT - 1) / SVT), c.max_docs);
      const bool one_slot = KD == kOneSlotKeyDim && g_one_slot.load();
      if (!one_slot) {
        if constexpr (BwdStateLayout<KD, SVT, 2>::bytes <= 227 * 1024) {
          if (BwdStateLayout<KD, SVT, 2>::bytes <=
              shared_memory_limit(gdr_bwd_state_mma<KD, SVT, 2>)) {
            KernelName name{};
            const auto kernel = backward_state_kernel<KD, SVT, 2>(name);
            launch_kernel(name, kernel, grid, kStateWarps<KD> * 32,
                          BwdStateLayout<KD, SVT, 2>::bytes, pr, windowed);
            return;
          }
        } else if constexpr (BwdStateLayout<KD, SVT, kKeysAheadSlots>::bytes <= 227 * 1024) {
          using Ahead = BwdStateLayout<KD, SVT, kKeysAheadSlots>;
          if (g_backward_keys_ahead.load() &&
              Ahead::bytes <= shared_memory_limit(gdr_bwd_state_mma<KD, SVT, kKeysAheadSlots>)) {
            KernelName name{};
            const auto kernel = backward_state_kernel<KD, SVT, kKeysAheadSlots>(name);
            launch_kernel(name, kernel, grid, kStateWarps<KD> * 32, Ahead::bytes, pr, windowed);
            g_keys_ahead_passes.fetch_add(1);
            return;
          }
        }
      }
      KernelName name{};
      const auto kernel = backward_state_kernel<KD, SVT, 1>(name);
      g_one_slot_launches.fetch_add(1);
      launch_kernel(name, kernel, grid, kStateWarps<KD> * 32, BwdStateLayout<KD, SVT, 1>::bytes,
                    pr, windowed);
    };
    auto reverse_pass = [&](const MmaBackward& windowed) {
      if (backward_state_columns<KD, VT>(d) == 32) state_pass.template operator()<32>(windowed);
      else state_pass.template operator()<VT>(windowed);
    };
    // The values, keys and WY kernels on the chunks of windowed.window.
    auto per_chunk_passes = [&](const MmaBackward& windowed) {
      const int64_t window =
          std::min<int64_t>(windowed.window.end, max_chunks) - windowed.window.begin;
      const dim3 per_chunk(unsigned(std::min<int64_t>(chunk_blocks, window)), 1, bh);
      constexpr int kValuesVt = kBackwardValuesVt<KD>;
      launch_mma(KernelName{"gdr_bwd_values_mma", {KD, kValuesVt}, 2},
                 &gdr_bwd_values_mma<KD, kValuesVt>, per_chunk,
                 BwdValuesLayout<KD, kValuesVt>::bytes, pr, windowed);
      launch_kernel(KernelName{"gdr_bwd_keys_mma", {KD, kKeysVt}, 2},
                    &gdr_bwd_keys_mma<KD, kKeysVt>, per_chunk, kKeysWarps<KD> * 32,
                    BwdKeysLayout<KD, kKeysVt>::bytes, pr, windowed);
      launch_kernel(KernelName{"gdr_bwd_wy_mma", {KD}, 1}, &gdr_bwd_wy_mma<KD>, per_chunk,
                    kWyWarps<KD> * 32, BwdWyLayout<KD>::bytes, pr, windowed);
    };
    // set_gated_delta_rule_backward_windows: the reverse pass in windows of chunks, the
    // last window first, on a high-priority fork; the per-chunk kernels of each window on
    // the current stream once that window's pass is done, beside the pass over the window
    // before. dS crosses a window's start through `carry` in f32: the same gradients.
    const int windows = int(std::min<int64_t>(g_backward_windows.load(), max_chunks));
    if (windows <= 1) {
      reverse_pass(bw);
      per_chunk_passes(bw);
      return true;
    }
    auto in_window = [&](const StateWindow& window) {
      MmaBackward windowed = bw;
      windowed.window = window;
      return windowed;
    };
    run_in_windows(
        device, windows, max_chunks, d.batch * d.heads * K * V, /*reverse=*/true,
        g_windowed_backwards, [&](const StateWindow& window) { reverse_pass(in_window(window)); },
        [&](const StateWindow& window) { per_chunk_passes(in_window(window)); });
    return true;
  };
  return dispatch_mma_key_dim(d.key_dim, run);
}

void gated_delta_rule_backward(const GatedDeltaRuleArgs& a, const Tensor& grad_o,
                               const Tensor& grad_h_final, const GatedDeltaRuleSaved* saved,
                               GatedDeltaRuleGrads& grads) {
  const char* op = "gated_delta_rule_backward (cuda)";
  const Dims d = dims_of(a);
  check_sizes(op, d);
  if (d.batch == 0 || d.heads == 0) return;
  use_device_of(a.q);
  auto problem = [&] {
    return backward_tune_problem(a, d, !dynamic_cast<const MmaSavedChunkStates*>(saved), grads);
  };
  if (run_tuned("gated_delta_rule backward", problem, [&] {
        return gated_delta_rule_backward_mma(a, d, grad_o, grad_h_final, saved, grads);
      })) {
    return;
  }
  // Only the tensor-core forward keeps anything, and its inputs take the path above.
  HAM_CHECK(saved == nullptr, op, ": given a saved forward state, which the SIMT kernels "
            "these inputs take do not use (only the bf16 tensor-core path keeps one)");
  dispatch_floating(op, a.q.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    const Device device = a.q.device();
    const auto simt = choose_simt_launch<T>(op, d, true, &gdr_backward_kernel<T>, [] {
      if constexpr (std::is_same_v<T, bf16>) return &gdr_backward_kernel<T>;
      else return &gdr_backward_kernel<T, false>;
    }());
    const int vt = simt.vt;
    const ChunkTable table = build_chunk_table(a, d.batch, d.seq_len);
    const Problem<T> pr = make_problem<T>(a, d, table, vt);
    const int64_t rows = d.batch * d.seq_len * d.heads;
    const int64_t max_chunks =
        pr.tiles > 0 ? max_chunk_counts(a, table, d.batch, d.seq_len).chunks : 0;
    const int64_t blocks = d.batch * d.heads * pr.tiles;
    const DType cd = compute_dtype<T>();
    Tensor checkpoints = Tensor::empty(Shape{blocks * max_chunks * d.key_dim * vt}, cd, device);
    auto part = [&](bool want, int64_t width) {
      return want ? Tensor::empty(Shape{pr.tiles * rows * width}, cd, device) : Tensor();
    };
    Tensor dq_part = part(grads.dq.defined(), d.key_dim);
    Tensor dk_part = part(grads.dk.defined(), d.key_dim);
    Tensor dg_part = part(grads.dg.defined(), 1);
    Tensor dbeta_part = part(grads.dbeta.defined(), 1);
    if (pr.tiles > 0) {
      BackwardOut<T> bo;
      bo.grad_o = ptr<const T>(grad_o);
      bo.grad_h_final = ptr<const T>(grad_h_final);
      bo.checkpoints = ptr<C>(checkpoints);
      bo.max_chunks = max_chunks;
      bo.dv = ptr_or_null<T>(grads.dv);
      bo.dh0 = ptr_or_null<T>(grads.dh0);
      bo.dq_part = ptr_or_null<C>(dq_part);
      bo.dk_part = ptr_or_null<C>(dk_part);
      bo.dg_part = ptr_or_null<C>(dg_part);
      bo.dbeta_part = ptr_or_null<C>(dbeta_part);
      const auto kernel = simt.kernel;  // a plain name, which the emulator looks up
      allow_dynamic_shared(op, kernel, simt.bytes);
      HAM_LAUNCH(grid_of(op, d, pr.tiles), kBlock, simt.bytes, launch_stream(), kernel)(
          pr, bo);
      HAM_CUDA_CHECK_LAUNCH();
    }
    // k-side gradients: the tiles' partial sums added in tile order (zeros when V = 0).
    auto finish = [&](const Tensor& partial, Tensor& grad) {
      if (!grad.defined() || grad.numel() == 0) return;
      HAM_LAUNCH(grid_for(grad.numel()), kThreads, 0, launch_stream(), sum_tiles_kernel<T, C>)(
          pr.tiles > 0 ? ptr<const C>(partial) : nullptr, grad.numel(), pr.tiles, ptr<T>(grad));
      HAM_CUDA_CHECK_LAUNCH();
    };
    finish(dq_part, grads.dq);
    finish(dk_part, grads.dk);
    // f32 gates (mixed precision, bf16 inputs only: gated_delta_rule's check): dg stays f32.
    const bool f32_gates = grads.dg.defined() && grads.dg.dtype() == DType::F32 &&
                           std::is_same_v<T, __nv_bfloat16>;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (f32_gates && grads.dg.numel() > 0) {
        HAM_LAUNCH(grid_for(grads.dg.numel()), kThreads, 0, launch_stream(),
                   sum_tiles_kernel<float, C>)(
            pr.tiles > 0 ? ptr<const C>(dg_part) : nullptr, grads.dg.numel(), pr.tiles,
            ptr<float>(grads.dg));
        HAM_CUDA_CHECK_LAUNCH();
      }
    }
    if (!f32_gates) finish(dg_part, grads.dg);
    finish(dbeta_part, grads.dbeta);
  });
}

const bool registered = [] {
  gated_delta_rule_chunked_kernels().register_kernel(DeviceKind::CUDA, &gated_delta_rule_chunked);
  gated_delta_rule_naive_kernels().register_kernel(DeviceKind::CUDA, &gated_delta_rule_recurrent);
  gated_delta_rule_backward_kernels().register_kernel(DeviceKind::CUDA, &gated_delta_rule_backward);
  return true;
}();

}  // namespace

int set_gated_delta_rule_state_columns(int columns) {
  HAM_CHECK(columns == 0 || columns == 32 || columns == 64,
            "set_gated_delta_rule_state_columns: ", columns,
            " value columns per block; the state pass takes 32 or 64 (0: chosen per call)");
  return g_state_columns.exchange(columns);
}

int64_t gated_delta_rule_kept_inverse_reads() { return g_kept_inverse_reads.load(); }

bool set_gated_delta_rule_backward_keys_ahead(bool ahead) {
  return g_backward_keys_ahead.exchange(ahead);
}

int64_t gated_delta_rule_keys_ahead_passes() { return g_keys_ahead_passes.load(); }

int set_gated_delta_rule_state_partial_sums(int parts) {
  HAM_CHECK(parts == 1 || parts == 2, "set_gated_delta_rule_state_partial_sums: ", parts,
            " partial sums; the state passes take 1 or 2");
  return g_state_partial_sums.exchange(parts);
}

int64_t gated_delta_rule_partial_sum_passes() { return g_partial_sum_passes.load(); }

int set_gated_delta_rule_prepare_warps(int warps) {
  HAM_CHECK(warps == 4 || warps == 8, "set_gated_delta_rule_prepare_warps: ", warps,
            " warps; the prepare kernel takes 4 or 8");
  return g_prepare_warps.exchange(warps);
}

int64_t gated_delta_rule_eight_warp_prepares() { return g_eight_warp_prepares.load(); }

namespace {
int exchange_window_count(std::atomic<int>& setting, const char* setter, int windows) {
  HAM_CHECK(windows >= 1 && windows <= kMaxStatePassWindows, setter, ": ", windows,
            " windows; expected 1 to ", kMaxStatePassWindows);
  return setting.exchange(windows);
}
}  // namespace

int set_gated_delta_rule_forward_windows(int windows) {
  return exchange_window_count(g_forward_windows, "set_gated_delta_rule_forward_windows",
                               windows);
}

int64_t gated_delta_rule_windowed_forwards() { return g_windowed_forwards.load(); }

bool set_gated_delta_rule_forward_prepare_windows(bool in_windows) {
  return g_forward_prepare_windows.exchange(in_windows);
}

int64_t gated_delta_rule_windowed_prepares() { return g_windowed_prepares.load(); }

int set_gated_delta_rule_output_prefetch(int blocks) {
  HAM_CHECK(blocks >= -1, "set_gated_delta_rule_output_prefetch: ", blocks,
            "; takes 0 (off), -1 (about one wave of blocks) or the blocks a row");
  return g_output_prefetch.exchange(blocks);
}

int64_t gated_delta_rule_prefetching_output_passes() {
  return g_prefetching_output_passes.load();
}

int set_gated_delta_rule_recompute_windows(int windows) {
  return exchange_window_count(g_recompute_windows, "set_gated_delta_rule_recompute_windows",
                               windows);
}

int64_t gated_delta_rule_windowed_recomputes() { return g_windowed_recomputes.load(); }

int set_gated_delta_rule_backward_windows(int windows) {
  return exchange_window_count(g_backward_windows, "set_gated_delta_rule_backward_windows",
                               windows);
}

int64_t gated_delta_rule_windowed_backwards() { return g_windowed_backwards.load(); }

bool set_gated_delta_rule_backward_overlap(bool overlap) {
  return g_backward_overlap.exchange(overlap);
}

int64_t gated_delta_rule_overlapped_local_passes() { return g_overlapped_local_passes.load(); }

bool set_gated_delta_rule_one_slot(bool one_slot) { return g_one_slot.exchange(one_slot); }

int64_t gated_delta_rule_one_slot_launches() { return g_one_slot_launches.load(); }

std::vector<GatedDeltaRuleChunkTableRow> gated_delta_rule_chunk_table(const Tensor& doc_ids,
                                                                      int64_t batch,
                                                                      int64_t seq_len) {
  HAM_CHECK(doc_ids.defined(), "gated_delta_rule_chunk_table: no doc_ids (without them the ",
            "kernels build no table)");
  const ChunkTable table = build_chunk_table(doc_ids, batch, seq_len);
  const Tensor begin = table.begin.to(Device::cpu()), doc_start = table.doc_start.to(Device::cpu());
  const Tensor doc_chunk = table.doc_chunk.to(Device::cpu()), count = table.count.to(Device::cpu());
  std::vector<GatedDeltaRuleChunkTableRow> rows(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t chunks = count.data<int32_t>()[b], docs = count.data<int32_t>()[batch + b];
    HAM_CHECK(chunks >= 0 && chunks <= seq_len && docs >= 0 && docs <= chunks,
              "gated_delta_rule_chunk_table: row ", b, " counts ", chunks, " chunks and ", docs,
              " documents for ", seq_len, " tokens");
    const int64_t row = b * (seq_len + 1);
    const int32_t* begins = begin.data<int32_t>() + row;
    rows[size_t(b)].chunk_begin.assign(begins, begins + chunks + 1);
    const int32_t* starts = doc_start.data<int32_t>() + row;
    rows[size_t(b)].chunk_doc_start.assign(starts, starts + chunks);
    const int32_t* firsts = doc_chunk.data<int32_t>() + row;
    rows[size_t(b)].doc_chunk.assign(firsts, firsts + docs + 1);
  }
  return rows;
}

}  // namespace ham::cuda

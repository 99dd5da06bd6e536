// CUDA kernels of core/ops/routed_attention.h (the math and CompactSelection are there; the
// CPU kernels in core/cpu/routed_attention.cpp are the reference these match).
//
// Compaction (no host round trip; three kernels per call):
//   1. with doc_ids: every token finds the first position of its document through a
//      per-row open-addressing hash table whose slots hold token indices (a slot's key is
//      the document of the token it holds; atomicCAS claims, atomicMin keeps the first).
//   2. one block per batch row (compact_rows): where every document is one run of tokens
//      (packed documents, or none), a key's slot is the row's exclusive prefix sum of
//      select, one block-wide scan; where documents interleave, per-document counts of
//      selected keys (integer atomics, so exact), a scan over documents in order of first
//      appearance, then one warp walks the row 32 tokens at a time: __match_any_sync groups
//      the lanes of one document, the rank of a selected lane among them gives its slot.
//      Either way slots are stable (ascending inside a document) -> key_positions,
//      visible_begin, visible_end. The per-token counters live in shared memory when the
//      row fits, in a global scratch row otherwise.
//
// Forward, tiled (f32 and bf16, head dims Dk in {64, 128, 256}, Dv in {64, 128, 192, 256}):
//   one block of 256 threads per (query tile of 64, query head, batch row). The block
//   visits only the compacted keys [min begin, max end) of its rows, in key tiles of 64
//   (32 when a head dim exceeds 128) staged in shared memory (k, and v' = p v scaled in
//   the load); scores and the online softmax are fp32; the per-element visibility test
//   runs only on tiles that are not inside every row's range (tile boundaries, document
//   boundaries, rows past T). Rows with no visible key write o = 0 and lse = -inf.
//   Thread (ty, tx) of a 16 x 16 grid owns rows ty + 16 i and columns tx + 16 j of every
//   product, so a row's reductions stay inside one half-warp.
//
// Backward, tiled, deterministic (no float atomics anywhere):
//   D = rowsum(dO * o), and zeros for the gradients of unselected keys (backward_prologue,
//   one warp per token; the wgmma dQ kernel forms D itself, and where
//   set_attention_backward_zeros_in_dq the zeros too, so that no such pass runs);
//   dK/dV' pass: one block per (key tile of 64 compacted keys, kv head, batch row); it
//     loops over the query heads of its group and over the query tiles at or after its
//     first key's position, skipping tiles none of whose rows see it, and accumulates
//     dk, dv' in registers; then writes dk, dv = p dv' to the keys' original positions
//     (the rest was zeroed) and the per-kv-head share <dv'_g, v_g> of dp to a scratch
//     buffer, which a last kernel sums over kv heads in order and scatters.
//   dQ pass: one block per (query tile, query head, batch row), over the same key tiles
//     as the forward.
//
// Tensor-core kernels (bf16 with 16-byte aligned q, k, v, dO; the same head dims): the
// forward, dQ and dK/dV passes above with the products on mma.sync (cuda/mma.cuh),
// flash-attention-2 style, the dK/dV pass as two kernels where Dk + Dv > 320 (KeyGrads);
// see their section. Other bf16 calls take the tiled kernels.
//
// Persistent forward and dQ kernels (where set_attention_forward_persistent and
// set_attention_backward_dq_persistent ask; one warpgroup, head dims 64 and 128): as many
// blocks as the SMs hold, each taking query tiles of 64 rows in turn and issuing the next
// tile's copies under the current tile's last products and epilogue
// (forward_wgmma_persistent, backward_dq_wgmma_persistent).
// The dK/dV kernel's persistent form (set_attention_backward_dkdv_persistent) takes key
// tiles in turn, the next tile's positions loaded and its K and V prefetched into L2 under
// the current tile (backward_dkdv_wgmma_persistent).
//
// Generic kernels (any head dims, f64 too; also used when a tiled instance would not fit
// the device's shared memory): one warp per query row (forward, dq) or per compacted key
// and kv head (dk, dv'), plain loops over exactly the visible pairs; the dk/dv' one scans
// every later query, so it costs O(T^2) per key head and exists to be obviously right.
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>

#include "core/ops/routed_attention.h"
#include "cuda/autotune.h"
#include "cuda/routed_attention.h"
#include "cuda/async_copy.cuh"
#include "cuda/block_timeline.h"
#include "cuda/dependent_launch.h"
#include "cuda/launch.h"
#include "cuda/mma_tiles.cuh"
#include "cuda/stream.h"
#include "cuda/wgmma.cuh"

namespace ham::cuda {

namespace {

constexpr const char* kOp = "routed_attention";
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return ::log(x); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Compaction ---------------------------------------------------------------------

__device__ __forceinline__ uint64_t mix_bits(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Slots of row b: table[b * table_size + s] = -1 (empty) or a token index whose document
// is the slot's key; ends holding the first token of that document. Only the first token
// of each run of a document inserts (a token whose predecessor has its document is not the
// document's first), so packed documents contend for a slot once each.
template <class I>
__global__ void insert_first_positions(const I* docs, int64_t batch, int64_t seq_len, int* table,
                                       int64_t table_size) {
  begin_dependent_kernel();
  HAM_GRID_STRIDE_LOOP(n, batch * seq_len) {
    const int64_t b = n / seq_len;
    const int t = int(n % seq_len);
    const I doc = docs[n];
    if (t > 0 && docs[n - 1] == doc) continue;
    const I* row_docs = docs + b * seq_len;
    int* slots = table + b * table_size;
    int64_t s = int64_t(mix_bits(uint64_t(int64_t(doc))) & uint64_t(table_size - 1));
    while (true) {
      const int owner = atomicCAS(&slots[s], -1, t);
      if (owner == -1) break;  // claimed an empty slot
      if (row_docs[owner] == doc) {  // the document's slot: keep its first token
        atomicMin(&slots[s], t);
        break;
      }
      s = (s + 1) & (table_size - 1);
    }
  }
}

// first[n] = first position of token n's document in its row.
template <class I>
__global__ void lookup_first_positions(const I* docs, int64_t batch, int64_t seq_len,
                                       const int* table, int64_t table_size, int* first) {
  begin_dependent_kernel();
  HAM_GRID_STRIDE_LOOP(n, batch * seq_len) {
    const int64_t b = n / seq_len;
    const I doc = docs[n];
    const I* row_docs = docs + b * seq_len;
    const int* slots = table + b * table_size;
    int64_t s = int64_t(mix_bits(uint64_t(int64_t(doc))) & uint64_t(table_size - 1));
    while (true) {
      const int owner = slots[s];
      if (owner < 0) __trap();  // cannot happen: every document was inserted on this path
      if (row_docs[owner] == doc) {
        first[n] = owner;
        break;
      }
      s = (s + 1) & (table_size - 1);
    }
  }
}

constexpr int kCompactThreads = 1024;
constexpr int kScanTokens = 4;  // tokens a thread a step of compact_rows' scan of select

// Block-wide exclusive prefix sum of one value a thread, for rows longer than the block
// taken a block at a time: returns the thread's exclusive sum plus `carry`, the total of
// the earlier blocks, which it then advances by this block's total. All threads call it.
__device__ int block_exclusive_scan(int x, int& carry, int* warp_prefix) {
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int warps = int(blockDim.x / 32);
  int inclusive = x;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int y = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += y;
  }
  if (lane == 31) warp_prefix[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < warps ? warp_prefix[lane] : 0;
    int scanned = w;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int y = __shfl_up_sync(kFullMask, scanned, offset);
      if (lane >= offset) scanned += y;
    }
    if (lane < warps) warp_prefix[lane] = scanned - w;
  }
  __syncthreads();
  const int exclusive = carry + warp_prefix[warp] + inclusive - x;
  __syncthreads();  // carry and warp_prefix are read by all before being rewritten
  if (threadIdx.x == blockDim.x - 1) carry = exclusive + x;
  __syncthreads();
  return exclusive;
}

// One block per batch row. first == nullptr: the whole row is one document.
// Where each document is one run of tokens (first[t] is t or first[t - 1]: packed
// documents, or none), a document's slots follow the slots of every earlier token, so a
// key's slot is the row's exclusive prefix sum of select at it: one scan. Otherwise
// (documents that interleave) slots are counted per document, then handed out in token
// order by one warp.
__global__ void __launch_bounds__(kCompactThreads)
    compact_rows(const uint8_t* select, const int* first, int64_t seq_len, bool counter_in_shared,
                 int* counter_scratch, int64_t* positions, int64_t* counts, int64_t* begin,
                 int64_t* end) {
  begin_dependent_kernel();
  HAM_DYNAMIC_SHARED(int, shared_counter);
  HAM_STATIC_SHARED(int, warp_prefix, [32]);
  HAM_STATIC_SHARED(int, carry);
  const int64_t b = blockIdx.x, row = b * seq_len;
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  // counter[f]: indexed by a document's first position f.
  int* counter = counter_in_shared ? shared_counter : counter_scratch + row;
  auto group_of = [&](int64_t t) { return first ? first[row + t] : 0; };
  if (threadIdx.x == 0) carry = 0;

  // The row walks below take kScanTokens consecutive tokens a thread a step, loading them
  // all before using any.
  const int64_t step = int64_t(blockDim.x) * kScanTokens;
  const int64_t own = int64_t(threadIdx.x) * kScanTokens;  // the thread's first token
  bool interleaved = false;
  if (first) {  // some token's document neither starts at it nor continues the one before
    for (int64_t t0 = own; t0 < seq_len; t0 += step) {
      int f[kScanTokens + 1];  // f[i]: the first position of token t0 - 1 + i's document
#pragma unroll
      for (int i = 0; i <= kScanTokens; ++i) {
        const int64_t t = t0 - 1 + i;
        f[i] = t >= 0 && t < seq_len ? first[row + t] : -1;
      }
#pragma unroll
      for (int i = 1; i <= kScanTokens; ++i) {
        const int64_t t = t0 - 1 + i;
        if (t > 0 && t < seq_len && f[i] != t && f[i] != f[i - 1]) interleaved = true;
      }
    }
  }
  interleaved = __syncthreads_or(interleaved);
  if (!interleaved) {
    // counter[t] <- keys selected before t; a key's slot, and the next one its row's end.
    // The next step's selections are loaded before this step's scan, so that a step's
    // barriers do not wait on global memory.
    auto load_selections = [&](int64_t t0, int (&x)[kScanTokens]) {
#pragma unroll
      for (int i = 0; i < kScanTokens; ++i) {
        x[i] = t0 + i < seq_len && select[row + t0 + i] ? 1 : 0;
      }
    };
    int next[kScanTokens];
    load_selections(own, next);
    for (int64_t base = 0; base < seq_len; base += step) {
      int x[kScanTokens], selected = 0;
#pragma unroll
      for (int i = 0; i < kScanTokens; ++i) {
        x[i] = next[i];
        selected += x[i];
      }
      if (base + step < seq_len) load_selections(base + step + own, next);
      int slot = block_exclusive_scan(selected, carry, warp_prefix);
#pragma unroll
      for (int i = 0; i < kScanTokens; ++i) {
        const int64_t t = base + own + i;
        if (t < seq_len) {
          counter[t] = slot;
          end[row + t] = slot + x[i];
          if (x[i]) positions[row + slot] = t;
        }
        slot += x[i];
      }
    }
  } else {
    for (int64_t t = threadIdx.x; t < seq_len; t += blockDim.x) counter[t] = 0;
    __syncthreads();
    for (int64_t t = threadIdx.x; t < seq_len; t += blockDim.x) {
      if (select[row + t]) atomicAdd(&counter[group_of(t)], 1);
    }
    __syncthreads();
    // counter <- exclusive prefix sum over f: the first slot of each document.
    for (int64_t base = 0; base < seq_len; base += blockDim.x) {
      const int64_t t = base + threadIdx.x;
      const int x = t < seq_len ? counter[t] : 0;
      const int exclusive = block_exclusive_scan(x, carry, warp_prefix);
      if (t < seq_len) counter[t] = exclusive;
    }
  }
  __syncthreads();
  const int total = carry;
  // A document's first slot: the keys before its first token (either way).
  for (int64_t t0 = own; t0 < seq_len; t0 += step) {
    int group[kScanTokens];
#pragma unroll
    for (int i = 0; i < kScanTokens; ++i) group[i] = t0 + i < seq_len ? group_of(t0 + i) : 0;
#pragma unroll
    for (int i = 0; i < kScanTokens; ++i) {
      if (t0 + i < seq_len) begin[row + t0 + i] = counter[group[i]];
    }
  }
  __syncthreads();

  // Interleaved documents: slots in token order; counter[f] becomes document f's next free
  // slot.
  if (interleaved && warp == 0) {
    for (int64_t base = 0; base < seq_len; base += 32) {
      const int64_t t = base + lane;
      const bool valid = t < seq_len;
      const int group = valid ? group_of(t) : -1;
      const bool selected = valid && select[row + t] != 0;
      const unsigned peers = __match_any_sync(kFullMask, group);
      const unsigned chosen = __ballot_sync(kFullMask, selected) & peers;
      const int rank = __popc(chosen & ((1u << lane) - 1u));
      const int slot0 = valid ? counter[group] : 0;
      if (valid) {
        if (selected) positions[row + slot0 + rank] = t;
        end[row + t] = slot0 + rank + (selected ? 1 : 0);
      }
      __syncwarp();
      if (valid && lane == 31 - __clz(int(peers))) counter[group] = slot0 + __popc(chosen);
      __syncwarp();
    }
  }
  for (int64_t j = total + threadIdx.x; j < seq_len; j += blockDim.x) positions[row + j] = -1;
  if (threadIdx.x == 0) counts[b] = total;
}

void compact_selection(const Tensor& select, const Tensor& doc_ids, CompactSelection& out) {
  const int64_t batch = select.size(0), seq_len = select.size(1);
  if (batch == 0 || seq_len == 0) {
    if (batch > 0) {
      use_device_of(select);
      HAM_CUDA_CHECK(cudaMemsetAsync(ptr<int64_t>(out.key_counts), 0, size_t(batch) * 8,
                                     launch_stream()));
    }
    return;
  }
  HAM_CHECK(seq_len < (int64_t(1) << 30), kOp, ": sequence length ", seq_len,
            " too long for the CUDA compaction");
  HAM_CHECK(batch < (int64_t(1) << 31), kOp, ": batch ", batch, " exceeds the grid");
  use_device_of(select);
  const Device device = select.device();
  cudaStream_t stream = launch_stream();
  Tensor first;
  if (doc_ids.defined()) {
    int64_t table_size = 1;
    while (table_size < 2 * seq_len) table_size <<= 1;
    Tensor table = Tensor::empty(Shape{batch, table_size}, DType::I32, device);
    HAM_CUDA_CHECK(cudaMemsetAsync(ptr<int>(table), 0xff, size_t(batch * table_size) * 4, stream));
    first = Tensor::empty(Shape{batch, seq_len}, DType::I32, device);
    dispatch_index(kOp, doc_ids.dtype(), [&]<class I>() {
      const unsigned blocks = grid_for(batch * seq_len);
      HAM_LAUNCH_DEPENDENT(blocks, kThreads, 0, stream, insert_first_positions<I>)(
          ptr<const I>(doc_ids), batch, seq_len, ptr<int>(table), table_size);
      HAM_CUDA_CHECK_LAUNCH();
      HAM_LAUNCH_DEPENDENT(blocks, kThreads, 0, stream, lookup_first_positions<I>)(
          ptr<const I>(doc_ids), batch, seq_len, ptr<const int>(table), table_size, ptr<int>(first));
      HAM_CUDA_CHECK_LAUNCH();
    });
  }
  const size_t counter_bytes = size_t(seq_len) * sizeof(int);
  const size_t shared_limit = std::min<size_t>(max_shared_per_block() - 1024, 160 * 1024);
  const bool in_shared = counter_bytes <= shared_limit;
  Tensor scratch;
  if (!in_shared) scratch = Tensor::empty(Shape{batch, seq_len}, DType::I32, device);
  const size_t dynamic = in_shared ? counter_bytes : 0;
  allow_dynamic_shared(kOp, compact_rows, dynamic);
  HAM_LAUNCH_DEPENDENT(unsigned(batch), kCompactThreads, dynamic, stream, compact_rows)(
      ptr<const uint8_t>(select), first.defined() ? ptr<const int>(first) : nullptr, seq_len,
      in_shared, scratch.defined() ? ptr<int>(scratch) : nullptr, ptr<int64_t>(out.key_positions),
      ptr<int64_t>(out.key_counts), ptr<int64_t>(out.visible_begin), ptr<int64_t>(out.visible_end));
  HAM_CUDA_CHECK_LAUNCH();
}

// ---- Shared arguments ----------------------------------------------------------------

// The compacted keys the rows of one tile of kQueryTileRows queries see, together: the
// least begin and the greatest end over its rows that see a key (begin INT_MAX, end 0 where
// none does). Written by summarize_query_tiles for the dK/dV kernels' query bound.
constexpr int kQueryTileRows = 64;
struct alignas(8) QueryTileRange {
  int begin, end;
};

// A query tile's keys as a dQ block of kQueryTileRows rows starts on them, written by
// summarize_query_tiles where set_attention_backward_dq_records asks: the union [lo, hi)
// and the intersection [full_lo, full_hi) of its rows' visible ranges, as load_query_ranges
// forms them (rows past T count as empty ranges at 0), and the positions of compacted keys
// lo, lo + 1, ... (-1 at or past hi). From it a block issues its first key tile's copies
// after one load, where from its rows it waits for their ranges, two barriers and then the
// positions (query_block_from_record).
constexpr int kRecordKeys = 64;
struct alignas(16) QueryTileKeys {
  int lo, hi, full_lo, full_hi;
  int first_positions[kRecordKeys];
};

template <class T>
struct AttentionArgs {
  using C = compute_t<T>;
  const T *q, *k, *v;
  const T* p;  // value_scale or nullptr
  const int64_t *positions, *counts, *begin, *end;
  int64_t batch, seq_len, q_heads, kv_heads, key_dim, value_dim;
  C scale;
  // forward
  T* out;
  C* lse;
  // backward (lse above is read)
  const T* dout;
  const C* delta;       // [B, T, Hq] = <dO, o>
  C* delta_out;         // the same buffer where the dQ kernel forms D (row_deltas), else null
  T *dq, *dk, *dv;
  C* dp_partial;        // [B, Hkv, T] per kv head, compacted key order; nullptr without p
  const QueryTileRange* query_tiles;  // [B, ceil(T / kQueryTileRows)]
  const QueryTileKeys* query_tile_keys;  // the same tiles' keys, or null (not formed)
  // [B, ceil(T / key_tile_order_rows)]: the key tile a dK/dV block of each rank takes
  // (order_key_tiles_by_work), or null: the rank's own (key_block_tile).
  const int* key_tile_order = nullptr;
  int key_tile_order_rows = 0;
  // The dK/dV wgmma kernel's prologue may run before its griddepcontrol.wait: the host sets
  // it where the kernel just ahead on the stream is the dQ pass or the dK half of a split
  // pass, neither of which writes what that prologue reads (backward_dkdv_wgmma).
  bool key_prologue_before_wait = false;
  // Where set (set_attention_backward_zeros_in_dq), the wgmma dQ blocks write the zero
  // gradients of the keys not selected (UnselectedRows), dp's into dp_zeros ([B, T], null
  // without value scales), and the backward runs no first pass.
  bool zero_unselected = false;
  T* dp_zeros = nullptr;
  // The launch's block stamps while recording (cuda/block_timeline.h), else null.
  BlockStamps* timeline = nullptr;

  __device__ int64_t group() const { return q_heads / kv_heads; }
  __device__ int64_t q_index(int64_t b, int64_t t, int64_t h) const {
    return (b * seq_len + t) * q_heads + h;
  }
  __device__ int64_t kv_index(int64_t b, int64_t i, int64_t g) const {
    return (b * seq_len + i) * kv_heads + g;
  }
};

// One past the last query row that may see the compacted keys [k0, k_end) of batch row b:
// the end of the last tile of kQueryTileRows rows, from first_query's on, whose summary
// (query_tiles) meets them; first_query where none does. The dK/dV kernels visit the query
// tiles up to it. With packed documents that is the end of the keys' last document: before,
// they visited every tile to T and skipped the unseen ones one by one, two barriers and a
// dependent load each. Collective over the block.
template <class T>
__device__ int64_t visible_rows_end(const AttentionArgs<T>& a, int64_t b, int k0, int k_end,
                                    int first_query) {
  HAM_STATIC_SHARED(int, last_tile);
  const int64_t tiles = (a.seq_len + kQueryTileRows - 1) / kQueryTileRows;
  const QueryTileRange* row_tiles = a.query_tiles + b * tiles;
  int last = -1;
  for (int64_t j = first_query / kQueryTileRows + int64_t(threadIdx.x); j < tiles;
       j += blockDim.x) {
    const QueryTileRange range = row_tiles[j];
    if (range.begin < k_end && range.end > k0) last = int(j);
  }
  if (threadIdx.x == 0) last_tile = -1;
  __syncthreads();
  if (last >= 0) atomicMax(&last_tile, last);
  __syncthreads();
  const int tile = last_tile;
  return tile < 0 ? int64_t(first_query)
                  : std::min(a.seq_len, int64_t(tile + 1) * kQueryTileRows);
}

// ---- Block order ---------------------------------------------------------------------

// The tiled and tensor-core kernels run a block per (tile of rows, head, batch row) on a
// one-dimensional grid, longest first. Causal work varies with the tile: a query tile's
// grows with its rows (forward, dQ), a key tile's shrinks with its first key (dK/dV).
// Blocks start in launch order, so with the tile outermost and the head and batch row
// innermost, every head's heaviest tiles start first and the lightest fill the last wave.
// (With the tile innermost, as before, the last heads' heaviest tiles started last: in a
// list-scheduling model, scripts/attention_block_order.py, 16% over the ideal time at
// T = 16384, 16 heads, 128-row forward blocks and 264 block slots; 0.5% in this order.)
struct BlockTile {
  int64_t tile, head, batch;
};

// The tile of kRows rows, head and batch row of the block of rank `block` on a grid of
// block_grid(seq_len, kRows, heads, batch) (this block's where not given): ranks count from
// the last tile (last_first) or from the first.
template <int kRows>
__device__ __forceinline__ BlockTile block_tile(int64_t seq_len, int64_t heads, int64_t batch,
                                                bool last_first, uint32_t block = blockIdx.x) {
  const int64_t tiles = (seq_len + kRows - 1) / kRows;
  const uint32_t lanes = uint32_t(heads * batch), rank = block / lanes;
  const uint32_t lane = block - rank * lanes;
  return {last_first ? tiles - 1 - rank : rank, lane % uint32_t(heads), lane / uint32_t(heads)};
}

// The key tile, head and batch row of a dK/dV block of kRows keys: block_tile's, or where
// the backward ordered the key tiles by their work (set_attention_backward_key_order), the
// tile order_key_tiles_by_work placed at the block's rank of its batch row.
// (block_rank: this block's where not given; the persistent dK/dV kernel gives its ranks.)
template <int kRows, class T>
__device__ __forceinline__ BlockTile key_block_tile(const AttentionArgs<T>& a,
                                                    uint32_t block_rank = blockIdx.x) {
  BlockTile block = block_tile<kRows>(a.seq_len, a.kv_heads, a.batch, false, block_rank);
  if (a.key_tile_order != nullptr) {
    if (a.key_tile_order_rows != kRows) __trap();  // cannot happen: ordered for these rows
    const int64_t tiles = (a.seq_len + kRows - 1) / kRows;
    block.tile = a.key_tile_order[block.batch * tiles + block.tile];
  }
  return block;
}

// ---- Tiled kernels (f32 compute) -------------------------------------------------------

constexpr int kTileThreads = 256;  // a 16 x 16 grid of threads

__device__ __forceinline__ float half_warp_max(float v) {
  for (int offset = 8; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
__device__ __forceinline__ float half_warp_sum(float v) {
  for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// acc[i][j] = sum_d A[ty + 16 i][d] * B[tx + 16 j][d]: the register tile of thread (ty, tx)
// of A B^T, for A and B held as rows of D values in shared memory with a padded stride of
// D + 1 (no bank conflicts down a column).
template <int RA, int RB, int D>
__device__ __forceinline__ void tile_row_dots(const float* A, const float* B, int ty, int tx,
                                              float (&acc)[RA][RB]) {
#pragma unroll
  for (int i = 0; i < RA; ++i)
#pragma unroll
    for (int j = 0; j < RB; ++j) acc[i][j] = 0.f;
#pragma unroll 4
  for (int d = 0; d < D; ++d) {
    float av[RA], bv[RB];
#pragma unroll
    for (int i = 0; i < RA; ++i) av[i] = A[(ty + 16 * i) * (D + 1) + d];
#pragma unroll
    for (int j = 0; j < RB; ++j) bv[j] = B[(tx + 16 * j) * (D + 1) + d];
#pragma unroll
    for (int i = 0; i < RA; ++i)
#pragma unroll
      for (int j = 0; j < RB; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

template <int DK, int DV>
struct TileShape {
  static constexpr bool kLarge = DK > 128 || DV > 128;
  // forward and dQ: 64 queries, key tiles of kKeys; dK/dV: 64 keys, query tiles of kQueries
  static constexpr int kQueries = kLarge ? 32 : 64;
  static constexpr int kKeys = kLarge ? 32 : 64;
  static constexpr size_t forward_bytes =
      size_t(64 * (DK + 1) + kKeys * (DK + 1) + kKeys * (DV + 1) + 64 * (kKeys + 1)) * 4;
  static constexpr size_t dq_bytes = size_t(64 * (DK + 1) + 64 * (DV + 1) + kKeys * (DK + 1) +
                                            kKeys * (DV + 1) + 64 * (kKeys + 1)) *
                                     4;
  static constexpr size_t dkdv_bytes = size_t(64 * (DK + 1) + 64 * (DV + 1) +
                                              kQueries * (DK + 1) + kQueries * (DV + 1) +
                                              2 * 64 * (kQueries + 1)) *
                                       4;
};

// Reads the visible ranges of query rows [q0, q0 + BQ) into s_begin / s_end (empty past
// T) and their union [lo, hi) plus intersection [full_lo, full_hi), a row a thread of the
// block's kThreads. between() runs once the ranges' loads are issued and before their
// values are used: the tensor-core kernels issue their query rows' copies there, so that
// the copies wait neither for these loads nor for the key positions' after them.
struct NothingBetween {
  __device__ void operator()() const {}
};
template <class T, int BQ, int kThreads, class Between = NothingBetween>
__device__ void load_query_ranges(const AttentionArgs<T>& a, int64_t b, int64_t q0, int* s_begin,
                                  int* s_end, int* bounds, Between between = {}) {
  static_assert(BQ <= kThreads, "a thread per query row");
  if (threadIdx.x == 0) {
    bounds[0] = INT_MAX;
    bounds[1] = 0;
    bounds[2] = 0;
    bounds[3] = INT_MAX;
  }
  const int r = int(threadIdx.x);
  const int64_t t = q0 + r;
  const bool row = r < BQ && t < a.seq_len;
  const int64_t lo_at = row ? a.begin[b * a.seq_len + t] : 0;
  const int64_t hi_at = row ? a.end[b * a.seq_len + t] : 0;
  between();
  __syncthreads();  // bounds initialised
  if (r < BQ) {
    const int lo = int(lo_at), hi = int(hi_at);
    s_begin[r] = lo;
    s_end[r] = hi;
    if (hi > lo) {
      atomicMin(&bounds[0], lo);
      atomicMax(&bounds[1], hi);
    }
    atomicMax(&bounds[2], lo);
    atomicMin(&bounds[3], hi);
  }
  __syncthreads();
}

// Compacted keys [k0, k0 + BK) (those below `limit`): their positions and value scales.
template <class T, int BK>
__device__ void load_key_positions(const AttentionArgs<T>& a, int64_t b, int k0, int limit,
                                   int* s_pos, float* s_pscale) {
  for (int j = threadIdx.x; j < BK; j += blockDim.x) {
    const int kj = k0 + j;
    int pos = -1;
    float ps = 0.f;
    if (kj < limit) {
      pos = int(a.positions[b * a.seq_len + kj]);
      ps = a.p ? float(load(a.p[b * a.seq_len + pos])) : 1.f;
    }
    s_pos[j] = pos;
    s_pscale[j] = ps;
  }
}

// dst[j][0:D) (row stride D + 1) = scale_j * src row of key j (zeros where pos < 0).
template <class T, int D, int BK>
__device__ void load_key_rows(const T* src, const AttentionArgs<T>& a, int64_t b, int64_t g,
                              const int* s_pos, const float* s_pscale, float* dst) {
  for (int idx = threadIdx.x; idx < BK * D; idx += blockDim.x) {
    const int j = idx / D, d = idx % D;
    const int pos = s_pos[j];
    float x = 0.f;
    if (pos >= 0) {
      x = float(load(src[a.kv_index(b, pos, g) * D + d]));
      if (s_pscale) x *= s_pscale[j];
    }
    dst[j * (D + 1) + d] = x;
  }
}

// dst[r][0:D) = row (b, q0 + r, h) of src ([B, T, Hq, D]), zeros past T.
template <class T, int D, int BQ>
__device__ void load_query_rows(const T* src, const AttentionArgs<T>& a, int64_t b, int64_t q0,
                                int64_t h, float* dst) {
  for (int idx = threadIdx.x; idx < BQ * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    const int64_t t = q0 + r;
    dst[r * (D + 1) + d] = t < a.seq_len ? float(load(src[a.q_index(b, t, h) * D + d])) : 0.f;
  }
}

// For the dK/dV passes: the visible ranges, lse and D of query rows [q0, q0 + BQ) of head h
// (empty past T), and whether any of them sees a key of [k0, k_end) and whether all of them
// see all of [k0, k0 + BK). Collective over the block (the answers come from barriers).
struct QueryTileVisibility {
  bool sees, covers;
};
template <class T, int BQ, int BK>
__device__ QueryTileVisibility load_query_tile(const AttentionArgs<T>& a, int64_t b, int64_t h,
                                               int64_t q0, int k0, int k_end, int* s_begin,
                                               int* s_end, float* s_lse, float* s_delta) {
  bool sees = false, covers = true;
  for (int r = int(threadIdx.x); r < BQ; r += int(blockDim.x)) {
    const int64_t t = q0 + r;
    int lo = 0, hi = 0;
    float lse = 0.f, delta = 0.f;
    if (t < a.seq_len) {
      lo = int(a.begin[b * a.seq_len + t]);
      hi = int(a.end[b * a.seq_len + t]);
      lse = float(a.lse[a.q_index(b, t, h)]);
      delta = float(a.delta[a.q_index(b, t, h)]);
    }
    s_begin[r] = lo;
    s_end[r] = hi;
    s_lse[r] = lse;
    s_delta[r] = delta;
    sees = sees || (lo < hi && lo < k_end && hi > k0);
    covers = covers && lo <= k0 && k0 + BK <= hi;
  }
  const bool any = __syncthreads_or(sees);
  const bool all = __syncthreads_and(covers);
  return {any, all};
}

template <class T, int DK, int DV>
__global__ void __launch_bounds__(kTileThreads) forward_tiled(AttentionArgs<T> a) {
  begin_dependent_kernel();
  constexpr int BQ = 64, BK = TileShape<DK, DV>::kKeys;
  constexpr int RQ = BQ / 16, RK = BK / 16, CV = DV / 16;
  HAM_DYNAMIC_SHARED(float, smem);
  float* sQ = smem;                 // [BQ][DK + 1]
  float* sK = sQ + BQ * (DK + 1);   // [BK][DK + 1]
  float* sV = sK + BK * (DK + 1);   // [BK][DV + 1], v' = p v
  float* sP = sV + BK * (DV + 1);   // [BQ][BK + 1]
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, s_pos, [BK]);
  HAM_STATIC_SHARED(int, bounds, [4]);
  HAM_STATIC_SHARED(float, s_pscale, [BK]);
  const int tx = int(threadIdx.x % 16), ty = int(threadIdx.x / 16);
  const BlockTile block = block_tile<BQ>(a.seq_len, a.q_heads, a.batch, true);
  const int64_t b = block.batch, h = block.head, q0 = block.tile * BQ;
  const int64_t g = h / a.group();

  load_query_ranges<T, BQ, kTileThreads>(a, b, q0, s_begin, s_end, bounds);
  const int lo = bounds[0], hi = bounds[1], full_lo = bounds[2], full_hi = bounds[3];
  load_query_rows<T, DK, BQ>(a.q, a, b, q0, h, sQ);

  float o[RQ][CV];
  float m[RQ], l[RQ];
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < CV; ++c) o[i][c] = 0.f;
  }
  for (int k0 = lo; k0 < hi; k0 += BK) {
    __syncthreads();  // the previous tile is no longer read
    load_key_positions<T, BK>(a, b, k0, hi, s_pos, s_pscale);
    __syncthreads();
    load_key_rows<T, DK, BK>(a.k, a, b, g, s_pos, nullptr, sK);
    load_key_rows<T, DV, BK>(a.v, a, b, g, s_pos, s_pscale, sV);
    __syncthreads();

    float s[RQ][RK];
    tile_row_dots<RQ, RK, DK>(sQ, sK, ty, tx, s);
    const bool check = !(k0 >= full_lo && k0 + BK <= full_hi);  // boundary tile
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const int r = ty + 16 * i;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const int kj = k0 + tx + 16 * j;
        const bool visible = !check || (kj >= s_begin[r] && kj < s_end[r]);
        s[i][j] = visible ? s[i][j] * a.scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      tile_max = half_warp_max(tile_max);
      const float m_new = fmaxf(m[i], tile_max);
      const float alpha = m[i] == -INFINITY ? 0.f : expf(m[i] - m_new);
      float row_sum = 0.f;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const float pj = s[i][j] == -INFINITY ? 0.f : expf(s[i][j] - m_new);
        sP[r * (BK + 1) + tx + 16 * j] = pj;
        row_sum += pj;
      }
      row_sum = half_warp_sum(row_sum);
      l[i] = l[i] * alpha + row_sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < CV; ++c) o[i][c] *= alpha;
    }
    __syncthreads();
#pragma unroll 2
    for (int j = 0; j < BK; ++j) {
      float pv[RQ];
#pragma unroll
      for (int i = 0; i < RQ; ++i) pv[i] = sP[(ty + 16 * i) * (BK + 1) + j];
#pragma unroll
      for (int c = 0; c < CV; ++c) {
        const float vv = sV[j * (DV + 1) + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < RQ; ++i) o[i][c] = fmaf(pv[i], vv, o[i][c]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int64_t t = q0 + ty + 16 * i;
    if (t >= a.seq_len) continue;
    const int64_t row = a.q_index(b, t, h);
    // no visible key (l = 0): o = 0, lse = -inf; a NaN score stays NaN in both
    const float inv = l[i] == 0.f ? 0.f : 1.f / l[i];
#pragma unroll
    for (int c = 0; c < CV; ++c) a.out[row * DV + tx + 16 * c] = store<T>(o[i][c] * inv);
    if (tx == 0) a.lse[row] = l[i] == 0.f ? -INFINITY : m[i] + logf(l[i]);
  }
}

template <class T, int DK, int DV>
__global__ void __launch_bounds__(kTileThreads) backward_dq_tiled(AttentionArgs<T> a) {
  begin_dependent_kernel();
  constexpr int BQ = 64, BK = TileShape<DK, DV>::kKeys;
  constexpr int RQ = BQ / 16, RK = BK / 16, CK = DK / 16;
  HAM_DYNAMIC_SHARED(float, smem);
  float* sQ = smem;                 // [BQ][DK + 1]
  float* sO = sQ + BQ * (DK + 1);   // dO [BQ][DV + 1]
  float* sK = sO + BQ * (DV + 1);   // [BK][DK + 1]
  float* sV = sK + BK * (DK + 1);   // [BK][DV + 1], v' = p v
  float* sS = sV + BK * (DV + 1);   // scale * dS [BQ][BK + 1]
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, s_pos, [BK]);
  HAM_STATIC_SHARED(int, bounds, [4]);
  HAM_STATIC_SHARED(float, s_pscale, [BK]);
  HAM_STATIC_SHARED(float, s_lse, [BQ]);
  HAM_STATIC_SHARED(float, s_delta, [BQ]);
  const int tx = int(threadIdx.x % 16), ty = int(threadIdx.x / 16);
  const BlockTile block = block_tile<BQ>(a.seq_len, a.q_heads, a.batch, true);
  const int64_t b = block.batch, h = block.head, q0 = block.tile * BQ;
  const int64_t g = h / a.group();

  load_query_ranges<T, BQ, kTileThreads>(a, b, q0, s_begin, s_end, bounds);
  const int lo = bounds[0], hi = bounds[1], full_lo = bounds[2], full_hi = bounds[3];
  load_query_rows<T, DK, BQ>(a.q, a, b, q0, h, sQ);
  load_query_rows<T, DV, BQ>(a.dout, a, b, q0, h, sO);
  for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
    const int64_t t = q0 + r;
    s_lse[r] = t < a.seq_len ? float(a.lse[a.q_index(b, t, h)]) : 0.f;
    s_delta[r] = t < a.seq_len ? float(a.delta[a.q_index(b, t, h)]) : 0.f;
  }

  float dq[RQ][CK];
#pragma unroll
  for (int i = 0; i < RQ; ++i)
#pragma unroll
    for (int c = 0; c < CK; ++c) dq[i][c] = 0.f;
  for (int k0 = lo; k0 < hi; k0 += BK) {
    __syncthreads();
    load_key_positions<T, BK>(a, b, k0, hi, s_pos, s_pscale);
    __syncthreads();
    load_key_rows<T, DK, BK>(a.k, a, b, g, s_pos, nullptr, sK);
    load_key_rows<T, DV, BK>(a.v, a, b, g, s_pos, s_pscale, sV);
    __syncthreads();

    float s[RQ][RK], dp[RQ][RK];
    tile_row_dots<RQ, RK, DK>(sQ, sK, ty, tx, s);
    tile_row_dots<RQ, RK, DV>(sO, sV, ty, tx, dp);
    const bool check = !(k0 >= full_lo && k0 + BK <= full_hi);
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const int r = ty + 16 * i;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const int kj = k0 + tx + 16 * j;
        const bool visible = !check || (kj >= s_begin[r] && kj < s_end[r]);
        const float prob = visible ? expf(s[i][j] * a.scale - s_lse[r]) : 0.f;
        sS[r * (BK + 1) + tx + 16 * j] = a.scale * prob * (dp[i][j] - s_delta[r]);
      }
    }
    __syncthreads();
#pragma unroll 2
    for (int j = 0; j < BK; ++j) {
      float ds[RQ];
#pragma unroll
      for (int i = 0; i < RQ; ++i) ds[i] = sS[(ty + 16 * i) * (BK + 1) + j];
#pragma unroll
      for (int c = 0; c < CK; ++c) {
        const float kv = sK[j * (DK + 1) + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < RQ; ++i) dq[i][c] = fmaf(ds[i], kv, dq[i][c]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int64_t t = q0 + ty + 16 * i;
    if (t >= a.seq_len) continue;
    const int64_t row = a.q_index(b, t, h);
#pragma unroll
    for (int c = 0; c < CK; ++c) a.dq[row * DK + tx + 16 * c] = store<T>(dq[i][c]);
  }
}

// Keys a block of backward_dkdv_tiled, and the rows of the key grid it shares with
// backward_dkdv_mma (whose kMmaRows are as many).
constexpr int kTiledKeyRows = 64;

template <class T, int DK, int DV>
__global__ void __launch_bounds__(kTileThreads) backward_dkdv_tiled(AttentionArgs<T> a) {
  begin_dependent_kernel();
  constexpr int BK = kTiledKeyRows, BQ = TileShape<DK, DV>::kQueries;
  constexpr int RK = BK / 16, RQ = BQ / 16, CK = DK / 16, CV = DV / 16;
  HAM_DYNAMIC_SHARED(float, smem);
  float* sK = smem;                 // [BK][DK + 1]
  float* sV = sK + BK * (DK + 1);   // [BK][DV + 1], v' = p v
  float* sQ = sV + BK * (DV + 1);   // [BQ][DK + 1]
  float* sO = sQ + BQ * (DK + 1);   // dO [BQ][DV + 1]
  float* sP = sO + BQ * (DV + 1);   // P [BK][BQ + 1]
  float* sS = sP + BK * (BQ + 1);   // scale * dS [BK][BQ + 1]
  HAM_STATIC_SHARED(int, s_pos, [BK]);
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, first_query);
  HAM_STATIC_SHARED(float, s_pscale, [BK]);
  HAM_STATIC_SHARED(float, s_lse, [BQ]);
  HAM_STATIC_SHARED(float, s_delta, [BQ]);
  const int tx = int(threadIdx.x % 16), ty = int(threadIdx.x / 16);
  const BlockTile block = key_block_tile<BK>(a);
  const int64_t b = block.batch, g = block.head;
  const int k0 = int(block.tile) * BK;
  const int count = int(a.counts[b]);
  if (k0 >= count) return;  // past this row's keys (the whole block)
  const int k_end = min(k0 + BK, count);

  if (threadIdx.x == 0) first_query = INT_MAX;
  __syncthreads();
  load_key_positions<T, BK>(a, b, k0, k_end, s_pos, s_pscale);
  for (int j = threadIdx.x; j < BK; j += blockDim.x) {
    if (k0 + j < k_end) atomicMin(&first_query, int(a.positions[b * a.seq_len + k0 + j]));
  }
  __syncthreads();
  load_key_rows<T, DK, BK>(a.k, a, b, g, s_pos, nullptr, sK);
  load_key_rows<T, DV, BK>(a.v, a, b, g, s_pos, s_pscale, sV);

  float dk[RK][CK], dv[RK][CV];
#pragma unroll
  for (int i = 0; i < RK; ++i) {
#pragma unroll
    for (int c = 0; c < CK; ++c) dk[i][c] = 0.f;
#pragma unroll
    for (int c = 0; c < CV; ++c) dv[i][c] = 0.f;
  }
  const int64_t group = a.group();
  // A query sees a key only at or after the key's position.
  const int64_t q_start = int64_t(first_query) / BQ * BQ;
  const int64_t q_end = visible_rows_end(a, b, k0, k_end, first_query);
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t h = g * group + hh;
    for (int64_t q0 = q_start; q0 < q_end; q0 += BQ) {
      __syncthreads();  // the previous query tile is no longer read
      const QueryTileVisibility vis = load_query_tile<T, BQ, BK>(a, b, h, q0, k0, k_end, s_begin,
                                                                  s_end, s_lse, s_delta);
      if (!vis.sees) continue;  // no row of this tile sees these keys
      const bool check = !vis.covers;
      load_query_rows<T, DK, BQ>(a.q, a, b, q0, h, sQ);
      load_query_rows<T, DV, BQ>(a.dout, a, b, q0, h, sO);
      __syncthreads();

      // Transposed scores: keys ty + 16 i, queries tx + 16 j.
      float s[RK][RQ], dp[RK][RQ];
      tile_row_dots<RK, RQ, DK>(sK, sQ, ty, tx, s);
      tile_row_dots<RK, RQ, DV>(sV, sO, ty, tx, dp);
#pragma unroll
      for (int i = 0; i < RK; ++i) {
        const int key = ty + 16 * i, kj = k0 + key;
#pragma unroll
        for (int j = 0; j < RQ; ++j) {
          const int r = tx + 16 * j;
          const bool visible = kj < k_end && (!check || (kj >= s_begin[r] && kj < s_end[r]));
          const float prob = visible ? expf(s[i][j] * a.scale - s_lse[r]) : 0.f;
          sP[key * (BQ + 1) + r] = prob;
          sS[key * (BQ + 1) + r] = a.scale * prob * (dp[i][j] - s_delta[r]);
        }
      }
      __syncthreads();
#pragma unroll 2
      for (int r = 0; r < BQ; ++r) {
        float pk[RK], sk[RK];
#pragma unroll
        for (int i = 0; i < RK; ++i) {
          pk[i] = sP[(ty + 16 * i) * (BQ + 1) + r];
          sk[i] = sS[(ty + 16 * i) * (BQ + 1) + r];
        }
#pragma unroll
        for (int c = 0; c < CV; ++c) {
          const float ov = sO[r * (DV + 1) + tx + 16 * c];
#pragma unroll
          for (int i = 0; i < RK; ++i) dv[i][c] = fmaf(pk[i], ov, dv[i][c]);
        }
#pragma unroll
        for (int c = 0; c < CK; ++c) {
          const float qv = sQ[r * (DK + 1) + tx + 16 * c];
#pragma unroll
          for (int i = 0; i < RK; ++i) dk[i][c] = fmaf(sk[i], qv, dk[i][c]);
        }
      }
    }
  }
  // Scatter to the original positions: dk, dv = p dv', and this kv head's <dv', v>.
#pragma unroll
  for (int i = 0; i < RK; ++i) {
    const int key = ty + 16 * i;
    const int pos = s_pos[key];  // the same for the 16 lanes of a half-warp
    float dp_share = 0.f;
    if (pos >= 0) {
      const int64_t kv_row = a.kv_index(b, pos, g);
#pragma unroll
      for (int c = 0; c < CK; ++c) a.dk[kv_row * DK + tx + 16 * c] = store<T>(dk[i][c]);
#pragma unroll
      for (int c = 0; c < CV; ++c) {
        a.dv[kv_row * DV + tx + 16 * c] = store<T>(s_pscale[key] * dv[i][c]);
        dp_share += dv[i][c] * float(load(a.v[kv_row * DV + tx + 16 * c]));
      }
    }
    dp_share = half_warp_sum(dp_share);
    if (a.dp_partial && pos >= 0 && tx == 0) {
      a.dp_partial[(b * a.kv_heads + g) * a.seq_len + k0 + key] = dp_share;
    }
  }
}

// ---- Tensor-core kernels (bf16) ------------------------------------------------------
// bf16 inputs run through the tensor cores (cuda/mma.cuh: mma.sync m16n8k16, f32
// accumulation), flash-attention-2 style. A block of 4 warps owns 64 query rows of one
// (query head, batch row), 16 per warp (the forward: 128 rows, 32 per warp, for head dims
// of 64 or 128; see MmaShape); per key tile the block stages K and V in shared memory,
// and each warp computes its S = Q K^T slice in registers, applies the scale, the
// visibility test (boundary tiles only) and the online softmax there, and feeds P straight
// from the accumulator registers into P V' = (P diag(p)) V, the value scales applied to
// P's columns in registers (the dQ kernel's likewise to dP's): the accumulator layout of
// two adjacent 8-column blocks of S is the A-fragment layout of one 16-column block of P.
// Scores, maxima, sums and O stay f32; P diag(p) is rounded to bf16 for the product, as
// flash-attention rounds P. (Scaling each V tile in shared memory instead had cost a pass
// over it per tile, and registers: 255 against 233 for the 128-row D = 128 forward.) The
// dK/dV kernel, whose keys stay, scales its V tile once: v' = p v rounded to bf16.
// Shared-memory rows are padded by 8 elements so that ldmatrix's eight 16-byte rows fall
// in different banks.
//
// Tiles move from global to shared memory by cp.async (cuda/async_copy.cuh): 16 bytes a
// copy, no registers, every copy of a thread in flight at once. (Loading each 16 bytes into
// a register and storing it to shared memory left one load in flight per thread, each
// waiting for the last: on the H200 the kernels ran at 0.3 of flash-attention's speed.)
// The forward and dQ kernels double-buffer their key tiles: the copies of tile t + 1 are
// issued before the products of tile t, and each key's compacted position and value scale
// are read into registers one tile before that (KeyTiles below). The dK/dV kernel copies
// each query tile once it knows the tile is seen, and reads the rows' ranges, lse and D a
// tile ahead (QueryTiles below).
//
// Softmax exponentials are exp2 of log2(e)-scaled scores (one multiply-add and the
// hardware's ex2 per element); lse is stored in natural-log units.

constexpr int kMmaThreads = 128;  // 4 warps
constexpr int kMmaRows = 64;      // query rows per block, 16 per warp
static_assert(kMmaRows == kTiledKeyRows, "backward_dkdv_mma takes the tiled kernel's key grid");
using mma::kLog2e;
constexpr float kLn2 = 0.6931471805599453f;

// The forward's block: 4 warps with kM row tiles of 16 query rows each (64 kM rows per
// block). With kM = 2 (value heads up to 192 beside key heads up to 128: O fits the
// registers twice) each K and V' fragment a warp loads from shared memory feeds two
// products, and each key tile a block stages serves 128 queries, as in flash-attention-2's
// 128-row blocks. At 128 x 192 (the paper's HAM heads) that takes 255 registers and
// spills: 22 local loads and stores a 32-key tile in the sm_90a SASS, against 1,197
// instructions and 160 tensor-core products a warp there, most of them reloads of values
// that hold across tiles; the fragments a product reads from shared memory fall from 0.6
// ldmatrix to 0.35, and the blocks an SM stay two. (A key head of 256 would need 119 KB
// and one block an SM; value heads of 256 spill over a kilobyte.) Key tiles are 64
// wide up to head dims of 128 (kKeyTile = 0), else 32; a 128-row block with value heads of
// 128 may take 32 instead (set_attention_forward_keys). The 64-key tile halves a key's
// share of the per-tile barriers, bookkeeping and rescaling; at 128 x 128 it takes 255
// registers, the 32-key tile 240 (ptxas, sm_90, neither spilling), and on the H200 it is
// 1.05-1.20x faster (gpu_results.md, ninth session). Blocks of 8 warps with one row tile
// each (128 registers, two blocks an SM) were 0.88-0.94x as fast there, and were dropped.
template <int DK, int DV, int kM = 1, int kKeyTile = 0>
struct MmaShape {
  static constexpr int kKeys = kKeyTile ? kKeyTile : DK > 128 || DV > 128 ? 32 : 64;
  static constexpr int kTileRows = 16 * kMmaThreads / 32;        // rows of one row tile each
  static constexpr int kRows = kTileRows * kM;                   // query rows per block
  static constexpr int ldk = DK + 8, ldv = DV + 8;               // smem row strides (bf16)
  // Q, then two slots of K and V' tiles
  static constexpr size_t forward_bytes = size_t(kRows * ldk + 2 * kKeys * (ldk + ldv)) * 2;
};

// The rows of one (batch row b, head) of a [B, T, H, D] tensor: token i's at
// first + i step, the step (H D elements) in bytes and 32 bits, so that an address is one
// 32 x 32 -> 64-bit multiply-add (IMAD.WIDE.U32) from a token index and a column's base.
struct HeadRows {
  const bf16* first;
  uint32_t step_bytes;
  __device__ HeadRows(const bf16* base, int64_t b, int64_t seq_len, int64_t heads, int64_t head,
                      int64_t D)
      : first(base + (b * seq_len * heads + head) * D),
        step_bytes(uint32_t(heads * D * int64_t(sizeof(bf16)))) {}
  // Column c of token i's row, from column c's base (`column(c)`); i = -1 (zeros, the
  // source not read) points a row before token 0's.
  __device__ const char* column(int c) const { return reinterpret_cast<const char*>(first + c); }
  __device__ const void* at(const char* column, int i) const {
    return strided_address(column, i, int32_t(step_bytes));
  }
};

// Row indices for issue_rows: compacted key j's position (-1: none), a shared-memory load
// (kIndexLoads: issue_rows_to reads them all before its copies).
struct KeyRows {
  const int* positions;
  __device__ int operator()(int j) const { return positions[j]; }
};
__device__ __forceinline__ KeyRows key_rows(const int* positions) { return {positions}; }
template <class Index>
constexpr bool kIndexLoads = false;
template <>
constexpr bool kIndexLoads<KeyRows> = true;

// Row indices for issue_rows: query q0 + r (-1 past T), in 32 bits (T < 2^30: check_grid;
// in 64 bits the compare and its operands had taken 3 instructions a copy).
__device__ __forceinline__ auto query_rows(int64_t q0, int64_t seq_len) {
  const int first = int(q0), end = int(seq_len);
  return [=](int r) { return first + r < end ? first + r : -1; };
}

// A thread's copies of rows [0, kRows) of a bf16 tile of D columns, kThreads threads a
// block: chunk idx (16 bytes) of the tile is thread idx % kThreads's. Where a row's chunks
// divide the block (every head dim but 192), that is chunk column threadIdx.x % kChunks of
// every (kThreads / kChunks)-th row, so a thread's copies unroll with fixed steps from one
// column base, and each costs an index, a multiply-add and the copy. (A general loop over
// row pointers had taken 35-45 instructions a copy in the forward's SASS, nearly half of
// what its key-tile loop executed: 64-bit index arithmetic, and the kernel arguments read
// again after each copy, whose asm clobbers memory. Element addresses turned to bytes per
// copy had still taken 16.)
template <int D, int kRows, int kThreads>
struct RowCopies {
  static constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0, "whole rounds of copies");
  static constexpr bool kColumnFixed = kThreads % kChunks == 0;
  static constexpr int kCopies = kRows * kChunks / kThreads;
  // copy k's tile row, and its chunk's first column
  __device__ static int row(int k) {
    if constexpr (kColumnFixed) return int(threadIdx.x) / kChunks + k * (kThreads / kChunks);
    return (int(threadIdx.x) + k * kThreads) / kChunks;
  }
  __device__ static int column(int k) {
    if constexpr (kColumnFixed) return int(threadIdx.x) % kChunks * 8;
    return (int(threadIdx.x) + k * kThreads) % kChunks * 8;
  }
  // Copy k: token's row of `rows` (zeros where token is -1, landing with the copies) to
  // place(row(k), column(k)); column_base is rows.column(column(k)).
  template <class Place>
  __device__ static void copy(Place place, const HeadRows& rows, const char* column_base, int k,
                              int token) {
    async_copy_16_or_zeros(place(row(k), column(k)), rows.at(column_base, token), token >= 0);
  }
  // The indices of this thread's rows, every one read before any copy (index: KeyRows,
  // shared-memory loads): read between copies (each copy's asm clobbers memory, so the
  // next load stays after it), every load put an LDS before an LDGSTS, and ptxas three
  // never-executed LDS before each copy.
  template <class Index>
  __device__ static void read_tokens(Index index, int (&token)[kCopies]) {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) token[k] = index(row(k));
  }
  template <class Place>
  __device__ static void issue(Place place, const HeadRows& rows, const int (&token)[kCopies]) {
    const char* fixed_column = rows.column(column(0));
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      copy(place, rows, kColumnFixed ? fixed_column : rows.column(column(k)), k, token[k]);
    }
  }
};

// Issues this thread's copies (RowCopies) of rows [0, kRows) of a bf16 tile in shared
// memory, element (r, c) at place(r, c), from global rows of D elements: row r from token
// index(r) of `rows`, zeros where index(r) is -1. Indices that are loads (kIndexLoads) are
// all read first; computed ones stay beside their copies, and a 192-wide tile's in a loop
// unrolled by 4 (its 12 copies a thread unrolled whole, or their indices held across them,
// made the dK/dV kernels spill).
template <int D, int kRows, int kThreads = kMmaThreads, class Place, class Index>
__device__ void issue_rows_to(Place place, const HeadRows& rows, Index index) {
  using Copies = RowCopies<D, kRows, kThreads>;
  if constexpr (kIndexLoads<Index>) {
    int token[Copies::kCopies];
    Copies::read_tokens(index, token);
    Copies::issue(place, rows, token);
  } else if constexpr (Copies::kColumnFixed) {
    const char* column = rows.column(Copies::column(0));
#pragma unroll
    for (int k = 0; k < Copies::kCopies; ++k) {
      Copies::copy(place, rows, column, k, index(Copies::row(k)));
    }
  } else {
#pragma unroll 4
    for (int k = 0; k < Copies::kCopies; ++k) {
      Copies::copy(place, rows, rows.column(Copies::column(k)), k, index(Copies::row(k)));
    }
  }
}

// issue_rows_to for a tile of row stride LD.
template <int D, int LD, int kRows, class Index>
__device__ void issue_rows(bf16* dst, const HeadRows& rows, Index index) {
  issue_rows_to<D, kRows>([=](int r, int c) { return dst + r * LD + c; }, rows, index);
}

// Once this thread's copies of a tile have landed: its chunks of row r times scale[r],
// rounded back to bf16 (v' = p v), element (r, c) at place(r, c). They are the chunks
// issue_rows_to gave it, so they are visible to it without a barrier.
template <int D, int kRows, int kThreads = kMmaThreads, class Place>
__device__ void scale_rows_at(Place place, const float* scale) {
  constexpr int kChunks = D / 8;
#pragma unroll 4
  for (int idx = int(threadIdx.x); idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    bf16* at = place(r, c);
    Pack<bf16, 8> chunk = *reinterpret_cast<const Pack<bf16, 8>*>(at);
#pragma unroll
    for (int i = 0; i < 8; ++i) chunk.v[i] = store<bf16>(load(chunk.v[i]) * scale[r]);
    *reinterpret_cast<Pack<bf16, 8>*>(at) = chunk;
  }
}
template <int D, int LD, int kRows>
__device__ void scale_rows(bf16* tile, const float* scale) {
  scale_rows_at<D, kRows>([=](int r, int c) { return tile + r * LD + c; }, scale);
}

// Element (r, c) of a swizzled tile of R rows, for issue_rows_to and scale_rows_at
// (the tiles of the wgmma kernels: cuda/wgmma.cuh).
template <int R>
struct SwizzledTile {
  bf16* tile;
  __device__ bf16* operator()(int r, int c) const { return tile + wgmma::swizzled_index<R>(r, c); }
};

using mma::exp2_ftz;
using mma::quad_max;
using mma::quad_sum;
using mma::zero;

// Whether compacted key kj lies in row r's visible range [begin[r], end[r]), both compares
// evaluated: a short-circuit && compiles to a branch per element.
__device__ __forceinline__ bool in_range(int kj, const int* begin, const int* end, int r) {
  return (kj >= begin[r]) & (kj < end[r]);
}

// On a boundary tile (some row does not see every key of [k0, k0 + 8 NB)): the accumulator
// elements of hidden (row, key) pairs become `hidden`, for a warp's kM row tiles whose
// lane rows are r0[m] and r0[m] + 8 (element e of block nb: row r0 + 8 (e / 2), key
// k0 + 8 nb + 2 (lane % 4) + e % 2).
template <int kM, int NB>
__device__ __forceinline__ void hide_outside_ranges(float (&acc)[kM][NB][4], const int (&r0)[kM],
                                                    int k0, const int* begin, const int* end,
                                                    float hidden) {
  const int t4 = mma::lane_id() % 4;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0[m] + 8 * (e / 2), kj = k0 + nb * 8 + 2 * t4 + e % 2;
        acc[m][nb][e] = in_range(kj, begin, end, r) ? acc[m][nb][e] : hidden;
      }
    }
  }
}

// Compacted key kj of row b: its position (-1 at or past `limit`) and value scale (0 where
// the position is -1, 1 without value scaling).
__device__ __forceinline__ int key_position(const AttentionArgs<bf16>& a, int64_t b, int kj,
                                            int limit) {
  return kj < limit ? int(a.positions[b * a.seq_len + kj]) : -1;
}
__device__ __forceinline__ float key_scale(const AttentionArgs<bf16>& a, int64_t b, int pos) {
  return pos < 0 ? 0.f : a.p ? load(a.p[b * a.seq_len + pos]) : 1.f;
}

// The compacted key tiles [lo, lo + BK), [lo + BK, ...) below `hi` of a forward or dQ block,
// double-buffered: tile t lives in slot t % 2 (K rows, V rows, positions) and its value
// scales in slot t % 3 (they are read during tile t's products, when tile t + 2's
// positions may already be in slot t % 2). Thread j < BK carries key j of the next tiles in
// registers: tile t + 1's position and scale, tile t + 2's position, each loaded an
// iteration before it is needed. Usage (the query rows' copies issued before, by
// query_block):
//   begin_key_tiles(keys);  (begin() where lo < hi, then the commit)
//   for each tile t:  advance(t);  products on k(t), v(t), with value scales tile_scales(t)
template <int DK, int DV, int BK, bool kSwizzled = false, int kThreads = kMmaThreads>
struct KeyTiles {
  // Row strides; kSwizzled: the tiles are unpadded and swizzled for wgmma (SwizzledTile), and
  // advance() hands each thread's copies to the tensor cores' proxy before its barrier.
  static constexpr int LDK = kSwizzled ? DK : DK + 8, LDV = kSwizzled ? DV : DV + 8;
  const AttentionArgs<bf16>& a;
  int64_t b, g;
  int lo, hi;
  bf16* k_rows;    // [2][BK][LDK]
  bf16* v_rows;    // [2][BK][LDV]
  int* positions;  // [2][BK], shared
  float* scales;   // [3][BK], shared
  int next_position = -1, after_position = -1;
  float next_scale = 0.f;

  __device__ bf16* k(int t) const { return k_rows + (t % 2) * BK * LDK; }
  __device__ bf16* v(int t) const { return v_rows + (t % 2) * BK * LDV; }

  // The compacted index of tile t's first key.
  __device__ int first_key(int t) const { return lo + t * BK; }

  // Issues the copies of tile t into its slot (its positions are in shared memory).
  __device__ void issue(int t) const { issue_rows_at(t, positions + (t % 2) * BK); }

  // Where element (r, c) of a K (LD = LDK) or V (LDV) slot lies, for issue_rows_to.
  template <int LD>
  __device__ static auto place_in(bf16* slot) {
    if constexpr (kSwizzled) {
      return SwizzledTile<BK>{slot};
    } else {
      return [slot](int r, int c) { return slot + r * LD + c; };
    }
  }

  // begin_from for a persistent block's next query tile (forward_wgmma_persistent,
  // backward_dq_wgmma_persistent), whose key tiles go on from the block's count at t0 (slots
  // t0 % 2 and t0 % 3; start_running sets b, g, hi, and lo to the tile's lo - t0 BK, so that
  // first_key(t0) is its first key): tile t0's copies from first_positions (shared memory,
  // the tile's record) and the lookahead's positions, with no wait for a load, since the
  // block's current tile still computes. The value scales wait: load_first_scales, then
  // store_first_scale(t0) before advance(t0). Only when the tile sees a key; collective
  // over the block.
  __device__ void begin_running(int t0, const int* first_positions) {
    const int j = int(threadIdx.x);
    if (j < BK) {
      next_position = key_position(a, b, first_key(t0 + 1) + j, hi);
      after_position = key_position(a, b, first_key(t0 + 2) + j, hi);
    }
    issue_rows_at(t0, first_positions);
  }
  // begin_running for the tile's keys [lo, hi) of batch row b, kv head g (a QueryBlock's).
  template <class Block>
  __device__ void start_running(const Block& tile, int t0, const int* first_positions) {
    b = tile.b;
    g = tile.g;
    lo = tile.lo - t0 * BK;
    hi = tile.hi;
    begin_running(t0, first_positions);
  }
  // Tile t0's value scales into a register and tile t0 + 1's into the lookahead: loads whose
  // values the block first needs after its current tile's epilogue.
  float first_scale = 0.f;
  __device__ void load_first_scales(const int* first_positions) {
    const int j = int(threadIdx.x);
    if (j < BK) {
      first_scale = key_scale(a, b, first_positions[j]);
      next_scale = key_scale(a, b, next_position);
    }
  }
  __device__ void store_first_scale(int t0) const {
    const int j = int(threadIdx.x);
    if (j < BK) scales[t0 % 3 * BK + j] = first_scale;
  }

  // The same with key j's row from pos[j] (shared or global memory; -1: none). Where
  // DK = DV a thread copies the same rows of K and V: their positions are read once.
  __device__ void issue_rows_at(int t, const int* pos) const {
    const HeadRows k_of(a.k, b, a.seq_len, a.kv_heads, g, DK);
    const HeadRows v_of(a.v, b, a.seq_len, a.kv_heads, g, DV);
    const auto place_k = place_in<LDK>(k(t));
    const auto place_v = place_in<LDV>(v(t));
    if constexpr (DK == DV) {
      using Copies = RowCopies<DK, BK, kThreads>;
      int token[Copies::kCopies];
      Copies::read_tokens(key_rows(pos), token);
      Copies::issue(place_k, k_of, token);
      Copies::issue(place_v, v_of, token);
    } else {
      issue_rows_to<DK, BK, kThreads>(place_k, k_of, key_rows(pos));
      issue_rows_to<DV, BK, kThreads>(place_v, v_of, key_rows(pos));
    }
  }

  // Tile 0's positions into slot 0 and tiles 1 and 2's into the lookahead registers, a
  // barrier, tile 0's copies (not committed), then tiles 0 and 1's value scales, into slot 0
  // (advance(0)'s barrier publishes it) and the lookahead. A scale's load waits for its
  // key's position; after the copies, the copies do not wait for it. (Before them, the two
  // scale loads had put two more dependent loads between a block's start and its first
  // key tile.) Only when lo < hi; collective over the block.
  __device__ void begin() {
    const int j = int(threadIdx.x);
    int first = -1;
    if (j < BK) {
      first = key_position(a, b, first_key(0) + j, hi);
      next_position = key_position(a, b, first_key(1) + j, hi);
      after_position = key_position(a, b, first_key(2) + j, hi);
      positions[j] = first;
    }
    __syncthreads();
    issue(0);
    if (j < BK) {
      scales[j] = key_scale(a, b, first);
      next_scale = key_scale(a, b, next_position);
    }
  }

  // begin() for a block whose tile 0 positions are first_positions (global memory: a
  // QueryTileKeys record, -1 past hi): each thread reads its copies' positions there, so
  // no barrier publishes them; slot 0 is next written for tile 2. Only when lo < hi;
  // collective over the block.
  __device__ void begin_from(const int* first_positions) {
    const int j = int(threadIdx.x);
    if (j < BK) {
      next_position = key_position(a, b, first_key(1) + j, hi);
      after_position = key_position(a, b, first_key(2) + j, hi);
    }
    issue_rows_at(0, first_positions);
    if (j < BK) {
      scales[j] = key_scale(a, b, first_positions[j]);
      next_scale = key_scale(a, b, next_position);
    }
  }

  // At the top of tile t: tile t + 1's positions and scales into their slots (free: their
  // last readers, tile t - 1's copies and products, passed the barrier at the top of tile
  // t - 1), the lookahead moves on, this thread's copies of tile t (and at t = 0 of what
  // was committed with it) waited for, then one barrier, which publishes tile t and
  // tile t + 1's positions and frees tile t - 1's slots, then tile t + 1's copies into
  // them. (A barrier before the copies and another after the wait had cost every tile
  // two.)
  __device__ void advance(int t) {
    const int j = int(threadIdx.x), slot = (t + 1) % 2;
    if (j < BK) {
      positions[slot * BK + j] = next_position;
      scales[(t + 1) % 3 * BK + j] = next_scale;
      next_scale = key_scale(a, b, after_position);
      next_position = after_position;
      after_position = key_position(a, b, first_key(t + 3) + j, hi);
    }
    async_copy_wait<0>();
    if constexpr (kSwizzled) wgmma::fence_proxy_async();
    __syncthreads();
    if (first_key(t + 1) < hi) {
      issue(t + 1);
      async_copy_commit();
    }
  }

  // Tile t's value scales p (0 past the last key): V' = diag(p) V enters the products as
  // P V' = (P diag(p)) V and dP = dO V'^T = (dO V^T) diag(p), a scale per column of the
  // accumulators, instead of a pass over the V tile in shared memory.
  __device__ const float* tile_scales(int t) const { return scales + t % 3 * BK; }
};

// A forward or dQ block's start, after query_block: tile 0's copies issued (where some row
// sees a key) and committed with the query rows'; where none does, those are waited for,
// since no tile loop will.
// With first_positions (a QueryTileKeys record's), tile 0's copies go out from them
// (begin_from).
template <class Keys>
__device__ void begin_key_tiles(Keys& keys, const int* first_positions = nullptr) {
  if (keys.lo < keys.hi) {  // the same in every thread
    if (first_positions) {
      keys.begin_from(first_positions);
    } else {
      keys.begin();
    }
  }
  async_copy_commit();
  if (keys.lo >= keys.hi) async_copy_wait<0>();
}

// The value scales of this lane's accumulator columns 8 nb + 2 (lane % 4) + c (c < 2) of a
// key tile: x[nb][e] *= p[column of e], element e in column 2 (lane % 4) + e % 2.
// tile_scales is 8-byte aligned: the two columns' scales come in one load.
template <int NB>
__device__ __forceinline__ void scale_key_columns(const float* tile_scales, float (&x)[NB][4]) {
  const int t4 = mma::lane_id() % 4;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    const float2 p = *reinterpret_cast<const float2*>(tile_scales + nb * 8 + 2 * t4);
    x[nb][0] *= p.x;
    x[nb][1] *= p.y;
    x[nb][2] *= p.x;
    x[nb][3] *= p.y;
  }
}

// A block of the tensor-core kernels over BQ query rows (the forward's and the dQ pass's):
// batch row b, query head h (kv head g), rows [q0, q0 + BQ), whose visible ranges go to
// s_begin / s_end (load_query_ranges); the keys some row sees are [lo, hi), those every row
// sees [full_lo, full_hi). issue_query_copies(b, h, q0) issues (does not commit) the
// copies of the block's own rows (Q, and dO in the dQ pass) while the ranges load, so that
// they need not wait for the chain that follows: ranges, then the key positions, then the
// key tiles. The kernel commits them with the first key tile, or, where no row sees a key,
// commits and waits for them before it ends. Collective over the block.
struct QueryBlock {
  int64_t b, h, g, q0;
  int lo, hi, full_lo, full_hi;
};
template <int BQ, int kThreads, class IssueQueryCopies>
__device__ QueryBlock query_block(const AttentionArgs<bf16>& a, int* s_begin, int* s_end,
                                  int* bounds, IssueQueryCopies issue_query_copies) {
  const BlockTile block = block_tile<BQ>(a.seq_len, a.q_heads, a.batch, true);
  const int64_t b = block.batch, h = block.head, q0 = block.tile * BQ;
  load_query_ranges<bf16, BQ, kThreads>(a, b, q0, s_begin, s_end, bounds,
                                        [&] { issue_query_copies(b, h, q0); });
  return {b, h, h / a.group(), q0, bounds[0], bounds[1], bounds[2], bounds[3]};
}

// query_block for a block of kQueryTileRows rows from its tile's QueryTileKeys record
// (a.query_tile_keys): the bounds come in one load with the first positions, which
// begin_key_tiles(keys, record->first_positions) then issues tile 0's copies from. The
// rows' own ranges, which only the boundary tiles' masks read, load beside; the thread of
// row r stores them to s_begin / s_end with store_query_ranges(range), once the key
// copies are out (a barrier, advance()'s, publishes them).
struct QueryRange {
  int begin = 0, end = 0;  // [0, 0) where the thread has no row
};
template <int BQ, int kThreads, class IssueQueryCopies>
__device__ QueryBlock query_block_from_record(const AttentionArgs<bf16>& a,
                                              const QueryTileKeys*& record, QueryRange& range,
                                              IssueQueryCopies issue_query_copies) {
  static_assert(BQ == kQueryTileRows && BQ <= kThreads, "a record's tile, a thread a row");
  const BlockTile block = block_tile<BQ>(a.seq_len, a.q_heads, a.batch, true);
  const int64_t b = block.batch, h = block.head, q0 = block.tile * BQ;
  record = a.query_tile_keys + b * ((a.seq_len + BQ - 1) / BQ) + block.tile;
  const uint4 bounds = *reinterpret_cast<const uint4*>(record);  // lo, hi, full_lo, full_hi
  const int r = int(threadIdx.x);
  if (r < BQ && q0 + r < a.seq_len) {
    range.begin = int(a.begin[b * a.seq_len + q0 + r]);
    range.end = int(a.end[b * a.seq_len + q0 + r]);
  }
  issue_query_copies(b, h, q0);
  return {b, h, h / a.group(), q0, int(bounds.x), int(bounds.y), int(bounds.z), int(bounds.w)};
}
template <int BQ>
__device__ void store_query_ranges(const QueryRange& range, int* s_begin, int* s_end) {
  const int r = int(threadIdx.x);
  if (r < BQ) {
    s_begin[r] = range.begin;
    s_end[r] = range.end;
  }
}

// A key tile's step of the online softmax for a warp's kM row tiles, on the unscaled
// scores S in place (row max and sum over the quad's lanes): the scale is positive, so
// m = max S gives max(scale S) = scale m, and P = 2^(S scale_log2 - m scale_log2) is one
// fused multiply-add and an exp2 an element. m_run and this lane's share of the row sums l
// move on; O is rescaled by alpha = 2^((m_old - m_new) scale_log2).
template <int kM, int NB, int VB>
__device__ __forceinline__ void online_softmax_step(float (&s)[kM][NB][4], float (&m_run)[kM][2],
                                                    float (&l)[kM][2], float (&o)[kM][VB][4],
                                                    float scale_log2) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[m][nb][e]);
    }
    // A hidden score (-inf) gives P = 0, and so does a row that has seen no key yet
    // (m = -inf, subtracted as 0); a NaN score stays NaN.
    float alpha[2], row_sum[2] = {0.f, 0.f}, m_sub[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float m_new = fmaxf(m_run[m][i], quad_max(tile_max[i]));
      alpha[i] = m_run[m][i] == -INFINITY ? 0.f : exp2_ftz((m_run[m][i] - m_new) * scale_log2);
      m_run[m][i] = m_new;
      m_sub[i] = m_new == -INFINITY ? 0.f : m_new * scale_log2;
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[m][nb][e] = exp2_ftz(fmaf(s[m][nb][e], scale_log2, -m_sub[e / 2]));
        row_sum[e / 2] += s[m][nb][e];
      }
    }
    // l stays this lane's share of the row sum (its columns), summed over the quad at the
    // end: alpha is the same in the quad's four lanes.
#pragma unroll
    for (int i = 0; i < 2; ++i) l[m][i] = fmaf(l[m][i], alpha[i], row_sum[i]);
    // O's rescale is skipped when no row of the warp's tile raised its max (alpha = 1
    // everywhere: the product would change nothing), as most key tiles after the first few
    // of a row do.
    if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
      for (int vb = 0; vb < VB; ++vb) {
        o[m][vb][0] *= alpha[0];
        o[m][vb][1] *= alpha[0];
        o[m][vb][2] *= alpha[1];
        o[m][vb][3] *= alpha[1];
      }
    }
  }
}

// A block's output rows leave through shared memory, so that each goes out in 16-byte
// stores, D / 8 threads a row: in the accumulators' layout a warp's store puts 4 bytes a
// lane in 8 rows, 16 bytes of each (the dK/dV kernel's epilogue, which stored so, took
// 8.4 us of a block on the H200's timelines against 2.5 a query tile; thirty-sixth
// session). Staged rows are D + 8 elements apart, so that the 8 rows of a warp's 4-byte
// writes and the 16-byte reads of a row meet no bank twice. The staging overwrites the
// block's tiles once their products are done: a barrier before and after.

// This lane's two accumulator rows (C layout, D / 8 blocks of 8 columns) as bf16: the
// i-th times scale[i] to the row at to[i] (none where null), a lane's two adjacent columns
// in one 4-byte store.
template <int D>
__device__ __forceinline__ void write_accumulator_rows(bf16* const (&to)[2],
                                                       const float (&acc)[D / 8][4],
                                                       const float (&scale)[2]) {
  const int t4 = mma::lane_id() % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (to[i] == nullptr) continue;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      *reinterpret_cast<uint32_t*>(to[i] + nb * 8 + 2 * t4) =
          mma::pack_bf16(scale[i] * acc[nb][2 * i], scale[i] * acc[nb][2 * i + 1]);
    }
  }
}

// This lane's accumulator rows r0 and r0 + 8, times scale[0] and scale[1], into the staged
// rows.
template <int D>
__device__ __forceinline__ void stage_accumulator_rows(bf16* staged, int r0,
                                                       const float (&acc)[D / 8][4],
                                                       const float (&scale)[2]) {
  constexpr int LD = D + 8;
  bf16* const rows[2] = {staged + r0 * LD, staged + (r0 + 8) * LD};
  write_accumulator_rows<D>(rows, acc, scale);
}

// Staged rows [0, kRows) out, by the block's kThreads threads: row r to the D elements at
// destination(r), none where that is null.
template <int D, int kRows, int kThreads, class Destination>
__device__ __forceinline__ void copy_out_staged_rows(const bf16* staged, Destination destination) {
  constexpr int LD = D + 8, kChunks = D / 8;
#pragma unroll 1
  for (int idx = int(threadIdx.x); idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks * 8;
    bf16* to = destination(r);
    if (to == nullptr) continue;
    *reinterpret_cast<uint4*>(to + c) = *reinterpret_cast<const uint4*>(staged + r * LD + c);
  }
}

// Elements of shared memory that kRows staged rows of D take.
template <int D, int kRows>
constexpr int staged_elements() {
  return kRows * (D + 8);
}

// The dQ kernels' end: dq = scale dQ for a warp's kM row tiles (this lane's rows r0[m]
// and r0[m] + 8 of the block's kRows), staged in `staging` (the block's Q tile and on).
template <int kRows, int kThreads, int kM, int NB>
__device__ __forceinline__ void store_query_grads(const AttentionArgs<bf16>& a, int64_t b,
                                                  int64_t h, int64_t q0, const int (&r0)[kM],
                                                  const float (&dq)[kM][NB][4],
                                                  bf16* staging) {
  constexpr int DK = NB * 8;
  const float scale[2] = {a.scale, a.scale};
  __syncthreads();  // every warp's products are done with the tiles the staging overwrites
#pragma unroll
  for (int m = 0; m < kM; ++m) stage_accumulator_rows<DK>(staging, r0[m], dq[m], scale);
  __syncthreads();
  copy_out_staged_rows<DK, kRows, kThreads>(staging, [&](int r) {
    const int64_t t = q0 + r;
    return t < a.seq_len ? a.dq + a.q_index(b, t, h) * DK : nullptr;
  });
}

// The forward's end for a warp's kM row tiles (this lane's rows r0[m] and r0[m] + 8 of the
// block's kRows): out = O / l, staged in `staging` (the block's tiles, kTileElements of
// them), and lse = (m scale_log2 + log2 l) ln 2 (one fused multiply-add, as l's update in
// online_softmax_step: left to the compiler, whether a kernel fused them depended on what
// else it computed, and forward_wgmma_persistent's lse differed from forward_wgmma's in the
// last bits on the emulator), with l summed over the quad. A row with no
// visible key (l = 0) gets o = 0 and lse = -inf; a NaN score stays NaN in both. Device
// code for sm_80 stores out from the accumulators instead, a lane's two adjacent columns in
// one store: staged, ptxas spilled 9 instructions in the 128-row forward_mma's tile loop
// there, not 3 (sm_90a: none either way).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kStageForwardRows = false;
#else
constexpr bool kStageForwardRows = true;
#endif
template <int kRows, int kThreads, int kTileElements, int kM, int VB>
__device__ __forceinline__ void store_forward_rows(const AttentionArgs<bf16>& a,
                                                   const QueryBlock& qb, const int (&r0)[kM],
                                                   const float (&o)[kM][VB][4],
                                                   const float (&m_run)[kM][2],
                                                   float (&l)[kM][2], float scale_log2,
                                                   bf16* staging) {
  constexpr int DV = VB * 8;
  static_assert(staged_elements<DV, kRows>() <= kTileElements, "the staged out fits the tiles");
  const int t4 = mma::lane_id() % 4;
  if constexpr (kStageForwardRows) {
    __syncthreads();  // every warp's products are done with the tiles the staging overwrites
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float inv[2];
    bf16* out_rows[2] = {nullptr, nullptr};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[m][i] = quad_sum(l[m][i]);
      inv[i] = l[m][i] == 0.f ? 0.f : 1.f / l[m][i];
      const int64_t t = qb.q0 + r0[m] + 8 * i;
      if (t >= a.seq_len) continue;
      const int64_t row = a.q_index(qb.b, t, qb.h);
      out_rows[i] = a.out + row * DV;
      if (t4 == 0) {
        a.lse[row] =
            l[m][i] == 0.f ? -INFINITY : fmaf(m_run[m][i], scale_log2, log2f(l[m][i])) * kLn2;
      }
    }
    if constexpr (kStageForwardRows) {
      stage_accumulator_rows<DV>(staging, r0[m], o[m], inv);
    } else {
      write_accumulator_rows<DV>(out_rows, o[m], inv);
    }
  }
  if constexpr (kStageForwardRows) {
    __syncthreads();
    copy_out_staged_rows<DV, kRows, kThreads>(staging, [&](int r) {
      const int64_t t = qb.q0 + r;
      return t < a.seq_len ? a.out + a.q_index(qb.b, t, qb.h) * DV : nullptr;
    });
  }
}

// (The explicit minimum of one block matters: without it ptxas spilled the 128 x 128
// instance, 60 bytes, where with it that instance fits 255 registers.)
template <int DK, int DV, int kM, int kKeyTile>
__global__ void __launch_bounds__(kMmaThreads, 1) forward_mma(AttentionArgs<bf16> a) {
  begin_dependent_kernel();
  using Shape = MmaShape<DK, DV, kM, kKeyTile>;
  constexpr int kTileRows = Shape::kTileRows;
  constexpr int BQ = Shape::kRows, BK = Shape::kKeys, LDK = Shape::ldk, LDV = Shape::ldv;
  constexpr int NB = BK / 8, VB = DV / 8;  // 8-column blocks of S and of O
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [BQ][LDK]
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, bounds, [4]);
  HAM_STATIC_SHARED(int, s_pos, [2 * BK]);
  HAM_STATIC_SHARED(__align__(8) float, s_pscale, [3 * BK]);  // 8-byte aligned: scale_key_columns
  mark_block(a.timeline, BlockMark::Start);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  auto issue_query = [&](int64_t row, int64_t head, int64_t first) {
    issue_rows<DK, LDK, BQ>(sQ, HeadRows(a.q, row, a.seq_len, a.q_heads, head, DK),
                            query_rows(first, a.seq_len));
  };
  const QueryBlock qb = query_block<BQ, kMmaThreads>(a, s_begin, s_end, bounds, issue_query);
  const auto [b, h, g, q0, lo, hi, full_lo, full_hi] = qb;
  KeyTiles<DK, DV, BK> keys{
      a, b, g, lo, hi, sQ + BQ * LDK, sQ + BQ * LDK + 2 * BK * LDK, s_pos, s_pscale};
  begin_key_tiles(keys);
  mark_block(a.timeline, BlockMark::CopiesIssued);

  // The warp's row tile m is rows 16 (4 m + warp) .. + 15 of the block; this lane's
  // accumulator rows in it are r0[m] and r0[m] + 8 (element e of a fragment is in row
  // r0 + 8 (e / 2), column 2 t4 + e % 2 of its 8-column block).
  int r0[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) r0[m] = kTileRows * m + warp * 16 + lane / 4;
  const float scale_log2 = a.scale * kLog2e;  // scores to log2 units
  float o[kM][VB][4];
  float m_run[kM][2], l[kM][2];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    zero(o[m]);
    m_run[m][0] = m_run[m][1] = -INFINITY;
    l[m][0] = l[m][1] = 0.f;
  }

  for (int t = 0, k0 = lo; k0 < hi; ++t, k0 += BK) {
    keys.advance(t);  // tile t (and Q) have landed
    if (t == 0) mark_block(a.timeline, BlockMark::FirstTile, (hi - k0 + BK - 1) / BK);
    const bf16 *sK = keys.k(t), *sV = keys.v(t);

    // S = Q K^T for the warp's kM row tiles (each K fragment loaded once).
    float s[kM][NB][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) zero(s[m]);
    mma::row_tiles_times_rows<kM, DK, LDK, LDK, NB>(sQ + warp * 16 * LDK, kTileRows * LDK, sK,
                                                    s);

    // Visibility: hidden scores become -inf, on boundary tiles only (a branch the whole
    // block takes alike; the select had cost every tile its compares).
    if (!(k0 >= full_lo && k0 + BK <= full_hi)) {
      hide_outside_ranges(s, r0, k0, s_begin, s_end, -INFINITY);
    }
    online_softmax_step(s, m_run, l, o, scale_log2);

    // O += P V' = (P diag(p)) V: P's accumulator registers, each column scaled by its key's
    // value scale, are the A-fragments (each V fragment loaded once for the kM row tiles).
    if (a.p) {
#pragma unroll
      for (int m = 0; m < kM; ++m) scale_key_columns(keys.tile_scales(t), s[m]);
    }
    mma::accumulators_times_matrix<kM, NB, LDV, VB>(s, sV, o);
  }
  mark_block(a.timeline, BlockMark::TilesDone);
  store_forward_rows<BQ, kMmaThreads, int(Shape::forward_bytes / 2)>(a, qb, r0, o, m_run, l,
                                                                     scale_log2, sQ);
  mark_block(a.timeline, BlockMark::End);
}

// Backward on the tensor cores, deterministic like the tiled one (no float atomics):
//   dQ pass, per (128 query rows, or 64 at value dims over 128; query head): per key tile
//     S = Q K^T and dP = dO V'^T in accumulators, dS = scale P (dP - D) with
//     P = exp(scale S - lse) recomputed, then dQ += dS K with dS fed from the accumulators
//     as A-fragments.
//   dK/dV' pass, per (64 compacted keys, kv head): over the query heads of the group and
//     the query tiles that see the keys, S^T = K Q^T and dP^T = V' dO^T, then
//     dV' += P^T dO and dK += dS^T Q; finally dk, dv = p dv' and this head's <dv', v> go
//     to the keys' positions as in the tiled kernel.
// Each warp keeps its 16 rows of dK and dV' (dQ: 16 or 32) in registers, which at head
// dims past 320 together takes two dK/dV kernels (KeyGrads).

// Which of a key block's gradients a dK/dV kernel forms. A warp's accumulators hold its
// 16 keys' dk and dv': (DK + DV) / 2 fp32 registers a thread, 160 at head dims of
// 128 x 192, where ptxas already spills (24 bytes). Past 320 (a head dim of 256 beside
// one over 64, or 128 beside 256) two kernels visit the same query tiles: Keys forms dk
// from S^T, dP^T and dS^T Q (three products a tile), Values dv' from S^T and P^T dO (two)
// with dv and the router's share; five products where one kernel makes four.
enum class KeyGrads { Both, Keys, Values };

template <int DK, int DV>
struct MmaBackwardShape {
  static constexpr int kTile = DK > 128 || DV > 128 ? 32 : 64;  // queries (dK/dV)
  static constexpr int ldk = DK + 8, ldv = DV + 8;
  static constexpr bool kSplitKeyGrads = DK + DV > 320;
  // dQ: kDqM row tiles of 16 rows per warp. Up to head dims of 128 that is two (dQ fits the
  // registers twice), so each K, V' fragment a warp reads from shared memory feeds two
  // products, as in the forward: with one, the dQ kernel was bound by shared memory (L1 at
  // 73% on the H200, about 300 bytes read a product; 213 with two). Its 128-row blocks
  // then take 32-key tiles: S and dS for two row tiles of 64 keys beside dQ took 254
  // registers and spilled (ptxas, sm_90) at head dims of 128, and at 64 too.
  static constexpr int kDqM = DK <= 128 && DV <= 128 ? 2 : 1;
  static constexpr int kDqRows = kMmaRows * kDqM;
  static constexpr int kDqKeys = kDqM == 2 ? 32 : kTile;
  // dQ: Q and dO, then two slots of K and V';  dK/dV: K and V' (KeyGrads::Values: K alone,
  // its products read no V'), then two slots of Q and dO
  static constexpr size_t dq_bytes = size_t((kDqRows + 2 * kDqKeys) * (ldk + ldv)) * 2;
  static constexpr size_t dkdv_bytes(KeyGrads part = KeyGrads::Both) {
    return size_t(kMmaRows * (part == KeyGrads::Values ? ldk : ldk + ldv) +
                  2 * kTile * (ldk + ldv)) * 2;
  }
};

// Issues the copies of the backward's query rows [q0, q0 + BQ) of head h: Q's element
// (r, c) to q_place(r, c) and dO's to o_place(r, c) (zeros past T), by kThreads threads.
template <int DK, int DV, int BQ, int kThreads = kMmaThreads, class QPlace, class OPlace>
__device__ void issue_query_rows_to(const AttentionArgs<bf16>& a, int64_t b, int64_t h,
                                    int64_t q0, QPlace q_place, OPlace o_place) {
  const HeadRows q_of(a.q, b, a.seq_len, a.q_heads, h, DK);
  const HeadRows o_of(a.dout, b, a.seq_len, a.q_heads, h, DV);
  issue_rows_to<DK, BQ, kThreads>(q_place, q_of, query_rows(q0, a.seq_len));
  issue_rows_to<DV, BQ, kThreads>(o_place, o_of, query_rows(q0, a.seq_len));
}
// issue_query_rows_to into sQ and sO of row strides DK + 8, DV + 8.
template <int DK, int DV, int BQ>
__device__ void issue_query_rows(const AttentionArgs<bf16>& a, int64_t b, int64_t h, int64_t q0,
                                 bf16* sQ, bf16* sO) {
  issue_query_rows_to<DK, DV, BQ>(
      a, b, h, q0, [=](int r, int c) { return sQ + r * (DK + 8) + c; },
      [=](int r, int c) { return sO + r * (DV + 8) + c; });
}

template <int DK, int DV>
__global__ void __launch_bounds__(kMmaThreads) backward_dq_mma(AttentionArgs<bf16> a) {
  begin_dependent_kernel();
  using Shape = MmaBackwardShape<DK, DV>;
  constexpr int kM = Shape::kDqM, BQ = Shape::kDqRows, BK = Shape::kDqKeys;
  constexpr int LDK = Shape::ldk, LDV = Shape::ldv, NB = BK / 8, kTileRows = kMmaRows;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [BQ][LDK]
  bf16* sO = sQ + BQ * LDK;                      // dO [BQ][LDV]
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, bounds, [4]);
  HAM_STATIC_SHARED(int, s_pos, [2 * BK]);
  HAM_STATIC_SHARED(__align__(8) float, s_pscale, [3 * BK]);  // 8-byte aligned: scale_key_columns
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const auto [b, h, g, q0, lo, hi, full_lo, full_hi] = query_block<BQ, kMmaThreads>(
      a, s_begin, s_end, bounds, [&](int64_t row, int64_t head, int64_t first) {
        issue_query_rows<DK, DV, BQ>(a, row, head, first, sQ, sO);
      });
  KeyTiles<DK, DV, BK> keys{a, b, g, lo, hi, sO + BQ * LDV, sO + BQ * LDV + 2 * BK * LDK,
                            s_pos, s_pscale};
  begin_key_tiles(keys);
  // The warp's row tile m is rows 16 (4 m + warp) .. + 15 of the block; this lane's rows in
  // it are r0[m] and r0[m] + 8.
  int r0[kM];
  float lse_log2[kM][2], delta[kM][2];
  const float scale_log2 = a.scale * kLog2e;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    r0[m] = kTileRows * m + warp * 16 + lane / 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t t = q0 + r0[m] + 8 * i;
      lse_log2[m][i] = t < a.seq_len ? float(a.lse[a.q_index(b, t, h)]) * kLog2e : 0.f;
      delta[m][i] = t < a.seq_len ? float(a.delta[a.q_index(b, t, h)]) : 0.f;
    }
  }

  float dq[kM][DK / 8][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) zero(dq[m]);
  for (int t = 0, k0 = lo; k0 < hi; ++t, k0 += BK) {
    keys.advance(t);  // tile t (and Q, dO) have landed
    const bf16 *sK = keys.k(t), *sV = keys.v(t);

    float s[kM][NB][4], ds[kM][NB][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      zero(s[m]);
      zero(ds[m]);
    }
    mma::row_tiles_times_rows<kM, DK, LDK, LDK, NB>(sQ + warp * 16 * LDK, kTileRows * LDK, sK,
                                                    s);
    mma::row_tiles_times_rows<kM, DV, LDV, LDV, NB>(sO + warp * 16 * LDV, kTileRows * LDV, sV,
                                                    ds);  // dO V^T
    if (a.p) {  // dP = dO V'^T
#pragma unroll
      for (int m = 0; m < kM; ++m) scale_key_columns(keys.tile_scales(t), ds[m]);
    }
    // dS / scale = P (dP - D); hidden pairs get 0 on boundary tiles only (a branch the
    // whole block takes alike), selected after the product so that nothing a hidden score
    // gives (2^x may overflow) survives. dQ = scale sum dS K takes the scale at its store.
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float prob = exp2_ftz(s[m][nb][e] * scale_log2 - lse_log2[m][e / 2]);
          ds[m][nb][e] = prob * (ds[m][nb][e] - delta[m][e / 2]);
        }
      }
    }
    if (!(k0 >= full_lo && k0 + BK <= full_hi)) {
      hide_outside_ranges(ds, r0, k0, s_begin, s_end, 0.f);
    }
    mma::accumulators_times_matrix<kM, NB, LDK, DK / 8>(ds, sK, dq);
  }
  store_query_grads<BQ, kMmaThreads>(a, b, h, q0, r0, dq, sQ);  // sQ: [BQ][LDK], LDK = DK + 8
}

// first_tile_sees_the_keys: a dK/dV block's first query tile (its group's first head,
// the rows from first_query rounded down to the tile) always has a row that sees one of
// its keys, since the query at a selected key's position sees that key. So the dK/dV
// kernels issue that tile's Q and dO copies before they know which tiles see the keys:
// the copies wait for the key positions only, not for the tiles' summaries and rows.
// (Were the tile unseen, its copies would land unused; were there no tile, the kernel
// waits for them before it ends.)

// Whether a QueryTiles loads its first tile's D with the rest of its rows or later.
enum class FirstDeltas { Now, Later };

// The query tiles a dK/dV block visits, in order: for each query head hh of its group, the
// tiles q_start, q_start + BQ, ... below q_end (visible_rows_end). Thread r < BQ carries
// row r of the next tile (visible range, lse, D) in registers, loaded while an earlier tile
// is worked on. The tiles are taken in order, so a tile's head and first row advance by
// steps (a 64-bit division per tile for them had cost dozens of instructions). Rows and
// heads in 32 bits (T < 2^30: check_grid), as the loop's registers are few.
template <int BQ>
struct QueryTiles {
  const AttentionArgs<bf16>& a;
  int64_t b;
  int q_start, q_end, count;
  int loaded_head, loaded_row;                // the tile in the registers
  int published_head = 0, published_row = 0;  // the tile publish() last wrote
  int next_begin = 0, next_end = 0;
  float next_lse_log2 = 0.f, next_delta = 0.f;  // lse in log2 units

  // Each head's tiles from q_start_ (a multiple of BQ) until one reaches the end end_at()
  // sets. The first tile's rows start loading here, before that end is known, so that their
  // loads wait beside visible_rows_end's instead of after them. With FirstDeltas::Later
  // their D waits for load_first_deltas(): for a kernel that loads them before its wait for
  // the kernel that forms D (backward_dkdv_wgmma).
  __device__ QueryTiles(const AttentionArgs<bf16>& args, int64_t b_, int64_t g, int64_t q_start_,
                        FirstDeltas first_deltas = FirstDeltas::Now)
      : a(args), b(b_), q_start(int(q_start_)), q_end(int(q_start_)), count(0),
        loaded_head(int(g * args.group())), loaded_row(int(q_start_)) {
    load_rows(first_deltas == FirstDeltas::Now);
  }
  // The first tile's D, where the constructor left it out (after end_at: none where no
  // tile is visited).
  __device__ void load_first_deltas() {
    const int r = int(threadIdx.x);
    if (count == 0 || r >= BQ || loaded_row + r >= a.seq_len) return;
    next_delta = float(a.delta[a.q_index(b, loaded_row + r, loaded_head)]);
  }
  // The tiles stop where one reaches q_end_; there are none (and the first tile's rows are
  // dropped) where q_end_ <= q_start.
  __device__ void end_at(int64_t q_end_) {
    q_end = int(q_end_);
    count = q_start < q_end ? (q_end - q_start + BQ - 1) / BQ * int(a.group()) : 0;
    if (count == 0) clear_rows();
  }
  // The head and first row of the tile publish() last wrote (the one to copy).
  __device__ int64_t head() const { return published_head; }
  __device__ int64_t first_row() const { return published_row; }

  // Row threadIdx.x of tile i (at loaded_head, loaded_row) into the registers (empty past T
  // or past the last tile).
  __device__ void load(int64_t i) {
    if (i < count) {
      load_rows();
    } else {
      clear_rows();
    }
  }
  __device__ void clear_rows() {
    next_begin = next_end = 0;
    next_lse_log2 = next_delta = 0.f;
  }
  __device__ void load_rows(bool with_delta = true) {
    const int r = int(threadIdx.x);
    clear_rows();
    if (r >= BQ) return;
    const int64_t t = loaded_row + r;
    if (t >= a.seq_len) return;
    const int64_t row = a.q_index(b, t, loaded_head);
    next_begin = int(a.begin[b * a.seq_len + t]);
    next_end = int(a.end[b * a.seq_len + t]);
    next_lse_log2 = float(a.lse[row]) * kLog2e;
    if (with_delta) next_delta = float(a.delta[row]);
  }

  // Tile i's rows (loaded by the previous call) into shared memory (lse times log2 e), tile
  // i + 1's loads issued, and whether any row sees a key of [k0, k_end) and whether every
  // row sees all of [k0, k0 + BK). Collective over the block (the answers come from
  // barriers, which also publish the rows). Past the last tile: rows that see nothing.
  // s_stats[r] is row r's {lse log2 e, D}.
  template <int BK>
  __device__ QueryTileVisibility publish(int64_t i, int k0, int k_end, int* s_begin, int* s_end,
                                         float2* s_stats) {
    const int r = int(threadIdx.x);
    bool sees = false, covers = true;
    if (r < BQ) {
      s_begin[r] = next_begin;
      s_end[r] = next_end;
      s_stats[r] = float2{next_lse_log2, next_delta};
      sees = next_begin < next_end && next_begin < k_end && next_end > k0;
      covers = next_begin <= k0 && k0 + BK <= next_end;
    }
    published_head = loaded_head;
    published_row = loaded_row;
    loaded_row += BQ;  // tile i + 1: the next rows of this head, or the next head's first
    if (loaded_row >= q_end) {
      loaded_row = q_start;
      ++loaded_head;
    }
    load(i + 1);
    const bool any = __syncthreads_or(sees);
    const bool all = __syncthreads_and(covers);
    return {any, all};
  }
};

// What both dK/dV kernels do around their products.

// Compacted key k0 + j's entry of the row's positions, for thread j < BK (-1 past T): read
// before the row's key count, so that the two loads overlap; load_key_block drops it past
// the count.
template <int BK>
__device__ int64_t key_position_ahead(const AttentionArgs<bf16>& a, int64_t b, int k0) {
  const int j = int(threadIdx.x);
  return j < BK && k0 + j < a.seq_len ? a.positions[b * a.seq_len + k0 + j] : -1;
}

// The block's compacted keys [k0, k_end): position (-1 past k_end) of key j < BK in
// s_pos[j], from key_at (key_position_ahead); first_query becomes the first position (the
// first query that can see one of them). Collective over the block.
template <int BK>
__device__ void load_key_block(int k0, int k_end, int64_t key_at, int* s_pos, int& first_query) {
  if (threadIdx.x == 0) first_query = INT_MAX;
  __syncthreads();
  if (int(threadIdx.x) < BK) {
    const int j = int(threadIdx.x), pos = k0 + j < k_end ? int(key_at) : -1;
    s_pos[j] = pos;
    if (pos >= 0) atomicMin(&first_query, pos);
  }
  __syncthreads();
}

// Key j < BK's value scale into s_pscale[j], from its position in s_pos[j] (this thread's
// own write). Called once the first query tile's rows are loading (QueryTiles), so that
// this load waits beside theirs, not before them or the key rows' copies; the barriers of
// the first publish() publish it.
template <int BK>
__device__ void load_key_scales(const AttentionArgs<bf16>& a, int64_t b, const int* s_pos,
                                float* s_pscale) {
  const int j = int(threadIdx.x);
  if (j < BK) s_pscale[j] = key_scale(a, b, s_pos[j]);
}

// From S^T and dP^T (the warp's 16 keys x NQ / 8 query columns, transposed products) in
// place: P^T and dS^T / scale = P^T (dP^T - D) (dK = scale sum dS^T Q takes the scale at
// its store); with ds a placeholder of one block (ND = 1: KeyGrads::Values), P^T alone.
// row_stats holds each query row's {lse log2 e, D}. Hidden pairs get 0 only when some row
// does not see every key (`covers` false: a branch the whole block takes alike), selected
// after the products so that nothing a hidden score gives (2^x may overflow) survives.
// This lane's keys are kj0 and kj0 + 8 (compacted indices); keys past the block's end lie
// past every row's range (its end is at most the row's key count).
template <int NQ, int ND>
__device__ __forceinline__ void probabilities_and_score_grads(float (&p)[NQ][4], float (&ds)[ND][4],
                                                              const float2* row_stats,
                                                              float scale_log2, bool covers,
                                                              int kj0, const int* row_begin,
                                                              const int* row_end) {
  constexpr bool kScoreGrads = ND == NQ;
  static_assert(kScoreGrads || ND == 1, "dS^T has the blocks of P^T, or is a placeholder");
  const int t4 = mma::lane_id() % 4;
#pragma unroll
  for (int nb = 0; nb < NQ; ++nb) {
    // columns 8 nb + 2 t4 and + 1: {lse, D} of each
    const float4 stats = *reinterpret_cast<const float4*>(row_stats + nb * 8 + 2 * t4);
    const float lse_log2[2] = {stats.x, stats.z}, delta[2] = {stats.y, stats.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[nb][e] = exp2_ftz(p[nb][e] * scale_log2 - lse_log2[e % 2]);
      if constexpr (kScoreGrads) ds[nb][e] = p[nb][e] * (ds[nb][e] - delta[e % 2]);
    }
  }
  if (!covers) {
#pragma unroll
    for (int nb = 0; nb < NQ; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kj = kj0 + 8 * (e / 2), r = nb * 8 + 2 * t4 + e % 2;
        const bool visible = in_range(kj, row_begin, row_end, r);
        p[nb][e] = visible ? p[nb][e] : 0.f;
        if constexpr (kScoreGrads) ds[nb][e] = visible ? ds[nb][e] : 0.f;
      }
    }
  }
}

// Scatter to the original positions: dk, dv = p dv', and this kv head's <dv', v>, for the
// block's BK keys (this lane's: key0 and key0 + 8 of the block); of these, those kPart
// forms (the other's array is a placeholder of one block), staged in `staging` (the
// block's tiles: see key_gradient_staging_elements). <dv', v> reads this lane's two
// columns of v in one 4-byte load, only where the router asks for it (a.dp_partial), all
// of them before the sums' stores (a load may not move above a store that could alias it).
template <int DK, int DV, int BK, KeyGrads kPart>
constexpr int key_gradient_staging_elements() {
  return (kPart != KeyGrads::Values ? staged_elements<DK, BK>() : 0) +
         (kPart != KeyGrads::Keys ? staged_elements<DV, BK>() : 0);
}

// after_keys_staged runs once dk is staged, its registers free (the persistent dK/dV
// kernel's L2 prefetch of its next tile).
struct NothingMore {
  __device__ void operator()() const {}
};
// How <dv', v> loads the v rows of the lane's keys: under a branch on each key's position
// (Branched), or always, from row 0 where the key is past the block's keys and its sum
// unused (Unconditional). Within the persistent dK/dV kernel's loop over key tiles, ptxas
// spilled every row loaded under the (divergent) branch right after its loads: 176 of the
// 252 bytes of spill stores at 128 x 128, all of them at 128 x 64 and 64 x 128 (sm_90a,
// nvcc 13.0). In the kernel of a block a tile the branch spills 8 bytes at 128 x 128, the
// unconditional loads 12, so it keeps the branch.
enum class ValueRowLoads { Branched, Unconditional };
template <int DK, int DV, int BK, int kThreads, KeyGrads kPart = KeyGrads::Both,
          ValueRowLoads kValueRows = ValueRowLoads::Branched, int NK, int NV,
          class AfterKeysStaged = NothingMore>
__device__ __forceinline__ void store_key_gradients(const AttentionArgs<bf16>& a, int64_t b,
                                                    int64_t g, int k0, int key0,
                                                    const int* s_pos, const float* s_pscale,
                                                    const float (&dk)[NK][4],
                                                    const float (&dv)[NV][4], bf16* staging,
                                                    const AfterKeysStaged& after_keys_staged = {}) {
  constexpr bool kDk = kPart != KeyGrads::Values, kDv = kPart != KeyGrads::Keys;
  static_assert(NK == (kDk ? DK / 8 : 1) && NV == (kDv ? DV / 8 : 1), "accumulator blocks");
  bf16* staged_dk = staging;
  bf16* staged_dv = kDk ? staging + staged_elements<DK, BK>() : staging;
  __syncthreads();  // every warp's products are done with the tiles the staging overwrites
  if constexpr (kDk) {
    const float scale[2] = {a.scale, a.scale};
    stage_accumulator_rows<DK>(staged_dk, key0, dk, scale);
  }
  after_keys_staged();
  if constexpr (kDv) {
    // <dv', v>, once dk is staged (its registers free). Up to value dims of 128 both of
    // the lane's keys' v loads go out before either sum: one round trip to memory, where a
    // key at a time, its sum's shuffles and store between, took two. Wider, a key at a
    // time: both keys' rows in registers made ptxas spill (sm_90a).
    if (a.dp_partial) {
      using Pair = Pack<bf16, 2>;
      constexpr int kKeysAtOnce = DV <= 128 ? 2 : 1;
      const int t4 = mma::lane_id() % 4;
#pragma unroll
      for (int i0 = 0; i0 < 2; i0 += kKeysAtOnce) {
        int pos[kKeysAtOnce];
        Pair v[kKeysAtOnce][DV / 8];
#pragma unroll
        for (int k = 0; k < kKeysAtOnce; ++k) {
          pos[k] = s_pos[key0 + 8 * (i0 + k)];  // the same for the 4 lanes of a quad
          constexpr bool kAlways = kValueRows == ValueRowLoads::Unconditional;
          if (kAlways || pos[k] >= 0) {
            const int row = kAlways && pos[k] < 0 ? 0 : pos[k];
            const bf16* v_row = a.v + a.kv_index(b, row, g) * DV + 2 * t4;
#pragma unroll
            for (int nb = 0; nb < DV / 8; ++nb) {
              v[k][nb] = *reinterpret_cast<const Pair*>(v_row + nb * 8);
            }
          }
        }
#pragma unroll
        for (int k = 0; k < kKeysAtOnce; ++k) {
          const int i = i0 + k;  // the lane's key key0 + 8 i: accumulator elements 2 i, 2 i + 1
          float dp_share = 0.f;
          if (pos[k] >= 0) {
#pragma unroll
            for (int nb = 0; nb < DV / 8; ++nb) {
              const Pair pair = v[k][nb];
              dp_share += dv[nb][2 * i] * load(pair.v[0]) + dv[nb][2 * i + 1] * load(pair.v[1]);
            }
          }
          dp_share = quad_sum(dp_share);
          if (pos[k] >= 0 && t4 == 0) {
            a.dp_partial[(b * a.kv_heads + g) * a.seq_len + k0 + key0 + 8 * i] = dp_share;
          }
        }
      }
    }
    const float scale[2] = {s_pscale[key0], s_pscale[key0 + 8]};
    stage_accumulator_rows<DV>(staged_dv, key0, dv, scale);
  }
  __syncthreads();
  auto key_row = [&](bf16* grads, int D) {
    return [=](int r) {
      const int pos = s_pos[r];  // -1 past the block's keys
      return pos < 0 ? nullptr : grads + a.kv_index(b, pos, g) * D;
    };
  };
  if constexpr (kDk) copy_out_staged_rows<DK, BK, kThreads>(staged_dk, key_row(a.dk, DK));
  if constexpr (kDv) copy_out_staged_rows<DV, BK, kThreads>(staged_dv, key_row(a.dv, DV));
}

// The query tiles are double-buffered: while tile i's products run, tile i + 1's Q and dO
// copies are in flight (its visibility is known a tile ahead, so unseen tiles are never
// copied). (Copying each tile once it was known to be seen, then waiting for it, left
// every tile's load latency exposed at 2 blocks per SM.) kPart: the gradients it forms
// (KeyGrads).
template <int DK, int DV, KeyGrads kPart = KeyGrads::Both>
__global__ void __launch_bounds__(kMmaThreads) backward_dkdv_mma(AttentionArgs<bf16> a) {
  begin_dependent_kernel();
  using Shape = MmaBackwardShape<DK, DV>;
  constexpr int BK = kMmaRows, BQ = Shape::kTile, LDK = Shape::ldk, LDV = Shape::ldv;
  constexpr int NQ = BQ / 8;
  constexpr bool kDk = kPart != KeyGrads::Values, kDv = kPart != KeyGrads::Keys;
  static_assert(BQ <= kMmaThreads && BK <= kMmaThreads, "a thread per row of a tile");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [BK][LDK]
  bf16* sV = sK + BK * LDK;                      // [BK][LDV], v' = p v (dP^T's alone)
  bf16* query_slots = kDk ? sV + BK * LDV : sV;  // 2 x (Q [BQ][LDK], dO [BQ][LDV])
  auto slot_q = [&](int64_t i) { return query_slots + (i % 2) * BQ * (LDK + LDV); };
  auto slot_o = [&](int64_t i) { return slot_q(i) + BQ * LDK; };
  // The query tiles' rows (visible ranges, lse, D) in three slots: tile i + 1's are
  // published while tile i - 1's products may still read theirs.
  HAM_STATIC_SHARED(int, s_pos, [BK]);
  HAM_STATIC_SHARED(int, s_begin, [3][BQ]);
  HAM_STATIC_SHARED(int, s_end, [3][BQ]);
  HAM_STATIC_SHARED(int, first_query);
  // s_stats: {lse log2 e, D} per row, so that a lane's two adjacent query columns come in
  // one 16-byte load (32 4-byte loads a tile before, a tenth of its shared-memory reads).
  HAM_STATIC_SHARED(float, s_pscale, [BK]);
  HAM_STATIC_SHARED(__align__(16) float2, s_stats, [3][BQ]);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int t4 = lane % 4;
  const BlockTile block = key_block_tile<BK>(a);
  const int64_t b = block.batch, g = block.head;
  const int k0 = int(block.tile) * BK;
  const int64_t key_at = key_position_ahead<BK>(a, b, k0);
  const int count = int(a.counts[b]);
  if (k0 >= count) return;  // past this row's keys (the whole block)
  const int k_end = min(k0 + BK, count);

  load_key_block<BK>(k0, k_end, key_at, s_pos, first_query);
  const HeadRows k_of(a.k, b, a.seq_len, a.kv_heads, g, DK);
  const HeadRows v_of(a.v, b, a.seq_len, a.kv_heads, g, DV);
  issue_rows<DK, LDK, BK>(sK, k_of, key_rows(s_pos));
  if constexpr (kDk) issue_rows<DV, LDV, BK>(sV, v_of, key_rows(s_pos));
  async_copy_commit();
  // A query sees a key only at or after the key's position.
  QueryTiles<BQ> queries(a, b, g, int64_t(first_query) / BQ * BQ);
  // Tile 0's copies go out with its rows' loads (first_tile_sees_the_keys).
  issue_query_rows<DK, DV, BQ>(a, b, queries.loaded_head, queries.loaded_row, slot_q(0),
                               slot_o(0));
  queries.end_at(visible_rows_end(a, b, k0, k_end, first_query));
  load_key_scales<BK>(a, b, s_pos, s_pscale);
  // Tile i's rows go to slot i % 3 and its copies, issued a tile ahead after the barriers
  // of publish() (tile 0's above), to slot i % 2, then committed (an empty group when it
  // is unseen or past the last tile).
  auto publish_and_issue = [&](int64_t i) {
    const int slot = int(i % 3);
    const QueryTileVisibility vis = queries.template publish<BK>(
        i, k0, k_end, s_begin[slot], s_end[slot], s_stats[slot]);
    if (vis.sees && i > 0) {
      issue_query_rows<DK, DV, BQ>(a, b, queries.head(), queries.first_row(), slot_q(i),
                                   slot_o(i));
    }
    async_copy_commit();
    return vis;
  };
  QueryTileVisibility vis = publish_and_issue(0);
  async_copy_wait<1>();  // K and V'
  if constexpr (kDk) {
    if (a.p) scale_rows<DV, LDV, BK>(sV, s_pscale);  // publish()'s barriers below publish it
  }

  const int key0 = warp * 16 + lane / 4;  // this lane's keys: key0 and key0 + 8 of the tile
  const float scale_log2 = a.scale * kLog2e;
  float dk[kDk ? DK / 8 : 1][4], dv[kDv ? DV / 8 : 1][4];  // one placeholder block when not formed
  zero(dk);
  zero(dv);
  for (int64_t i = 0; i < queries.count; ++i) {
    // Tile i's Q and dO (nothing when unseen) landed; publish()'s barriers then make them
    // visible and free tile i - 1's slots for tile i + 1's copies. (Two more barriers, one
    // before tile i + 1's copies and one after the wait, had cost every tile four.)
    async_copy_wait<0>();
    const QueryTileVisibility now = vis;
    vis = publish_and_issue(i + 1);
    if (!now.sees) continue;  // no row of this tile sees these keys
    const int slot = int(i % 3);
    const bf16 *sQ = slot_q(i), *sO = slot_o(i);

    // Transposed: rows are the warp's 16 keys, columns the tile's queries.
    float p[NQ][4], ds[NQ][4];
    zero(p);
    zero(ds);
    mma::rows_times_rows<DK, LDK, LDK, NQ, true>(sK + warp * 16 * LDK, sQ, p);  // S^T
    if constexpr (kDk) {
      mma::rows_times_rows<DV, LDV, LDV, NQ, true>(sV + warp * 16 * LDV, sO, ds);  // dP^T
    }
    // probabilities_and_score_grads written out: called here, it made ptxas spill two more
    // registers in this loop at head dims of 128 x 192 (7 spill instructions a tile, not 3).
    const int *row_begin = s_begin[slot], *row_end = s_end[slot];
    const float2* row_stats = s_stats[slot];
#pragma unroll
    for (int nb = 0; nb < NQ; ++nb) {
      // columns 8 nb + 2 t4 and + 1: {lse, D} of each
      const float4 stats = *reinterpret_cast<const float4*>(row_stats + nb * 8 + 2 * t4);
      const float lse_log2[2] = {stats.x, stats.z}, delta[2] = {stats.y, stats.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[nb][e] = exp2_ftz(p[nb][e] * scale_log2 - lse_log2[e % 2]);
        if constexpr (kDk) ds[nb][e] = p[nb][e] * (ds[nb][e] - delta[e % 2]);
      }
    }
    if (!now.covers) {
#pragma unroll
      for (int nb = 0; nb < NQ; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kj = k0 + key0 + 8 * (e / 2), r = nb * 8 + 2 * t4 + e % 2;
          const bool visible = in_range(kj, row_begin, row_end, r);
          p[nb][e] = visible ? p[nb][e] : 0.f;
          ds[nb][e] = visible ? ds[nb][e] : 0.f;
        }
      }
    }
    if constexpr (kDv) {
      mma::accumulator_times_matrix<NQ, LDV, DV / 8, true>(p, sO, dv);  // dV' += P^T dO
    }
    if constexpr (kDk) {
      mma::accumulator_times_matrix<NQ, LDK, DK / 8, true>(ds, sQ, dk);  // dK += dS^T Q
    }
  }
  if (queries.count == 0) async_copy_wait<0>();  // tile 0's copies (first_tile_sees_the_keys)
  static_assert(key_gradient_staging_elements<DK, DV, BK, kPart>() * 2 <=
                    Shape::dkdv_bytes(kPart), "the staged gradients fit the tiles");
  store_key_gradients<DK, DV, BK, kMmaThreads, kPart>(a, b, g, k0, key0, s_pos, s_pscale, dk, dv,
                                                      sK);
}

// ---- The backward on warpgroup tensor cores (sm_90a: cuda/wgmma.cuh) -----------------
// The same work as backward_dkdv_mma, each warpgroup (4 warps, 64 keys) issuing each
// product as one: S^T = K Q^T and dP^T = V' dO^T take K, V' and Q, dO from shared memory,
// dV' += P^T dO and dK += dS^T Q take P^T and dS^T from the registers the first two left
// them in (the accumulator layout is the A layout) and dO, Q from shared memory again.
// Where every warp of backward_dkdv_mma loads all of a tile's Q and dO into its registers
// for its 16 keys (the kernel that ncu found bound by shared memory, L1 at 87% on the
// H200), a warpgroup's products read each once for its 64 keys.
// Tiles are stored with the 128-byte swizzle (wgmma::swizzled_index), unpadded, from a
// 1024-byte boundary of shared memory: K, V', then two slots of Q, dO. With
// backward_dq_wgmma below, the default where wgmma runs (kWgmmaAutomaticBackward).
template <int DK, int DV>
constexpr bool kWgmmaFits = (DK == 64 || DK == 128) && (DV == 64 || DV == 128);
// The head dims the wgmma kernels take: those above, the paper's HAM heads (128 x 192) and
// 256 x 256.
template <int DK, int DV>
constexpr bool kWgmmaHeads =
    kWgmmaFits<DK, DV> || (DK == 128 && DV == 192) || (DK == 256 && DV == 256);
// Warpgroups a block of each pass where set_attention_*_wgmma is automatic (the default)
// and wgmma runs; 0 is mma.sync. Ratios of mma.sync's time to wgmma's with 1 / 2
// warpgroups on the H200 (2026-11-27, docs/gpu_results.md, twentieth session):
//   backward: 64 and 128 1.19-1.35 / 0.97-1.33; 128 x 192 1.23-1.24 / 1.26-1.31;
//     256 x 256 1.32-1.33 / 1.74-1.85;
//   forward: 128 x 128 0.85-1.04 (above 1 only at 20 documents, rho 0.5 and 1) /
//     0.73-0.98; 64 x 64 1.26-1.28 / 1.12-1.14; 128 x 192 1.08-1.11 / 1.18-1.23; 256 x 256
//     0.93-0.95 / 1.70-1.78. The forward at 64 x 128 and 128 x 64 is untimed: mma.sync.
// With the kernels of 2026-12-04 (sixty-eighth session, one run):
//   backward: 128 x 128 1.23-1.44 / 0.86-1.37; 128 x 192 1.35-1.42 / 1.31-1.38, so one
//     warpgroup there since (1.03-1.04x faster); 256 x 256 1.40-1.45 / 1.75-1.89;
//   forward: 128 x 128 1.02-1.21 in 15 of its 17 cases, 0.98-1.00 at rho 0.05 with 20
//     documents / 0.86-1.06, so one warpgroup there since; 128 x 192 1.35-1.39 /
//     1.33-1.38 (within 2%: two kept); 256 x 256 1.25-1.30 / 1.79-1.83.
template <int DK, int DV>
constexpr bool kWgmmaWide = (DK == 128 && DV == 192) || (DK == 256 && DV == 256);
template <int DK, int DV>
constexpr int kWgmmaAutomaticBackward = DK == 256 && DV == 256 ? 2 : kWgmmaHeads<DK, DV> ? 1 : 0;
template <int DK, int DV>
constexpr int kWgmmaAutomaticForward =
    kWgmmaWide<DK, DV> ? 2 : (DK == DV && (DK == 64 || DK == 128)) ? 1 : 0;
// dK and dV of a warpgroup's 64 keys beside S^T, dP^T and their bf16 copies take
// DK / 2 + DV / 2 + 3 kTile / 2 registers a thread before any other value (kTile: the
// visited tiles' rows, WgmmaBackwardShape): with tiles of 64 up to DK + DV = 256, with
// tiles of 32 up to 320 (the paper's 128 x 192: 208); beyond, two kernels form them
// (KeyGrads::Keys and ::Values, as backward_dkdv_mma splits past 320).
template <int DK, int DV>
constexpr bool kWgmmaSplitKeyGrads = DK + DV > 320;

// A block of kGroups warpgroups owns 64 kGroups rows (dK/dV: keys; dQ: queries), each
// warpgroup 64 of them, and visits tiles of kTile of the other side (queries; keys), which
// its warpgroups share: with two, each visited tile is copied from L2 once per 128 rows
// instead of 64 (as the 128-row mma.sync forward and dQ kernels do), in blocks of 8 warps
// that hold an SM alone (129 KB of shared memory at 128 x 128). The tiles are 64 rows up
// to DK + DV = 256, else 32, which halves the visited tiles' registers and shared memory
// (the 128 x 192 dK/dV kernel then forms dK and dV in one kernel, and at 256 x 256 two
// warpgroups fit in 193 KB), for twice the tiles' bookkeeping and barriers.
template <int DK, int DV, int kGroups>
struct WgmmaBackwardShape {
  static constexpr int kThreads = 128 * kGroups, kRows = 64 * kGroups;
  static constexpr int kTile = DK + DV > 256 ? 32 : 64;
  // Own rows, then two slots of visited tiles (dK/dV: K and V', then Q and dO; dQ: Q and
  // dO, then K and V), after the round-up of the dynamic shared memory to 1024 bytes.
  // KeyGrads::Values keeps no V' (its products read none).
  static constexpr size_t bytes(KeyGrads part = KeyGrads::Both, int tile = kTile) {
    return wgmma::kSwizzleAtomBytes +
           (size_t(kRows) * (part == KeyGrads::Values ? DK : DK + DV) +
            size_t(2 * tile) * (DK + DV)) * 2;
  }
};

// Query tile i of a dK/dV block: its rows published (slot i % 3 of s_begin, s_end and
// s_stats) and, where they see the block's keys, its Q and dO copies issued into slot_q(i)
// and slot_o(i) (tile 0's went out with its rows' loads); then a commit, one copy group a
// tile whether it copies or not. Collective over the block.
template <int DK, int DV, int BK, int kThreads, int BQ, class SlotQ, class SlotO>
__device__ __forceinline__ QueryTileVisibility publish_and_issue_query_tile(
    const AttentionArgs<bf16>& a, int64_t b, QueryTiles<BQ>& queries, int64_t i, int k0,
    int k_end, int (&s_begin)[3][BQ], int (&s_end)[3][BQ], float2 (&s_stats)[3][BQ],
    const SlotQ& slot_q, const SlotO& slot_o) {
  const int slot = int(i % 3);
  const QueryTileVisibility vis =
      queries.template publish<BK>(i, k0, k_end, s_begin[slot], s_end[slot], s_stats[slot]);
  if (vis.sees && i > 0) {
    issue_query_rows_to<DK, DV, BQ, kThreads>(a, b, queries.head(), queries.first_row(),
                                              SwizzledTile<BQ>{slot_q(i)},
                                              SwizzledTile<BQ>{slot_o(i)});
  }
  async_copy_commit();
  return vis;
}

// One query tile's products in a dK/dV block, those of the gradients kPart forms (the
// other's accumulator is a placeholder of one block): S^T = K Q^T and dP^T = V' dO^T, P^T and
// dS^T from them (rows: the warpgroup's 64 keys, this warp's 16; columns: the tile's
// queries), then dV' += P^T dO and dK += dS^T Q. The tiles are shared memory addresses;
// the tile's rows were published in `slot` of s_stats, s_begin and s_end; the lane's keys
// are k0 + key0 and k0 + key0 + 8.
template <int DK, int DV, int BK, int BQ, KeyGrads kPart, int NK, int NV>
__device__ __forceinline__ void accumulate_key_gradients(
    float (&dk)[NK][4], float (&dv)[NV][4], uint32_t k_tile, uint32_t v_tile, uint32_t q_tile,
    uint32_t o_tile, const float2 (&s_stats)[3][BQ], const int (&s_begin)[3][BQ],
    const int (&s_end)[3][BQ], int slot, float scale_log2, bool covers, int k0, int key0) {
  constexpr bool kDk = kPart != KeyGrads::Values, kDv = kPart != KeyGrads::Keys;
  constexpr int NQ = BQ / 8;
  float p[NQ][4], ds[kDk ? NQ : 1][4];
  wgmma::fence();
  wgmma::rows_times_rows<BQ, DK, BK, BQ>(p, k_tile, q_tile);  // S^T = K Q^T
  if constexpr (kDk) {
    wgmma::rows_times_rows<BQ, DV, BK, BQ>(ds, v_tile, o_tile);  // dP^T = V' dO^T
  }
  wgmma::commit();
  wgmma::wait<0>();
  probabilities_and_score_grads(p, ds, s_stats[slot], scale_log2, covers, k0 + key0,
                                s_begin[slot], s_end[slot]);
  // P^T and dS^T as bf16 A fragments, 16 queries each, all made before the fence (made
  // between the products, each would need a fence of its own, which ptxas inserts).
  uint32_t p_frags[kDv ? NQ / 2 : 1][4], ds_frags[kDk ? NQ / 2 : 1][4];
#pragma unroll
  for (int j = 0; j < NQ / 2; ++j) {
    if constexpr (kDv) mma::accumulator_as_a(p, j, p_frags[j]);
    if constexpr (kDk) mma::accumulator_as_a(ds, j, ds_frags[j]);
  }
  wgmma::fence();
  if constexpr (kDv) {
    wgmma::fragments_times_matrix<DV, BQ, BQ>(dv, p_frags, o_tile);  // dV' += P^T dO
  }
  if constexpr (kDk) {
    wgmma::fragments_times_matrix<DK, BQ, BQ>(dk, ds_frags, q_tile);  // dK += dS^T Q
  }
  wgmma::commit();
  // Before publish() frees this tile's slots for the copies of tile i + 2 (and before p,
  // ds and their bf16 copies are written again).
  wgmma::wait<0>();
}

// kPart: the gradients it forms (KeyGrads; split past DK + DV = 320, kWgmmaSplitKeyGrads).
template <int DK, int DV, int kGroups, KeyGrads kPart = KeyGrads::Both>
__global__ void __launch_bounds__(128 * kGroups, 1) backward_dkdv_wgmma(AttentionArgs<bf16> a) {
  // Where a.key_prologue_before_wait, its prologue runs before griddepcontrol.wait in a
  // dependent launch (cuda/dependent_launch.h), under the kernel just ahead, which writes
  // only dq and D (the dQ pass) or dk (KeyGrads::Keys): the key tile (from the order two or
  // more launches back), its positions, K and V', the query tiles' summary, the first query
  // tile's rows and their Q and dO copies, the value scales. D, from the first tile on, and
  // every write come after the wait.
  if (!a.key_prologue_before_wait) wait_for_earlier_kernels();
#if HAM_WGMMA_DEVICE
  using Shape = WgmmaBackwardShape<DK, DV, kGroups>;
  constexpr int BK = Shape::kRows, BQ = Shape::kTile, kThreads = Shape::kThreads;
  constexpr bool kDk = kPart != KeyGrads::Values, kDv = kPart != KeyGrads::Keys;
  static_assert(BQ <= kThreads && BK <= kThreads, "a thread per row of a tile");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sK = reinterpret_cast<bf16*>(wgmma::swizzle_aligned(smem_raw));  // [BK][DK] swizzled
  bf16* sV = sK + BK * DK;                         // [BK][DV] swizzled, v' = p v (dP^T's alone)
  bf16* query_slots = kDk ? sV + BK * DV : sV;     // 2 x (Q [BQ][DK], dO [BQ][DV]) swizzled
  auto slot_q = [&](int64_t i) { return query_slots + (i % 2) * BQ * (DK + DV); };
  auto slot_o = [&](int64_t i) { return slot_q(i) + BQ * DK; };
  HAM_STATIC_SHARED(int, s_pos, [BK]);
  HAM_STATIC_SHARED(int, s_begin, [3][BQ]);
  HAM_STATIC_SHARED(int, s_end, [3][BQ]);
  HAM_STATIC_SHARED(int, first_query);
  HAM_STATIC_SHARED(float, s_pscale, [BK]);
  HAM_STATIC_SHARED(__align__(16) float2, s_stats, [3][BQ]);
  mark_block(a.timeline, BlockMark::Start);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const BlockTile block = key_block_tile<BK>(a);
  const int64_t b = block.batch, g = block.head;
  const int k0 = int(block.tile) * BK;
  const int64_t key_at = key_position_ahead<BK>(a, b, k0);
  const int count = int(a.counts[b]);
  if (k0 >= count) {  // past this row's keys (the whole block)
    wait_for_earlier_kernels();
    mark_block(a.timeline, BlockMark::End);
    return;
  }
  const int k_end = min(k0 + BK, count);

  load_key_block<BK>(k0, k_end, key_at, s_pos, first_query);
  const HeadRows k_of(a.k, b, a.seq_len, a.kv_heads, g, DK);
  const HeadRows v_of(a.v, b, a.seq_len, a.kv_heads, g, DV);
  issue_rows_to<DK, BK, kThreads>(SwizzledTile<BK>{sK}, k_of, key_rows(s_pos));
  if constexpr (kDk) issue_rows_to<DV, BK, kThreads>(SwizzledTile<BK>{sV}, v_of, key_rows(s_pos));
  async_copy_commit();
  QueryTiles<BQ> queries(a, b, g, int64_t(first_query) / BQ * BQ, FirstDeltas::Later);
  // Tile 0's copies go out with its rows' loads (first_tile_sees_the_keys).
  issue_query_rows_to<DK, DV, BQ, kThreads>(a, b, queries.loaded_head, queries.loaded_row,
                                            SwizzledTile<BQ>{slot_q(0)},
                                            SwizzledTile<BQ>{slot_o(0)});
  mark_block(a.timeline, BlockMark::CopiesIssued);
  queries.end_at(visible_rows_end(a, b, k0, k_end, first_query));
  load_key_scales<BK>(a, b, s_pos, s_pscale);
  wait_for_earlier_kernels();
  let_later_kernels_launch();
  queries.load_first_deltas();
  auto publish_and_issue = [&](int64_t i) {
    return publish_and_issue_query_tile<DK, DV, BK, kThreads>(a, b, queries, i, k0, k_end, s_begin,
                                                              s_end, s_stats, slot_q, slot_o);
  };
  QueryTileVisibility vis = publish_and_issue(0);
  async_copy_wait<1>();  // K and V'
  if constexpr (kDk) {
    if (a.p) scale_rows_at<DV, BK, kThreads>(SwizzledTile<BK>{sV}, s_pscale);
  }

  // This warpgroup's 64 keys: rows 64 (warp / 4) .. of the K and V' tiles (8 swizzle atoms
  // of 1024 bytes on; 0 written as such for one warpgroup, so that the descriptors stay in
  // uniform registers).
  const uint32_t group_rows = kGroups == 1 ? 0u : uint32_t(warp / 4) * 64 * 128;
  const uint32_t k_tile = wgmma::shared_address(sK) + group_rows;
  const uint32_t v_tile = wgmma::shared_address(sV) + group_rows;
  const int key0 = warp * 16 + lane / 4;  // this lane's keys: key0 and key0 + 8 of the tile
  const float scale_log2 = a.scale * kLog2e;
  float dk[kDk ? DK / 8 : 1][4], dv[kDv ? DV / 8 : 1][4];  // one placeholder block when not formed
  zero(dk);
  zero(dv);
  for (int64_t i = 0; i < queries.count; ++i) {
    // This thread's copies (and, at i = 0, its zeroed rows and scaled V' chunks) are done;
    // the fence hands them to the tensor cores' proxy before publish()'s barriers.
    async_copy_wait<0>();
    wgmma::fence_proxy_async();
    const QueryTileVisibility now = vis;
    vis = publish_and_issue(i + 1);
    if (i == 0) mark_block(a.timeline, BlockMark::FirstTile, queries.count);
    if (!now.sees) continue;  // no row of this tile sees these keys
    const int slot = int(i % 3);
    accumulate_key_gradients<DK, DV, BK, BQ, kPart>(
        dk, dv, k_tile, v_tile, wgmma::shared_address(slot_q(i)),
        wgmma::shared_address(slot_o(i)), s_stats, s_begin, s_end, slot, scale_log2, now.covers,
        k0, key0);
  }
  if (queries.count == 0) async_copy_wait<0>();  // tile 0's copies (first_tile_sees_the_keys)
  mark_block(a.timeline, BlockMark::TilesDone);
  static_assert(key_gradient_staging_elements<DK, DV, BK, kPart>() * 2 <=
                    Shape::bytes(kPart) - wgmma::kSwizzleAtomBytes,
                "the staged gradients fit the tiles");
  store_key_gradients<DK, DV, BK, kThreads, kPart>(a, b, g, k0, key0, s_pos, s_pscale, dk, dv, sK);
  mark_block(a.timeline, BlockMark::End);
#else
  __trap();  // not launched: attention_wgmma_available() is false without sm_90a code
#endif
}

// The gradients of the keys not selected, zeroed by the dQ blocks where
// set_attention_backward_zeros_in_dq asks (a.zero_unselected), in place of the backward's
// first pass: dk[b, t, g] = 0, dv[b, t, g] = 0 and dp[b, t] = 0 for the block's rows t
// that are not selected, rows no later kernel writes. As in backward_prologue, t is
// selected exactly where the last key it sees is t: end > begin and positions[end - 1] == t.
// Only the blocks of the first query head of each kv head's group zero (dp: query head 0's),
// so each row is written once. Each warp takes kWarpRows of the block's rows, lane k row
// k of them, in three steps that leave the loads' round trips under the prologue's:
// its range loads (after the first copies are out), the position its end names (before D's
// loads), then a ballot of the rows to zero and the warp's 16-byte stores of each, DK + DV
// elements a row (after D).
template <int BQ, int kThreads>
struct UnselectedRows {
  static constexpr int kWarpRows = BQ / (kThreads / 32);
  static_assert(kWarpRows <= 32 && kWarpRows * (kThreads / 32) == BQ, "a lane a row of its warp");
  int64_t b, g, first;  // this warp's rows are first, first + 1, ...
  bool zeroes, dp_too;  // the same in the whole block
  int row = -1, begin = 0, end = 0, last_key = -1;  // this lane's (row -1: none)

  __device__ UnselectedRows(const AttentionArgs<bf16>& a, int64_t b_, int64_t h, int64_t q0)
      : b(b_), g(h / a.group()),
        first(q0 + int64_t(threadIdx.x / 32) * kWarpRows),
        zeroes(a.zero_unselected && h % a.group() == 0),
        dp_too(a.zero_unselected && a.dp_zeros != nullptr && h == 0) {
    const int lane = int(threadIdx.x % 32);
    if (zeroes && lane < kWarpRows && first + lane < a.seq_len) {
      row = int(first) + lane;
      begin = int(a.begin[b * a.seq_len + row]);
      end = int(a.end[b * a.seq_len + row]);
    }
  }
  __device__ void load_last_keys(const AttentionArgs<bf16>& a) {
    if (row >= 0 && end > begin) last_key = int(a.positions[b * a.seq_len + end - 1]);
  }
  template <int DK, int DV>
  __device__ void zero(const AttentionArgs<bf16>& a) const {
    if (!zeroes) return;
    using P = Pack<bf16, 8>;
    constexpr int kKeyPacks = DK / 8, kPacks = (DK + DV) / 8;
    const int lane = int(threadIdx.x % 32);
    uint32_t rows = __ballot_sync(kFullMask, row >= 0 && last_key != row);
    if (dp_too && (rows >> lane & 1u)) a.dp_zeros[b * a.seq_len + row] = store<bf16>(0.f);
    const P zeros{};
    while (rows != 0u) {  // the same rows in every lane
      const int k = __ffs(int(rows)) - 1;
      rows &= rows - 1u;
      const int64_t at = a.kv_index(b, first + k, g);
#pragma unroll
      for (int c = lane; c < kPacks; c += 32) {
        if (c < kKeyPacks) {
          reinterpret_cast<P*>(a.dk + at * DK)[c] = zeros;
        } else {
          reinterpret_cast<P*>(a.dv + at * DV)[c - kKeyPacks] = zeros;
        }
      }
    }
  }
};

// D = rowsum(dO o) of a block's BQ query rows, two threads a row, each half of its DV
// values in 16-byte loads, into s_delta and a.delta_out (rows past T: 0, not written).
// Where the dQ kernel runs on wgmma it forms D so (the host launches the dK/dV pass after
// it), since its rows' dO is read there anyway (the load after its copy hits L2): the
// backward reads dO from HBM once less than with D formed in backward_prologue.
// A thread's loads go out in batches of at most 8 of each tensor, all of a batch before
// any of its products: one round trip to memory at value dims up to 128, two above. (In
// four-load steps, the 128-wide loads had taken two round trips, on the dQ blocks'
// prologue path.) The sum runs over the elements in order either way.
template <int DV, int BQ, int kThreads>
__device__ void row_deltas(const AttentionArgs<bf16>& a, int64_t b, int64_t h, int64_t q0,
                           float* s_delta) {
  static_assert(kThreads == 2 * BQ && DV % 16 == 0, "two threads a row, 16 bytes a load");
  using P = Pack<bf16, 8>;
  constexpr int kHalf = DV / 2, kLoads = kHalf / 8;  // a thread's 16-byte loads a tensor
  constexpr int kBatches = (kLoads + 7) / 8, kBatch = kLoads / kBatches;
  static_assert(kBatch * kBatches == kLoads, "whole batches of loads");
  const int r = int(threadIdx.x) / 2, half = int(threadIdx.x) % 2;
  const int64_t t = q0 + r;
  float dot = 0.f;
  if (t < a.seq_len) {
    const int64_t at = a.q_index(b, t, h) * DV + half * kHalf;
    const P* dout = reinterpret_cast<const P*>(a.dout + at);
    const P* out = reinterpret_cast<const P*>(a.out + at);
#pragma unroll 1
    for (int c0 = 0; c0 < kLoads; c0 += kBatch) {
      P x[kBatch], y[kBatch];
#pragma unroll
      for (int c = 0; c < kBatch; ++c) {
        x[c] = dout[c0 + c];
        y[c] = out[c0 + c];
      }
#pragma unroll
      for (int c = 0; c < kBatch; ++c) {
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += load(x[c].v[e]) * load(y[c].v[e]);
      }
    }
  }
  dot += __shfl_xor_sync(kFullMask, dot, 1);
  if (half == 0) {
    s_delta[r] = dot;
    if (t < a.seq_len) a.delta_out[a.q_index(b, t, h)] = dot;
  }
}

// The lse of this lane's rows r0 and r0 + 8 of a dQ block's rows from q0, in log2 units
// (0 past T).
template <class T>  // bf16 (a template: device code without wgmma leaves it uninstantiated)
__device__ __forceinline__ void dq_row_lse_log2(const AttentionArgs<T>& a, int64_t b, int64_t h,
                                                int64_t q0, int r0, float (&lse_log2)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t t = q0 + r0 + 8 * i;
    lse_log2[i] = t < a.seq_len ? float(a.lse[a.q_index(b, t, h)]) * kLog2e : 0.f;
  }
}

// D of the same rows: where a.delta_out, formed by the block (row_deltas into s_delta, with
// the unselected keys' zeros where they are the block's, then a barrier); else read from
// a.delta (no barrier).
template <int DK, int DV, int BQ, int kThreads>
__device__ __forceinline__ void dq_row_deltas(const AttentionArgs<bf16>& a, int64_t b, int64_t h,
                                              int64_t q0, int r0,
                                              UnselectedRows<BQ, kThreads>& unselected,
                                              float* s_delta, float (&delta)[2]) {
  if (a.delta_out) {
    unselected.load_last_keys(a);
    row_deltas<DV, BQ, kThreads>(a, b, h, q0, s_delta);
    unselected.template zero<DK, DV>(a);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) delta[i] = s_delta[r0 + 8 * i];
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t t = q0 + r0 + 8 * i;
      delta[i] = t < a.seq_len ? float(a.delta[a.q_index(b, t, h)]) : 0.f;
    }
  }
}

// A wgmma dQ kernel's tile, from S = Q K^T and dO V^T in this lane's accumulators:
// dS / scale = P (dP - D) in place of dO V^T, with dP = dO V'^T = (dO V^T) diag(p) where
// tile_scales (the tile's value scales) is not null and P = 2^(S scale_log2 - lse_log2).
template <int NB>
__device__ __forceinline__ void tile_ds(const float (&s)[NB][4], float (&ds)[NB][4],
                                        const float* tile_scales, float scale_log2,
                                        const float (&lse_log2)[2], const float (&delta)[2]) {
  if (tile_scales != nullptr) scale_key_columns(tile_scales, ds);
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float prob = exp2_ftz(fmaf(s[nb][e], scale_log2, -lse_log2[e / 2]));
      ds[nb][e] = prob * (ds[nb][e] - delta[e / 2]);
    }
  }
}

// The dQ kernel on warpgroup tensor cores: backward_dq_mma's work for a block of 64 query
// rows (this warp's 16), key tiles of 64, every product one wgmma: S = Q K^T and
// dP = dO V^T from shared memory (Q and dO stay there, loaded once), dQ += dS K with dS
// from the registers and K, MN-major, from the tile S read. The K and V tiles are
// double-buffered as in the other kernels (KeyTiles, swizzled).
// kKeyTile: the shape's tile, or 32 or 16 at head dims up to 128 on one warpgroup
// (set_attention_backward_dq_keys; 32 the default). In 32-key tiles S and dS take half the
// registers and the key slots half the shared memory of 64, so that three blocks share an
// SM where two do, for blocks that see few keys (packed documents), at twice the tiles'
// bookkeeping. 16 halves them again, and its instance is bound to 128 registers
// (kDqBlocksAnSm): at 128 x 128 its 49 KB of shared memory and 128 registers let four
// blocks share an SM where 32-key tiles' 65 KB and 144 registers let three.
// kFromRecords: in 32- or 16-key tiles, each block starts from its query tile's
// QueryTileKeys (set_attention_backward_dq_records; query_block_from_record). An instance
// of its own, so that the default's tile loop stays as it was: with both starts in one
// kernel, ptxas gave the 128 x 128 loop 9 more instructions (sm_90a).
template <int DK, int DV, int kGroups>
constexpr bool kWgmmaDqTakesShortTiles = kGroups == 1 && kWgmmaFits<DK, DV>;
template <int kKeyTile>
constexpr int kDqBlocksAnSm = kKeyTile == 16 ? 4 : 1;
template <int DK, int DV, int kGroups, int kKeyTile = WgmmaBackwardShape<DK, DV, kGroups>::kTile,
          bool kFromRecords = false>
__global__ void __launch_bounds__(128 * kGroups, kDqBlocksAnSm<kKeyTile>)
    backward_dq_wgmma(AttentionArgs<bf16> a) {
  // Its prologue runs before griddepcontrol.wait where launched as a dependent launch
  // (cuda/dependent_launch.h), under the kernel just ahead: summarize_query_tiles, which
  // writes only the query tiles' summary. The rows' ranges, the key positions, Q, dO, K, V,
  // the value scales and the lse come from the compaction, the forward and the caller, two
  // or more launches back. The records are the summary's: a block from them waits first.
  // D, dq and (where a.zero_unselected) the unselected keys' zeros are written after the
  // wait.
  if constexpr (kFromRecords) wait_for_earlier_kernels();
#if HAM_WGMMA_DEVICE
  using Shape = WgmmaBackwardShape<DK, DV, kGroups>;
  constexpr int BQ = Shape::kRows, BK = kKeyTile, NB = BK / 8, kThreads = Shape::kThreads;
  constexpr bool kShortTile = BK == 32 || BK == 16;
  static_assert(BK == Shape::kTile || (kShortTile && kWgmmaDqTakesShortTiles<DK, DV, kGroups>),
                "the shape's key tile, or 32 or 16 where kWgmmaDqTakesShortTiles");
  static_assert(!kFromRecords || (kShortTile && kWgmmaDqTakesShortTiles<DK, DV, kGroups>),
                "records in the 32- or 16-key tiles of one warpgroup");
  static_assert(BQ <= kThreads && BK <= kThreads, "a thread per row of a tile");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(wgmma::swizzle_aligned(smem_raw));  // [BQ][DK] swizzled
  bf16* sO = sQ + BQ * DK;                      // dO [BQ][DV] swizzled
  bf16* key_slots = sO + BQ * DV;               // 2 x K [BK][DK], then 2 x V [BK][DV]
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, bounds, [4]);
  HAM_STATIC_SHARED(int, s_pos, [2 * BK]);
  HAM_STATIC_SHARED(__align__(8) float, s_pscale, [3 * BK]);  // 8-byte aligned: scale_key_columns
  mark_block(a.timeline, BlockMark::Start);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  auto issue_own_rows = [&](int64_t row, int64_t head, int64_t first) {
    issue_query_rows_to<DK, DV, BQ, kThreads>(a, row, head, first, SwizzledTile<BQ>{sQ},
                                              SwizzledTile<BQ>{sO});
  };
  // One warpgroup's 64 rows are a query tile of the summary: kFromRecords starts from its
  // record.
  const QueryTileKeys* record = nullptr;
  QueryRange own_range;
  auto start_block = [&]() -> QueryBlock {
    if constexpr (kFromRecords) {
      return query_block_from_record<BQ, kThreads>(a, record, own_range, issue_own_rows);
    } else {
      return query_block<BQ, kThreads>(a, s_begin, s_end, bounds, issue_own_rows);
    }
  };
  const auto [b, h, g, q0, lo, hi, full_lo, full_hi] = start_block();
  KeyTiles<DK, DV, BK, true, kThreads> keys{a, b, g, lo, hi, key_slots,
                                            key_slots + 2 * BK * DK, s_pos, s_pscale};
  if constexpr (kFromRecords) {
    begin_key_tiles(keys, record->first_positions);
    mark_block(a.timeline, BlockMark::CopiesIssued);
    store_query_ranges<BQ>(own_range, s_begin, s_end);  // advance(0)'s barrier publishes them
  } else {
    begin_key_tiles(keys);
    mark_block(a.timeline, BlockMark::CopiesIssued);
  }
  // This lane's rows: r0[0] and r0[0] + 8 of the block.
  const int r0[1] = {warp * 16 + lane / 4};
  UnselectedRows<BQ, kThreads> unselected(a, b, h, q0);  // where the first pass's zeros are ours
  float lse_log2[2], delta[2];
  dq_row_lse_log2(a, b, h, q0, r0[0], lse_log2);
  wait_for_earlier_kernels();  // the first tile's copies are on their way
  let_later_kernels_launch();
  // D formed here (where a.delta_out), while the key tiles' copies are on their way.
  HAM_STATIC_SHARED(float, s_delta, [BQ]);
  dq_row_deltas<DK, DV>(a, b, h, q0, r0[0], unselected, s_delta, delta);
  // This warpgroup's 64 rows: rows 64 (warp / 4) .. of the Q and dO tiles.
  const uint32_t group_rows = kGroups == 1 ? 0u : uint32_t(warp / 4) * 64 * 128;
  const uint32_t q_tile = wgmma::shared_address(sQ) + group_rows;
  const uint32_t o_tile = wgmma::shared_address(sO) + group_rows;
  const float scale_log2 = a.scale * kLog2e;
  float dq[1][DK / 8][4];  // one row tile (store_query_grads' shape)
  zero(dq[0]);
  for (int t = 0, k0 = lo; k0 < hi; ++t, k0 += BK) {
    keys.advance(t);  // tile t (and Q, dO) have landed, fenced for the tensor cores
    if (t == 0) mark_block(a.timeline, BlockMark::FirstTile, (hi - k0 + BK - 1) / BK);
    const uint32_t k_tile = wgmma::shared_address(keys.k(t));
    const uint32_t v_tile = wgmma::shared_address(keys.v(t));

    float s[1][NB][4], ds[1][NB][4];  // one row tile (hide_outside_ranges' shape)
    wgmma::fence();
    wgmma::rows_times_rows<BK, DK, BQ, BK>(s[0], q_tile, k_tile);   // S = Q K^T
    wgmma::rows_times_rows<BK, DV, BQ, BK>(ds[0], o_tile, v_tile);  // dO V^T
    wgmma::commit();
    wgmma::wait<0>();
    // dS / scale = P (dP - D); hidden pairs 0 on boundary tiles only, as in backward_dq_mma.
    tile_ds(s[0], ds[0], a.p ? keys.tile_scales(t) : nullptr, scale_log2, lse_log2, delta);
    if (!(k0 >= full_lo && k0 + BK <= full_hi)) {
      hide_outside_ranges(ds, r0, k0, s_begin, s_end, 0.f);
    }
    uint32_t ds_frags[NB / 2][4];  // dS as bf16 A fragments of 16 keys, made before the fence
#pragma unroll
    for (int j = 0; j < NB / 2; ++j) mma::accumulator_as_a(ds[0], j, ds_frags[j]);
    wgmma::fence();
    wgmma::fragments_times_matrix<DK, BK, BK>(dq[0], ds_frags, k_tile);  // dQ += dS K
    wgmma::commit();
    wgmma::wait<0>();  // before advance() refills this tile's slot
  }
  mark_block(a.timeline, BlockMark::TilesDone);
  if constexpr (kGroups == 1) {
    static_assert(staged_elements<DK, BQ>() <= BQ * (DK + DV), "the staged dq fits Q and dO");
    store_query_grads<BQ, kThreads>(a, b, h, q0, r0, dq, sQ);
  } else {
    // Staged, the two warpgroups' instance at 128 x 192 moved its tile loop's descriptors
    // out of the uniform registers (ptxas, sm_90a: 54 more instructions a tile).
    bf16* dq_rows[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t token = q0 + r0[0] + 8 * i;
      dq_rows[i] = token < a.seq_len ? a.dq + a.q_index(b, token, h) * DK : nullptr;
    }
    const float scale[2] = {a.scale, a.scale};
    write_accumulator_rows<DK>(dq_rows, dq[0], scale);
  }
  mark_block(a.timeline, BlockMark::End);
#else
  __trap();  // not launched: attention_wgmma_available() is false without sm_90a code
#endif
}

// The forward on warpgroup tensor cores (where kWgmmaAutomaticForward or
// set_attention_forward_wgmma choose it): forward_mma's work for a block of 64 kGroups
// query rows, each warpgroup 64 of them (a warp 16), over key tiles of 64 that its
// warpgroups share. S = Q K^T is one wgmma from shared memory (Q loaded once, K swizzled),
// the online softmax runs on its accumulators as forward_mma's does, and O += P V' =
// (P diag(p)) V is one wgmma with P from the registers as bf16 A-fragments and V, MN-major,
// from the tile S read. Where each warp of forward_mma loads every K and V fragment of a
// tile for its rows, a warpgroup's products read each once for its 64 rows.
template <int DK, int DV, int kGroups>
struct WgmmaForwardShape {
  static constexpr int kThreads = 128 * kGroups, kRows = 64 * kGroups, kTile = 64;
  // Q, then two slots of K and of V, after the round-up of the dynamic shared memory to
  // 1024 bytes.
  static constexpr size_t bytes =
      wgmma::kSwizzleAtomBytes + (size_t(kRows) * DK + size_t(2) * kTile * (DK + DV)) * 2;
};

template <int DK, int DV, int kGroups>
__global__ void __launch_bounds__(128 * kGroups, 1) forward_wgmma(AttentionArgs<bf16> a) {
  begin_dependent_kernel();
#if HAM_WGMMA_DEVICE
  using Shape = WgmmaForwardShape<DK, DV, kGroups>;
  constexpr int BQ = Shape::kRows, BK = Shape::kTile, NB = BK / 8, VB = DV / 8;
  constexpr int kThreads = Shape::kThreads;
  static_assert(BQ <= kThreads && BK <= kThreads, "a thread per row of a tile");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(wgmma::swizzle_aligned(smem_raw));  // [BQ][DK] swizzled
  bf16* key_slots = sQ + BQ * DK;  // 2 x K [BK][DK], then 2 x V [BK][DV], swizzled
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, bounds, [4]);
  HAM_STATIC_SHARED(int, s_pos, [2 * BK]);
  HAM_STATIC_SHARED(__align__(8) float, s_pscale, [3 * BK]);  // 8-byte aligned: scale_key_columns
  mark_block(a.timeline, BlockMark::Start);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const QueryBlock qb = query_block<BQ, kThreads>(
      a, s_begin, s_end, bounds, [&](int64_t row, int64_t head, int64_t first) {
        issue_rows_to<DK, BQ, kThreads>(SwizzledTile<BQ>{sQ},
                                        HeadRows(a.q, row, a.seq_len, a.q_heads, head, DK),
                                        query_rows(first, a.seq_len));
      });
  const auto [b, h, g, q0, lo, hi, full_lo, full_hi] = qb;
  KeyTiles<DK, DV, BK, true, kThreads> keys{a, b, g, lo, hi, key_slots,
                                            key_slots + 2 * BK * DK, s_pos, s_pscale};
  begin_key_tiles(keys);
  mark_block(a.timeline, BlockMark::CopiesIssued);
  // This lane's rows: r0[0] and r0[0] + 8 of the block; its warpgroup's 64 rows start at
  // row 64 (warp / 4) of the Q tile.
  const int r0[1] = {warp * 16 + lane / 4};
  const uint32_t group_rows = kGroups == 1 ? 0u : uint32_t(warp / 4) * 64 * 128;
  const uint32_t q_tile = wgmma::shared_address(sQ) + group_rows;
  const float scale_log2 = a.scale * kLog2e;  // scores to log2 units
  float o[1][VB][4];  // one row tile (online_softmax_step's shape)
  float m_run[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
  zero(o[0]);

  for (int t = 0, k0 = lo; k0 < hi; ++t, k0 += BK) {
    keys.advance(t);  // tile t (and Q) have landed, fenced for the tensor cores
    if (t == 0) mark_block(a.timeline, BlockMark::FirstTile, (hi - k0 + BK - 1) / BK);
    const uint32_t k_tile = wgmma::shared_address(keys.k(t));
    const uint32_t v_tile = wgmma::shared_address(keys.v(t));

    float s[1][NB][4];  // one row tile (hide_outside_ranges' shape)
    wgmma::fence();
    wgmma::rows_times_rows<BK, DK, BQ, BK>(s[0], q_tile, k_tile);  // S = Q K^T
    wgmma::commit();
    wgmma::wait<0>();
    // Hidden scores become -inf, on boundary tiles only (as in forward_mma).
    if (!(k0 >= full_lo && k0 + BK <= full_hi)) {
      hide_outside_ranges(s, r0, k0, s_begin, s_end, -INFINITY);
    }
    online_softmax_step(s, m_run, l, o, scale_log2);
    if (a.p) scale_key_columns(keys.tile_scales(t), s[0]);  // P diag(p)
    uint32_t p_frags[NB / 2][4];  // P as bf16 A fragments of 16 keys, made before the fence
#pragma unroll
    for (int j = 0; j < NB / 2; ++j) mma::accumulator_as_a(s[0], j, p_frags[j]);
    wgmma::fence();
    wgmma::fragments_times_matrix<DV, BK, BK>(o[0], p_frags, v_tile);  // O += P V'
    wgmma::commit();
    wgmma::wait<0>();  // before advance() refills this tile's slot
  }
  mark_block(a.timeline, BlockMark::TilesDone);
  store_forward_rows<BQ, kThreads, int((Shape::bytes - wgmma::kSwizzleAtomBytes) / 2)>(
      a, qb, r0, o, m_run, l, scale_log2, sQ);
  mark_block(a.timeline, BlockMark::End);
#else
  __trap();  // not launched: attention_wgmma_available() is false without sm_90a code
#endif
}

// ---- The persistent forward -----------------------------------------------------------
//
// forward_wgmma's block pays, besides its tiles, a prologue (its rows' key bounds, then Q
// and the first key tile's copies landing) and an epilogue (out staged and stored) that no
// work of its own overlaps. Two blocks share an SM, but each computes its tiles one product
// after another, so the other's tiles do not fill that time: on the H200 at B4 T4096 rho
// 0.25 (seventieth session) the fixed cost was 3.5 us a block against 1.6 us a key tile,
// about a fifth of the kernel. The persistent forward (set_attention_forward_persistent) runs
// as many blocks as the SMs hold at once, each taking query tiles of 64 rows in turn (one
// warpgroup, head dims 64 and 128): right after the barrier of a tile's last key tile it
// issues the next tile's copies, Q into the other of two Q slots and its first key tile into
// the key slot the last one leaves free, from the next tile's record (QueryTileKeys, copied
// into shared memory while the tile before computes), so that they land under the last key
// tile's products and the epilogue. The key tiles count on across the block's query tiles
// (KeyTiles::begin_running). Each query tile's products and their order are
// forward_wgmma<DK, DV, 1>'s, so the outputs are the same to the bit.
//
// The query tiles go to the blocks as PersistentQueryTiles has it.

// The query tiles of 64 rows that a block of a persistent kernel takes in turn
// (forward_wgmma_persistent, backward_dq_wgmma_persistent): in rounds of gridDim.x ranks
// (block_tile's order, the heaviest first), in rank order on even rounds and reversed on odd
// ones. Rank order every round would give block 0 the heaviest tile of each, and its sum over
// the rounds about one tile's work more than the last block's. Unlike the hardware's
// scheduling this is fixed in advance: a block whose tiles took longer is not relieved.
// Each tile starts from its record (QueryTileKeys, a.query_tile_keys), which the block
// copies into shared memory while the tile before it computes.
// (A template, so that device code without wgmma, where no kernel uses it, leaves it
// uninstantiated.)
// The rank a persistent block `me` of `blocks` takes in round i: rank order on even rounds,
// reversed on odd ones (PersistentQueryTiles says why).
__device__ __forceinline__ int64_t persistent_rank(int64_t i, int blocks, int me) {
  return i * blocks + (i % 2 == 0 ? me : blocks - 1 - me);
}

template <int kRows = kQueryTileRows>
struct PersistentQueryTiles {
  static_assert(kRows == kQueryTileRows, "the records' tiles");
  static constexpr int kRecordCopies = int(sizeof(QueryTileKeys) / 16);
  static_assert(sizeof(QueryTileKeys) % 16 == 0, "a record in 16-byte copies");
  const AttentionArgs<bf16>& a;
  // In 32 bits (fewer than 2^31 tiles: persistent_grid), which ptxas holds in half the
  // registers: in 64 bits the 128 x 128 dQ kernel spilled.
  int tiles_per_row, tiles, blocks, me;

  __device__ explicit PersistentQueryTiles(const AttentionArgs<bf16>& args)
      : a(args),
        tiles_per_row(int((args.seq_len + kRows - 1) / kRows)),
        tiles(int(int64_t(tiles_per_row) * args.q_heads * args.batch)),
        blocks(int(gridDim.x)),
        me(int(blockIdx.x)) {}

  // The rank of this block's tile of round i; at or past `tiles`: none.
  __device__ int64_t rank_of(int64_t i) const { return persistent_rank(i, blocks, me); }
  __device__ BlockTile tile_of(int64_t rank) const {
    return block_tile<kRows>(a.seq_len, a.q_heads, a.batch, true, uint32_t(rank));
  }
  // Copies the record of the tile of `rank` (none past the last) into `to`, and commits.
  __device__ void copy_record(int64_t rank, QueryTileKeys* to) const {
    const int c = int(threadIdx.x);
    if (rank < tiles && c < kRecordCopies) {
      const BlockTile tile = tile_of(rank);
      const QueryTileKeys* from =
          a.query_tile_keys + tile.batch * int64_t(tiles_per_row) + tile.tile;
      async_copy_16(reinterpret_cast<char*>(to) + 16 * c,
                    reinterpret_cast<const char*>(from) + 16 * c);
    }
    async_copy_commit();
  }
  // The tile of `rank` with its record's bounds (the record in shared memory, landed).
  __device__ QueryBlock block_of(int64_t rank, const QueryTileKeys& record) const {
    const BlockTile tile = tile_of(rank);
    const int64_t b = tile.batch, h = tile.head, q0 = tile.tile * kRows;
    return {b, h, h / a.group(), q0, record.lo, record.hi, record.full_lo, record.full_hi};
  }
  // Its rows' ranges into `range` (the thread of row r; loads, first read when stored).
  __device__ void load_range(const QueryBlock& qb, QueryRange& range) const {
    const int r = int(threadIdx.x);
    range = QueryRange{};
    if (r < kRows && qb.q0 + r < a.seq_len) {
      range.begin = int(a.begin[qb.b * a.seq_len + qb.q0 + r]);
      range.end = int(a.end[qb.b * a.seq_len + qb.q0 + r]);
    }
  }
  // Where qb sees a key: `keys` moved onto qb's key tiles, counted on from the block's tile
  // t0, and that tile's copies issued (KeyTiles::start_running; not committed).
  template <class Keys>
  __device__ static void start_keys(Keys& keys, const QueryBlock& qb, int t0,
                                    const QueryTileKeys& record) {
    if (qb.lo < qb.hi) keys.start_running(qb, t0, record.first_positions);  // same in every thread
  }
};

template <int DK, int DV>
struct PersistentForwardShape {
  static constexpr int kRows = 64, kTile = 64, kThreads = 128;
  // A Q slot holds a tile's Q rows, then its staged out rows (store_forward_rows), whole
  // swizzle atoms, so that the next slot and the key slots stay aligned to them.
  static constexpr size_t q_slot_bytes =
      (std::max(size_t(kRows) * DK, size_t(staged_elements<DV, kRows>())) * 2 +
       wgmma::kSwizzleAtomBytes - 1) /
      wgmma::kSwizzleAtomBytes * wgmma::kSwizzleAtomBytes;
  // The two Q slots, two slots of K and of V, then two records (the copies' destination is
  // dynamic shared memory), after the round-up to 1024 bytes.
  static constexpr size_t key_slot_bytes = size_t(2) * kTile * (DK + DV) * 2;
  static constexpr size_t bytes = wgmma::kSwizzleAtomBytes + 2 * q_slot_bytes + key_slot_bytes +
                                  2 * sizeof(QueryTileKeys);
};

template <int DK, int DV>
__global__ void __launch_bounds__(128, 1) forward_wgmma_persistent(AttentionArgs<bf16> a) {
  begin_dependent_kernel();  // the records come from the launch just ahead
#if HAM_WGMMA_DEVICE
  using Shape = PersistentForwardShape<DK, DV>;
  constexpr int BQ = Shape::kRows, BK = Shape::kTile, NB = BK / 8, VB = DV / 8;
  constexpr int kThreads = Shape::kThreads;
  static_assert(BQ == kQueryTileRows && BK <= kRecordKeys &&
                    PersistentQueryTiles<BQ>::kRecordCopies <= kThreads,
                "a query tile's record gives its first key tile");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  unsigned char* aligned = wgmma::swizzle_aligned(smem_raw);
  // Q slot i % 2 (an address computed, not an array indexed: ptxas put such an array on the
  // stack).
  auto q_slot = [aligned](int64_t i) {
    return reinterpret_cast<bf16*>(aligned + (i & 1) * Shape::q_slot_bytes);
  };
  bf16* key_slots = reinterpret_cast<bf16*>(aligned + 2 * Shape::q_slot_bytes);
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, s_pos, [2 * BK]);
  HAM_STATIC_SHARED(__align__(8) float, s_pscale, [3 * BK]);  // 8-byte aligned: scale_key_columns
  // The current tile's rank, its timeline entry, written and read by the stamping thread
  // (thread 0) alone while recording: in shared memory, so that no register holds it across
  // the tiles.
  HAM_STATIC_SHARED(int, s_entry);
  // Query tile i's record in slot i % 2.
  QueryTileKeys* s_records = reinterpret_cast<QueryTileKeys*>(
      aligned + 2 * Shape::q_slot_bytes + Shape::key_slot_bytes);
  const PersistentQueryTiles<BQ> queries(a);
  KeyTiles<DK, DV, BK, true, kThreads> keys{a, 0, 0, 0, 0, key_slots, key_slots + 2 * BK * DK,
                                            s_pos, s_pscale};
  // Starts the query tile of `rank` from its record, its key tiles from the block's key tile
  // t0: its rows' ranges into `range`, and where it sees a key, the copies of Q into q_slot
  // and of its first key tile, committed.
  QueryRange range;
  auto start = [&](int64_t rank, int t0, bf16* q_slot, const QueryTileKeys& record) {
    const QueryBlock qb = queries.block_of(rank, record);
    queries.load_range(qb, range);
    if (qb.lo < qb.hi) {  // the same in every thread
      issue_rows_to<DK, BQ, kThreads>(SwizzledTile<BQ>{q_slot},
                                      HeadRows(a.q, qb.b, a.seq_len, a.q_heads, qb.h, DK),
                                      query_rows(qb.q0, a.seq_len));
    }
    PersistentQueryTiles<BQ>::start_keys(keys, qb, t0, record);
    async_copy_commit();
    return qb;
  };

  if (queries.rank_of(0) >= queries.tiles) return;  // cannot happen: a block a tile at most
  queries.copy_record(queries.rank_of(0), &s_records[0]);
  async_copy_wait<0>();
  __syncthreads();
  QueryBlock qb = start(queries.rank_of(0), 0, q_slot(0), s_records[0]);
  if (qb.lo < qb.hi) keys.load_first_scales(s_records[0].first_positions);
  // This lane's rows: r0[0] and r0[0] + 8 of the tile.
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int r0[1] = {warp * 16 + lane / 4};
  const float scale_log2 = a.scale * kLog2e;  // scores to log2 units
  int t = 0;  // the block's key tiles so far: tile t in key slot t % 2, its scales in t % 3
  for (int64_t i = 0;; ++i) {
    // Query tile i: its rows' ranges and first key tile's scales, for advance(t)'s barrier to
    // publish; then tile i + 1's record on its way (the slot's last reader, tile i - 1's
    // start, is behind tile i - 1's epilogue's barriers).
    if (a.timeline != nullptr && threadIdx.x == 0) s_entry = int(queries.rank_of(i));
    mark_entry(a.timeline, &s_entry, BlockMark::Start);
    mark_entry(a.timeline, &s_entry, BlockMark::CopiesIssued);
    store_query_ranges<BQ>(range, s_begin, s_end);
    if (qb.lo < qb.hi) keys.store_first_scale(t);
    const int64_t next_rank = queries.rank_of(i + 1);
    const bool has_next = next_rank < queries.tiles;
    const QueryTileKeys& next_record = s_records[(i + 1) % 2];
    queries.copy_record(next_rank, &s_records[(i + 1) % 2]);
    QueryBlock next_qb{};
    const uint32_t q_tile = wgmma::shared_address(q_slot(i));
    float o[1][VB][4];  // as in forward_wgmma<DK, DV, 1>
    float m_run[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
    zero(o[0]);
    for (int k0 = qb.lo; k0 < qb.hi; ++t, k0 += BK) {
      keys.advance(t);  // tile t (and Q, and the next record) have landed
      if (k0 == qb.lo) {
        mark_entry(a.timeline, &s_entry, BlockMark::FirstTile,
                   (qb.hi - k0 + BK - 1) / BK);
      }
      // After the last key tile's barrier: key slot (t + 1) % 2 and the other Q slot are free.
      if (k0 + BK >= qb.hi && has_next) {
        next_qb = start(next_rank, t + 1, q_slot(i + 1), next_record);
      }
      const uint32_t k_tile = wgmma::shared_address(keys.k(t));
      const uint32_t v_tile = wgmma::shared_address(keys.v(t));
      float s[1][NB][4];
      wgmma::fence();
      wgmma::rows_times_rows<BK, DK, BQ, BK>(s[0], q_tile, k_tile);  // S = Q K^T
      wgmma::commit();
      wgmma::wait<0>();
      if (!(k0 >= qb.full_lo && k0 + BK <= qb.full_hi)) {
        hide_outside_ranges(s, r0, k0, s_begin, s_end, -INFINITY);
      }
      online_softmax_step(s, m_run, l, o, scale_log2);
      if (a.p) scale_key_columns(keys.tile_scales(t), s[0]);  // P diag(p)
      uint32_t p_frags[NB / 2][4];
#pragma unroll
      for (int j = 0; j < NB / 2; ++j) mma::accumulator_as_a(s[0], j, p_frags[j]);
      wgmma::fence();
      wgmma::fragments_times_matrix<DV, BK, BK>(o[0], p_frags, v_tile);  // O += P V'
      wgmma::commit();
      wgmma::wait<0>();
    }
    if (qb.lo >= qb.hi && has_next) {
      // No key tile ran: wait for the next record, and for every thread to be past tile
      // i - 1's epilogue, which read the Q slot the next tile's copies go to.
      async_copy_wait<0>();
      __syncthreads();
      next_qb = start(next_rank, t, q_slot(i + 1), next_record);
    }
    mark_entry(a.timeline, &s_entry, BlockMark::TilesDone);
    if (has_next && next_qb.lo < next_qb.hi) keys.load_first_scales(next_record.first_positions);
    store_forward_rows<BQ, kThreads, int(Shape::q_slot_bytes / 2)>(a, qb, r0, o, m_run, l,
                                                                 scale_log2, q_slot(i));
    mark_entry(a.timeline, &s_entry, BlockMark::End);
    if (!has_next) break;
    qb = next_qb;
  }
#else
  __trap();  // not launched: attention_wgmma_available() is false without sm_90a code
#endif
}

// ---- The persistent dQ kernel ----------------------------------------------------------
//
// backward_dq_wgmma's block (one warpgroup, 32-key tiles) pays a larger prologue than the
// forward's: its rows' Q and dO copies and D = rowsum(dO o) from O and dO before its first
// tile, about 11 us a block against 1.4 us a key tile at B4 T4096 rho 0.25 on the H200
// (seventieth session: a third of the kernel). The persistent dQ kernel
// (set_attention_backward_dq_persistent) runs as many blocks as the SMs hold, each taking
// query tiles in turn (PersistentQueryTiles): at the barrier of a tile's last key tile it
// issues the next tile's first key tile (from its record) into the free key slot, and once
// that tile's S and dP products have read Q and dO, a barrier, then the next tile's Q and
// dO into their place, so that all of them land under the last tile's dQ product, the dq
// stores and the next tile's D. dq goes out from the registers (the shared memory that
// backward_dq_wgmma stages it in is where the next tile's Q lands): the same values, so the
// gradients are the same to the bit. The shared memory stays 67 KB at 128 x 128 (three
// blocks an SM, as the kernel it replaces), so D's loads (O, and the lse) still wait at each
// tile's start, with no room to copy them ahead; the lines they read are prefetched into L2
// at the barrier of the tile before's last key tile (prefetch_row_inputs), so that they
// wait on L2 rather than HBM.
template <int DK, int DV>
struct PersistentDqShape {
  static constexpr int kRows = 64, kTile = 32, kThreads = 128;
  static constexpr size_t rows_bytes = size_t(kRows) * (DK + DV) * 2;  // Q and dO
  static constexpr size_t key_slot_bytes = size_t(2) * kTile * (DK + DV) * 2;
  // Q and dO, two slots of K and of V, then two records (the copies' destination is
  // dynamic shared memory), after the round-up to 1024 bytes.
  static constexpr size_t bytes =
      wgmma::kSwizzleAtomBytes + rows_bytes + key_slot_bytes + 2 * sizeof(QueryTileKeys);
};

// Bound to three blocks an SM (168 registers), as many as the kernel it replaces holds:
// unbound, ptxas gave the 128 x 128 instance 204 registers, two blocks an SM.
template <int DK, int DV>
__global__ void __launch_bounds__(128, 3) backward_dq_wgmma_persistent(AttentionArgs<bf16> a) {
  begin_dependent_kernel();  // the records come from the launch just ahead
#if HAM_WGMMA_DEVICE
  using Shape = PersistentDqShape<DK, DV>;
  constexpr int BQ = Shape::kRows, BK = Shape::kTile, NB = BK / 8, kThreads = Shape::kThreads;
  static_assert(BQ == kQueryTileRows && BK <= kRecordKeys &&
                    PersistentQueryTiles<BQ>::kRecordCopies <= kThreads,
                "a query tile's record gives its first key tile");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  unsigned char* aligned = wgmma::swizzle_aligned(smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(aligned);  // [BQ][DK] swizzled
  bf16* sO = sQ + BQ * DK;                      // dO [BQ][DV] swizzled
  bf16* key_slots = sO + BQ * DV;               // 2 x K [BK][DK], then 2 x V [BK][DV]
  HAM_STATIC_SHARED(int, s_begin, [BQ]);
  HAM_STATIC_SHARED(int, s_end, [BQ]);
  HAM_STATIC_SHARED(int, s_pos, [2 * BK]);
  HAM_STATIC_SHARED(__align__(8) float, s_pscale, [3 * BK]);  // 8-byte aligned: scale_key_columns
  HAM_STATIC_SHARED(float, s_delta, [BQ]);
  HAM_STATIC_SHARED(int, s_entry);  // as in forward_wgmma_persistent
  // Query tile i's record in slot i % 2.
  QueryTileKeys* s_records =
      reinterpret_cast<QueryTileKeys*>(aligned + Shape::rows_bytes + Shape::key_slot_bytes);
  const PersistentQueryTiles<BQ> queries(a);
  KeyTiles<DK, DV, BK, true, kThreads> keys{a, 0, 0, 0, 0, key_slots, key_slots + 2 * BK * DK,
                                            s_pos, s_pscale};
  // Starts the query tile of `rank` from its record: its rows' ranges into `range`, and where
  // it sees a key, its first key tile's copies from the block's key tile t0, committed. (The
  // tile's QueryBlock is formed again from the record where needed, not held in registers
  // across the tile before's last products.)
  QueryRange range;
  auto start = [&](int64_t rank, int t0, const QueryTileKeys& record) {
    const QueryBlock qb = queries.block_of(rank, record);
    queries.load_range(qb, range);
    PersistentQueryTiles<BQ>::start_keys(keys, qb, t0, record);
    async_copy_commit();
  };
  // The lines that the tile of `rank`'s start loads from HBM, into L2 ahead of it: its rows'
  // lse and, where the block forms D, their O (row_deltas; dO comes with the tile's copies),
  // else their D. Issued at the barrier of the tile before's last key tile, they land under
  // its last products, where those loads had waited at each tile's start.
  auto prefetch_row_inputs = [&](int64_t rank, const QueryTileKeys& record) {
    const QueryBlock next = queries.block_of(rank, record);
    const int r = int(threadIdx.x) / 2, half = int(threadIdx.x) % 2;  // row_deltas's threads
    const int64_t t = next.q0 + r;
    if (t >= a.seq_len) return;
    const int64_t row = a.q_index(next.b, t, next.h);
    if (half == 0) prefetch_to_l2(a.lse + row);
    if (a.delta_out) {
      const bf16* out_row = a.out + row * DV + half * (DV / 2);
      for (int at = 0; at < DV / 2; at += 64) prefetch_to_l2(out_row + at);  // 128-byte lines
    } else if (half == 0) {
      prefetch_to_l2(a.delta + row);
    }
  };
  // Q and dO of qb into sQ and sO, where it sees a key, committed.
  auto issue_own_rows = [&](const QueryBlock& qb) {
    if (qb.lo < qb.hi) {
      issue_query_rows_to<DK, DV, BQ, kThreads>(a, qb.b, qb.h, qb.q0, SwizzledTile<BQ>{sQ},
                                                SwizzledTile<BQ>{sO});
    }
    async_copy_commit();
  };

  if (queries.rank_of(0) >= queries.tiles) return;  // cannot happen: a block a tile at most
  queries.copy_record(queries.rank_of(0), &s_records[0]);
  async_copy_wait<0>();
  __syncthreads();
  start(queries.rank_of(0), 0, s_records[0]);
  QueryBlock qb = queries.block_of(queries.rank_of(0), s_records[0]);
  issue_own_rows(qb);
  if (qb.lo < qb.hi) keys.load_first_scales(s_records[0].first_positions);
  // This lane's rows: r0[0] and r0[0] + 8 of the tile.
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int r0[1] = {warp * 16 + lane / 4};
  const uint32_t q_tile = wgmma::shared_address(sQ), o_tile = wgmma::shared_address(sO);
  const float scale_log2 = a.scale * kLog2e;
  int t = 0;  // the block's key tiles so far: tile t in key slot t % 2, its scales in t % 3
  for (int64_t i = 0;; ++i) {
    // Query tile i: its first key tile's scales; tile i + 1's record on its way; then
    // backward_dq_wgmma's prologue after its copies: the lse, D (and the unselected keys'
    // zeros where ours), while Q, dO and the first key tile land; then, past that barrier
    // (the last tile's masks read them after the tile's last one), its rows' ranges, for
    // advance(t)'s barrier to publish.
    if (a.timeline != nullptr && threadIdx.x == 0) s_entry = int(queries.rank_of(i));
    mark_entry(a.timeline, &s_entry, BlockMark::Start);
    mark_entry(a.timeline, &s_entry, BlockMark::CopiesIssued);
    if (qb.lo < qb.hi) keys.store_first_scale(t);
    const int64_t next_rank = queries.rank_of(i + 1);
    const bool has_next = next_rank < queries.tiles;
    const QueryTileKeys& next_record = s_records[(i + 1) % 2];
    queries.copy_record(next_rank, &s_records[(i + 1) % 2]);
    UnselectedRows<BQ, kThreads> unselected(a, qb.b, qb.h, qb.q0);
    float lse_log2[2], delta[2];
    dq_row_lse_log2(a, qb.b, qb.h, qb.q0, r0[0], lse_log2);
    dq_row_deltas<DK, DV>(a, qb.b, qb.h, qb.q0, r0[0], unselected, s_delta, delta);
    if (!a.delta_out) __syncthreads();  // dq_row_deltas's where it forms D
    store_query_ranges<BQ>(range, s_begin, s_end);
    float dq[1][DK / 8][4];  // as in backward_dq_wgmma<DK, DV, 1, 32>
    zero(dq[0]);
    for (int k0 = qb.lo; k0 < qb.hi; ++t, k0 += BK) {
      keys.advance(t);  // tile t (and Q, dO, the next record) have landed
      if (k0 == qb.lo) {
        mark_entry(a.timeline, &s_entry, BlockMark::FirstTile,
                   (qb.hi - k0 + BK - 1) / BK);
      }
      const bool last = k0 + BK >= qb.hi;
      // After the last key tile's barrier: key slot (t + 1) % 2 is free.
      if (last && has_next) {
        start(next_rank, t + 1, next_record);
        prefetch_row_inputs(next_rank, next_record);
      }
      const uint32_t k_tile = wgmma::shared_address(keys.k(t));
      const uint32_t v_tile = wgmma::shared_address(keys.v(t));
      float s[1][NB][4], ds[1][NB][4];
      wgmma::fence();
      wgmma::rows_times_rows<BK, DK, BQ, BK>(s[0], q_tile, k_tile);   // S = Q K^T
      wgmma::rows_times_rows<BK, DV, BQ, BK>(ds[0], o_tile, v_tile);  // dO V^T
      wgmma::commit();
      wgmma::wait<0>();
      if (last && has_next) {
        __syncthreads();  // every warp's S and dP have read Q and dO
        issue_own_rows(queries.block_of(next_rank, next_record));
      }
      tile_ds(s[0], ds[0], a.p ? keys.tile_scales(t) : nullptr, scale_log2, lse_log2, delta);
      if (!(k0 >= qb.full_lo && k0 + BK <= qb.full_hi)) {
        hide_outside_ranges(ds, r0, k0, s_begin, s_end, 0.f);
      }
      uint32_t ds_frags[NB / 2][4];
#pragma unroll
      for (int j = 0; j < NB / 2; ++j) mma::accumulator_as_a(ds[0], j, ds_frags[j]);
      wgmma::fence();
      wgmma::fragments_times_matrix<DK, BK, BK>(dq[0], ds_frags, k_tile);  // dQ += dS K
      wgmma::commit();
      wgmma::wait<0>();
    }
    if (qb.lo >= qb.hi && has_next) {
      // No key tile ran: wait for the next record, and for every thread to be past this
      // tile's D (s_delta) before the next tile's copies.
      async_copy_wait<0>();
      __syncthreads();
      start(next_rank, t, next_record);
      issue_own_rows(queries.block_of(next_rank, next_record));
    }
    mark_entry(a.timeline, &s_entry, BlockMark::TilesDone);
    if (has_next && next_record.lo < next_record.hi) {
      keys.load_first_scales(next_record.first_positions);
    }
    bf16* dq_rows[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t token = qb.q0 + r0[0] + 8 * e;
      dq_rows[e] = token < a.seq_len ? a.dq + a.q_index(qb.b, token, qb.h) * DK : nullptr;
    }
    const float dq_scale[2] = {a.scale, a.scale};
    write_accumulator_rows<DK>(dq_rows, dq[0], dq_scale);
    mark_entry(a.timeline, &s_entry, BlockMark::End);
    if (!has_next) break;
    qb = queries.block_of(next_rank, next_record);
  }
#else
  __trap();  // not launched: attention_wgmma_available() is false without sm_90a code
#endif
}

// ---- The persistent dK/dV kernel ------------------------------------------------------
//
// backward_dkdv_wgmma's blocks pay a fixed cost around their query tiles: at 20 documents
// and rho 0.25 on the H200 about 6.8 us of prologue (the key tile's positions, then K and V'
// and the query tiles' summary, then the first query tile's rows) and 8.4 us of epilogue
// (dk and dv staged and stored, <dv', v>) against 2.5 us a query tile (seventieth and
// seventy-sixth sessions). The persistent dK/dV kernel (set_attention_backward_dkdv_persistent)
// runs as many blocks as the SMs hold, each taking key tiles in turn (PersistentKeyTiles),
// and does for each exactly what backward_dkdv_wgmma<DK, DV, 1> does, in the same order
// (their query tiles' steps are the same functions: publish_and_issue_query_tile,
// accumulate_key_gradients), so the gradients are the same to the bit. What it gains: the
// next key tile's positions load under the current tile's K and V copies (the first round
// trip of the next prologue), and the next tile's K and V rows are prefetched into L2
// during the current tile's epilogue, so that the next prologue's copies wait on L2 rather
// than HBM; no block launch between tiles.
// Head dims 64 and 128 (one kernel forms dK and dV: kWgmmaFits), one warpgroup a block.
// Registers (sm_90a, nvcc 13.0): the kernel of a block a tile takes 255 at 128 x 128 with
// 8 bytes of spill stores; this one 255 with 76 bytes of stores and 116 of loads (128 x 64:
// 255, 64 x 128: 252, 64 x 64: 224; none). It had 416 and 536, for two reasons: nvcc
// hoisted the tiles' swizzled addresses out of the loop over key tiles and held them across
// it (opaque_zero now has them formed each key tile), and ptxas spilled the v rows that
// <dv', v> loaded under a divergent branch (ValueRowLoads::Unconditional). In machine code
// (scripts/sass_loops.py) a query tile's loop is now 837 instructions with 2 local loads,
// as in the other kernel (840, 2); it was 886 with 21. A key tile's loop adds 5 local
// stores and 28 loads, and 13 stores come once ahead of it. The same round as a function
// not inlined spilled 208 bytes in the function, besides the arguments' copy in local
// memory.

// Zero, from an instruction the compiler cannot see through, so that what is formed from it
// is formed where it is used. The persistent dK/dV kernel adds it to its shared memory's
// base: the swizzled addresses of its tiles' copies are then formed in each key tile's
// prologue, where nvcc had hoisted them out of the loop over key tiles and held them, about
// 40 registers, across the query tiles (ptxas spilled them there).
__device__ __forceinline__ int opaque_zero() {
#ifdef HAM_CUDA_EMULATOR
  return 0;
#else
  int zero;
  asm volatile("mov.u32 %0, 0;" : "=r"(zero));
  return zero;
#endif
}

// The key tiles of 64 rows that a block of the persistent dK/dV kernel takes in turn: in
// rounds of gridDim.x ranks (key_block_tile's order: the heaviest first, or the order by
// work where set_attention_backward_key_order), as PersistentQueryTiles takes query tiles
// (persistent_rank).
// Nothing is held but the arguments: the counts are formed where asked, from the kernel's
// parameters and the grid, so that no register holds them across a tile's query tiles.
template <int kRows>
struct PersistentKeyTiles {
  const AttentionArgs<bf16>& a;

  // The key tiles (fewer than 2^31: persistent_grid).
  __device__ int tiles() const {
    return int((a.seq_len + kRows - 1) / kRows * a.kv_heads * a.batch);
  }
  // The rank of this block's key tile of round i; at or past tiles(): none.
  __device__ int64_t rank_of(int64_t i) const {
    return persistent_rank(i, int(gridDim.x), int(blockIdx.x));
  }
  __device__ BlockTile tile_of(int64_t rank) const {
    return key_block_tile<kRows>(a, uint32_t(rank));
  }
};

// One key tile of the persistent dK/dV kernel: the block's tile of `round`.
template <int DK, int DV>
__device__ __forceinline__ void backward_dkdv_persistent_round(const AttentionArgs<bf16>& a,
                                                               int round) {
#if HAM_WGMMA_DEVICE
  static_assert(kWgmmaFits<DK, DV>, "one kernel forms dK and dV");
  using Shape = WgmmaBackwardShape<DK, DV, 1>;
  constexpr int BK = Shape::kRows, BQ = Shape::kTile, kThreads = Shape::kThreads;
  static_assert(BQ <= kThreads && BK <= kThreads, "a thread per row of a tile");
  static_assert(BK == kQueryTileRows, "persistent_grid counts tiles of kQueryTileRows rows");
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  // K [BK][DK], then V' [BK][DV] (v' = p v), swizzled, from a base formed afresh each key
  // tile (opaque_zero).
  bf16* sK = reinterpret_cast<bf16*>(wgmma::swizzle_aligned(smem_raw + opaque_zero()));
  bf16* sV = sK + BK * DK;
  bf16* query_slots = sV + BK * DV;  // 2 x (Q [BQ][DK], dO [BQ][DV]) swizzled
  auto slot_q = [&](int64_t i) { return query_slots + (i % 2) * BQ * (DK + DV); };
  auto slot_o = [&](int64_t i) { return slot_q(i) + BQ * DK; };
  HAM_STATIC_SHARED(int, s_pos, [BK]);
  HAM_STATIC_SHARED(int, s_begin, [3][BQ]);
  HAM_STATIC_SHARED(int, s_end, [3][BQ]);
  HAM_STATIC_SHARED(int, first_query);
  HAM_STATIC_SHARED(float, s_pscale, [BK]);
  HAM_STATIC_SHARED(__align__(16) float2, s_stats, [3][BQ]);
  HAM_STATIC_SHARED(int, s_entry);  // as in forward_wgmma_persistent
  // Thread j's key position of the next key tile (key_position_ahead), j < BK: loaded under
  // the tile before (in 32 bits: T < 2^30, check_grid).
  HAM_STATIC_SHARED(int, s_next_pos, [BK]);
  const PersistentKeyTiles<BK> tiles{a};
  // Its tile, and whether it has one more, formed again where needed rather than held.
  const BlockTile block = tiles.tile_of(tiles.rank_of(round));
  const int64_t b = block.batch, g = block.head;
  const int k0 = int(block.tile) * BK;
  auto has_next = [&] { return tiles.rank_of(round + 1) < tiles.tiles(); };
  auto next_tile = [&] { return tiles.tile_of(tiles.rank_of(round + 1)); };
  // This thread's key position: round 0's from memory, later ones' loaded a round ahead.
  const int j = int(threadIdx.x);
  const int64_t key_at = round == 0 ? key_position_ahead<BK>(a, b, k0)
                                    : (j < BK ? int64_t(s_next_pos[j]) : int64_t(-1));
  if (a.timeline != nullptr && threadIdx.x == 0) s_entry = int(tiles.rank_of(round));
  mark_entry(a.timeline, &s_entry, BlockMark::Start);
  const int count = int(a.counts[b]);
  if (k0 >= count) {  // past this row's keys (the whole tile)
    mark_entry(a.timeline, &s_entry, BlockMark::End);
    if (has_next() && j < BK) {
      const BlockTile next = next_tile();
      s_next_pos[j] = int(key_position_ahead<BK>(a, next.batch, int(next.tile) * BK));
    }
    return;
  }
  const int k_end = min(k0 + BK, count);

  // backward_dkdv_wgmma<DK, DV, 1>'s prologue. load_key_block's first barrier is also the
  // one that frees the tiles and s_pos from the previous key tile's epilogue.
  load_key_block<BK>(k0, k_end, key_at, s_pos, first_query);
  // The next key tile's positions, loading under this tile's K and V copies.
  int64_t next_key_at = -1;
  if (has_next()) {
    const BlockTile next = next_tile();
    next_key_at = key_position_ahead<BK>(a, next.batch, int(next.tile) * BK);
  }
  const HeadRows k_of(a.k, b, a.seq_len, a.kv_heads, g, DK);
  const HeadRows v_of(a.v, b, a.seq_len, a.kv_heads, g, DV);
  issue_rows_to<DK, BK, kThreads>(SwizzledTile<BK>{sK}, k_of, key_rows(s_pos));
  issue_rows_to<DV, BK, kThreads>(SwizzledTile<BK>{sV}, v_of, key_rows(s_pos));
  async_copy_commit();
  QueryTiles<BQ> queries(a, b, g, int64_t(first_query) / BQ * BQ, FirstDeltas::Later);
  issue_query_rows_to<DK, DV, BQ, kThreads>(a, b, queries.loaded_head, queries.loaded_row,
                                            SwizzledTile<BQ>{slot_q(0)},
                                            SwizzledTile<BQ>{slot_o(0)});
  mark_entry(a.timeline, &s_entry, BlockMark::CopiesIssued);
  queries.end_at(visible_rows_end(a, b, k0, k_end, first_query));
  load_key_scales<BK>(a, b, s_pos, s_pscale);
  wait_for_earlier_kernels();
  let_later_kernels_launch();
  queries.load_first_deltas();
  auto publish_and_issue = [&](int64_t i) {
    return publish_and_issue_query_tile<DK, DV, BK, kThreads>(a, b, queries, i, k0, k_end, s_begin,
                                                              s_end, s_stats, slot_q, slot_o);
  };
  QueryTileVisibility vis = publish_and_issue(0);
  async_copy_wait<1>();  // K and V'
  if (a.p) scale_rows_at<DV, BK, kThreads>(SwizzledTile<BK>{sV}, s_pscale);
  // Landed with K and V' (issued before them); read by this thread alone.
  if (j < BK) s_next_pos[j] = int(next_key_at);

  const uint32_t k_tile = wgmma::shared_address(sK), v_tile = wgmma::shared_address(sV);
  const float scale_log2 = a.scale * kLog2e;
  // This lane's keys: key0 and key0 + 8 of the tile.
  const int key0 = int(threadIdx.x / 32) * 16 + int(threadIdx.x % 32) / 4;
  float dk[DK / 8][4], dv[DV / 8][4];
  zero(dk);
  zero(dv);
  for (int64_t i = 0; i < queries.count; ++i) {  // backward_dkdv_wgmma's loop, one warpgroup
    async_copy_wait<0>();
    wgmma::fence_proxy_async();
    const QueryTileVisibility now = vis;
    vis = publish_and_issue(i + 1);
    if (i == 0) mark_entry(a.timeline, &s_entry, BlockMark::FirstTile, queries.count);
    if (!now.sees) continue;
    const int slot = int(i % 3);
    accumulate_key_gradients<DK, DV, BK, BQ, KeyGrads::Both>(
        dk, dv, k_tile, v_tile, wgmma::shared_address(slot_q(i)),
        wgmma::shared_address(slot_o(i)), s_stats, s_begin, s_end, slot, scale_log2, now.covers,
        k0, key0);
  }
  if (queries.count == 0) async_copy_wait<0>();  // tile 0's copies (first_tile_sees_the_keys)
  mark_entry(a.timeline, &s_entry, BlockMark::TilesDone);
  // The next tile's K and V rows into L2 under this tile's epilogue, once dk is staged and
  // its registers free. A position past a row's keys may name any token, or -1 past T.
  auto prefetch_next_keys = [&] {
    const int next_at = j < BK ? s_next_pos[j] : -1;
    if (has_next() && next_at >= 0 && next_at < a.seq_len) {
      const BlockTile next = next_tile();
      const int64_t row = a.kv_index(next.batch, next_at, next.head);
      const char* k_row = reinterpret_cast<const char*>(a.k + row * DK);
      const char* v_row = reinterpret_cast<const char*>(a.v + row * DV);
      for (int at = 0; at < DK * 2; at += 128) prefetch_to_l2(k_row + at);  // 128-byte lines
      for (int at = 0; at < DV * 2; at += 128) prefetch_to_l2(v_row + at);
    }
  };
  static_assert(key_gradient_staging_elements<DK, DV, BK, KeyGrads::Both>() * 2 <=
                    Shape::bytes() - wgmma::kSwizzleAtomBytes,
                "the staged gradients fit the tiles");
  store_key_gradients<DK, DV, BK, kThreads, KeyGrads::Both, ValueRowLoads::Unconditional>(
      a, b, g, k0, key0, s_pos, s_pscale, dk, dv, sK, prefetch_next_keys);
  mark_entry(a.timeline, &s_entry, BlockMark::End);
#endif
}

template <int DK, int DV>
__global__ void __launch_bounds__(128, 1) backward_dkdv_wgmma_persistent(AttentionArgs<bf16> a) {
  // As backward_dkdv_wgmma: where a.key_prologue_before_wait, the first key tile's prologue
  // runs before the wait; every later tile's comes after it.
  if (!a.key_prologue_before_wait) wait_for_earlier_kernels();
#if HAM_WGMMA_DEVICE
  const PersistentKeyTiles<WgmmaBackwardShape<DK, DV, 1>::kRows> tiles{a};
  // A block has a key tile at least (persistent_grid).
  for (int round = 0; tiles.rank_of(round) < tiles.tiles(); ++round) {
    backward_dkdv_persistent_round<DK, DV>(a, round);
  }
  wait_for_earlier_kernels();  // where no tile of the block held a key
#else
  __trap();  // not launched: attention_wgmma_available() is false without sm_90a code
#endif
}

// ---- Generic kernels (any head dims, any floating dtype) -----------------------------

constexpr int kChunk = 8;  // columns per lane per pass: a warp covers 256 columns at once

// One warp per query row (b, t, h) of forward / dq; rows = B * T * Hq.
template <class T>
__device__ __forceinline__ bool warp_query_row(const AttentionArgs<T>& a, int64_t& b, int64_t& t,
                                               int64_t& h) {
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= a.batch * a.seq_len * a.q_heads) return false;
  h = row % a.q_heads;
  t = row / a.q_heads % a.seq_len;
  b = row / (a.q_heads * a.seq_len);
  return true;
}

// scale <x, k_pos>, x a row of key_dim values; every lane gets it.
template <class T>
__device__ compute_t<T> warp_score(const AttentionArgs<T>& a, const T* x, int64_t b, int64_t pos,
                                   int64_t g) {
  using C = compute_t<T>;
  const T* key = a.k + a.kv_index(b, pos, g) * a.key_dim;
  C dot = C(0);
  for (int64_t d = threadIdx.x % 32; d < a.key_dim; d += 32) dot += C(load(x[d])) * C(load(key[d]));
  return warp_sum(dot) * a.scale;
}

template <class T>
__device__ compute_t<T> value_scale_at(const AttentionArgs<T>& a, int64_t b, int64_t pos) {
  using C = compute_t<T>;
  return a.p ? C(load(a.p[b * a.seq_len + pos])) : C(1);
}

template <class T>
__global__ void forward_generic(AttentionArgs<T> a) {
  using C = compute_t<T>;
  int64_t b, t, h;
  if (!warp_query_row(a, b, t, h)) return;
  const int lane = int(threadIdx.x % 32);
  const int64_t g = h / a.group(), row = a.q_index(b, t, h);
  const int64_t lo = a.begin[b * a.seq_len + t], hi = a.end[b * a.seq_len + t];
  const T* q_row = a.q + row * a.key_dim;
  C m = C(-INFINITY), l = C(0);
  for (int64_t kj = lo; kj < hi; ++kj) {
    const C s = warp_score(a, q_row, b, a.positions[b * a.seq_len + kj], g);
    const C m_new = s > m ? s : m;
    l = (m == C(-INFINITY) ? C(0) : l * exp_(m - m_new)) + exp_(s - m_new);
    m = m_new;
  }
  T* o_row = a.out + row * a.value_dim;
  for (int64_t c0 = 0; c0 < a.value_dim; c0 += 32 * kChunk) {
    C acc[kChunk] = {};
    for (int64_t kj = lo; kj < hi; ++kj) {
      const int64_t pos = a.positions[b * a.seq_len + kj];
      const C w = exp_(warp_score(a, q_row, b, pos, g) - m) / l * value_scale_at(a, b, pos);
      const T* v_row = a.v + a.kv_index(b, pos, g) * a.value_dim;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const int64_t c = c0 + lane + 32 * e;
        if (c < a.value_dim) acc[e] += w * C(load(v_row[c]));
      }
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int64_t c = c0 + lane + 32 * e;
      if (c < a.value_dim) o_row[c] = store<T>(acc[e]);  // 0 when nothing is visible
    }
  }
  if (lane == 0) a.lse[row] = hi > lo ? m + log_(l) : C(-INFINITY);
}

// <dO_row, v'_pos> for query row `row` and key position pos.
template <class T>
__device__ compute_t<T> warp_dprob(const AttentionArgs<T>& a, int64_t row, int64_t b, int64_t pos,
                                   int64_t g) {
  using C = compute_t<T>;
  const T* d_row = a.dout + row * a.value_dim;
  const T* v_row = a.v + a.kv_index(b, pos, g) * a.value_dim;
  C dot = C(0);
  for (int64_t c = threadIdx.x % 32; c < a.value_dim; c += 32) {
    dot += C(load(d_row[c])) * C(load(v_row[c]));
  }
  return warp_sum(dot) * value_scale_at(a, b, pos);
}

template <class T>
__global__ void backward_dq_generic(AttentionArgs<T> a) {
  using C = compute_t<T>;
  int64_t b, t, h;
  if (!warp_query_row(a, b, t, h)) return;
  const int lane = int(threadIdx.x % 32);
  const int64_t g = h / a.group(), row = a.q_index(b, t, h);
  const int64_t lo = a.begin[b * a.seq_len + t], hi = a.end[b * a.seq_len + t];
  const T* q_row = a.q + row * a.key_dim;
  const C lse = a.lse[row], delta = a.delta[row];
  for (int64_t c0 = 0; c0 < a.key_dim; c0 += 32 * kChunk) {
    C acc[kChunk] = {};
    for (int64_t kj = lo; kj < hi; ++kj) {
      const int64_t pos = a.positions[b * a.seq_len + kj];
      const C prob = exp_(warp_score(a, q_row, b, pos, g) - lse);
      const C ds = prob * (warp_dprob(a, row, b, pos, g) - delta);
      const T* k_row = a.k + a.kv_index(b, pos, g) * a.key_dim;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const int64_t c = c0 + lane + 32 * e;
        if (c < a.key_dim) acc[e] += ds * C(load(k_row[c]));
      }
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int64_t c = c0 + lane + 32 * e;
      if (c < a.key_dim) a.dq[row * a.key_dim + c] = store<T>(a.scale * acc[e]);
    }
  }
}

// One warp per (b, compacted key kj, kv head g); rows = B * T * Hkv.
template <class T>
__global__ void backward_dkdv_generic(AttentionArgs<T> a) {
  using C = compute_t<T>;
  const int64_t item = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (item >= a.batch * a.seq_len * a.kv_heads) return;
  const int lane = int(threadIdx.x % 32);
  const int64_t g = item % a.kv_heads, kj = item / a.kv_heads % a.seq_len;
  const int64_t b = item / (a.kv_heads * a.seq_len);
  if (kj >= a.counts[b]) return;
  const int64_t pos = a.positions[b * a.seq_len + kj];
  const int64_t kv_row = a.kv_index(b, pos, g);
  const C ps = value_scale_at(a, b, pos);
  const int64_t widest = a.key_dim > a.value_dim ? a.key_dim : a.value_dim;
  C dp_share = C(0);
  for (int64_t c0 = 0; c0 < widest; c0 += 32 * kChunk) {
    C acc_k[kChunk] = {}, acc_v[kChunk] = {};
    for (int64_t hh = 0; hh < a.group(); ++hh) {
      const int64_t h = g * a.group() + hh;
      for (int64_t t = pos; t < a.seq_len; ++t) {
        if (!(a.begin[b * a.seq_len + t] <= kj && kj < a.end[b * a.seq_len + t])) continue;
        const int64_t row = a.q_index(b, t, h);
        const T* q_row = a.q + row * a.key_dim;
        const T* d_row = a.dout + row * a.value_dim;
        const C prob = exp_(warp_score(a, q_row, b, pos, g) - C(a.lse[row]));
        const C ds = prob * (warp_dprob(a, row, b, pos, g) - C(a.delta[row]));
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          const int64_t c = c0 + lane + 32 * e;
          if (c < a.key_dim) acc_k[e] += a.scale * ds * C(load(q_row[c]));
          if (c < a.value_dim) acc_v[e] += prob * C(load(d_row[c]));
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int64_t c = c0 + lane + 32 * e;
      if (c < a.key_dim) a.dk[kv_row * a.key_dim + c] = store<T>(acc_k[e]);
      if (c < a.value_dim) {
        a.dv[kv_row * a.value_dim + c] = store<T>(ps * acc_v[e]);
        dp_share += acc_v[e] * C(load(a.v[kv_row * a.value_dim + c]));
      }
    }
  }
  dp_share = warp_sum(dp_share);
  if (a.dp_partial && lane == 0) a.dp_partial[(b * a.kv_heads + g) * a.seq_len + kj] = dp_share;
}

// ---- Small backward kernels ----------------------------------------------------------

// The backward's first pass, one warp per token (b, t), in place of a pass for D and
// three memsets (each a full pass over its tensor):
//   delta[b, t, h] = <dO[b, t, h], o[b, t, h]> for every query head h (f32; f64 for f64),
//   unless the dQ kernel forms it (row_deltas: delta null here);
//   dk[b, t], dv[b, t] and dp[b, t] = 0 where t is not selected (unless the wgmma dQ
//   blocks write them, UnselectedRows: this pass is then not launched); the dK/dV kernels
//   write the selected rows, and gather_value_scale_grad their dp.
// A query sees its document's keys selected so far, itself included, so t is selected
// exactly where the last key it sees is t: end > begin and positions[end - 1] == t.
// Groups of kDotLanes lanes dot one row each, kPack elements (16 bytes where the rows are
// packable) a load; the zeros are stored the same way across the warp.
constexpr int kDotLanes = 8;
template <class T>
struct BackwardPrologue {
  const T *dout, *out;
  compute_t<T>* delta;  // [B, T, Hq], or null where the dQ kernel forms D
  T *dk, *dv, *dp;      // [B, T, Hkv, Dk], [B, T, Hkv, Dv], [B, T] (dp may be null)
  const int64_t *positions, *begin, *end;
  int64_t tokens, seq_len, q_heads, kv_heads, key_dim, value_dim;
  BlockStamps* timeline = nullptr;  // while recording (cuda/block_timeline.h)
};

template <class T, int kPack>
__device__ __forceinline__ void zero_span(T* dst, int64_t n, int lane) {
  const Pack<T, kPack> zeros{};
  for (int64_t i = lane; i < n / kPack; i += 32) reinterpret_cast<Pack<T, kPack>*>(dst)[i] = zeros;
}

template <class T, int kPack>
__global__ void __launch_bounds__(kThreads) backward_prologue(BackwardPrologue<T> a) {
  begin_dependent_kernel();
  using C = compute_t<T>;
  using P = Pack<T, kPack>;
  mark_block(a.timeline, BlockMark::Start);  // thread 0's token is always one: it stamps End
  const int64_t token = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (token >= a.tokens) return;
  const int lane = int(threadIdx.x % 32), group = lane / kDotLanes, member = lane % kDotLanes;
  const int64_t seen_begin = a.begin[token], seen_end = a.end[token];  // used last
  const int64_t packs = a.value_dim / kPack;
  // The head loop's bound is the same for the whole warp, so every lane reaches the
  // shuffles; a group past the last head dots nothing. No delta: the dQ kernel forms D.
  for (int64_t h0 = 0; a.delta && h0 < a.q_heads; h0 += 32 / kDotLanes) {
    const int64_t h = h0 + group;
    C dot = C(0);
    if (h < a.q_heads) {
      const int64_t row = (token * a.q_heads + h) * a.value_dim;
      const P* dout = reinterpret_cast<const P*>(a.dout + row);
      const P* out = reinterpret_cast<const P*>(a.out + row);
#pragma unroll 4
      for (int64_t c = member; c < packs; c += kDotLanes) {
        const P x = dout[c], y = out[c];
#pragma unroll
        for (int e = 0; e < kPack; ++e) dot += C(load(x.v[e])) * C(load(y.v[e]));
      }
    }
#pragma unroll
    for (int offset = kDotLanes / 2; offset > 0; offset >>= 1) {
      dot += __shfl_xor_sync(kFullMask, dot, offset);
    }
    if (h < a.q_heads && member == 0) a.delta[token * a.q_heads + h] = dot;
  }
  const int64_t t = token % a.seq_len, row_start = token - t;
  const bool selected = seen_end > seen_begin && a.positions[row_start + seen_end - 1] == t;
  if (!selected) {
    zero_span<T, kPack>(a.dk + token * a.kv_heads * a.key_dim, a.kv_heads * a.key_dim, lane);
    zero_span<T, kPack>(a.dv + token * a.kv_heads * a.value_dim, a.kv_heads * a.value_dim,
                        lane);
    if (a.dp && lane == 0) a.dp[token] = store<T>(C(0));
  }
  mark_block(a.timeline, BlockMark::End);
}

// tiles[b, j] = the QueryTileRange of rows [64 j, 64 j + 64) of batch row b, one warp each,
// and keys[b, j] their QueryTileKeys where keys is not null.
__global__ void summarize_query_tiles(const int64_t* begin, const int64_t* end,
                                      const int64_t* positions, int64_t batch, int64_t seq_len,
                                      QueryTileRange* tiles, QueryTileKeys* keys,
                                      BlockStamps* timeline) {
  begin_dependent_kernel();
  mark_block(timeline, BlockMark::Start);  // thread 0's tile is always one: it stamps End
  const int64_t tiles_per_row = (seq_len + kQueryTileRows - 1) / kQueryTileRows;
  const int64_t n = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (n >= batch * tiles_per_row) return;
  const int64_t b = n / tiles_per_row, t0 = n % tiles_per_row * kQueryTileRows;
  const int lane = int(threadIdx.x % 32);
  int least_begin = INT_MAX, greatest_end = 0;
  // The intersection: rows past T have the empty range [0, 0).
  int greatest_begin = 0, least_end = t0 + kQueryTileRows > seq_len ? 0 : INT_MAX;
  for (int64_t t = t0 + lane; t < std::min(t0 + kQueryTileRows, seq_len); t += 32) {
    const int row_begin = int(begin[b * seq_len + t]), row_end = int(end[b * seq_len + t]);
    if (row_begin < row_end) {
      least_begin = std::min(least_begin, row_begin);
      greatest_end = std::max(greatest_end, row_end);
    }
    greatest_begin = std::max(greatest_begin, row_begin);
    least_end = std::min(least_end, row_end);
  }
  least_begin = -warp_max(-least_begin);
  greatest_end = warp_max(greatest_end);
  if (lane == 0) tiles[n] = QueryTileRange{least_begin, greatest_end};
  if (keys != nullptr) {
    QueryTileKeys& record = keys[n];
    greatest_begin = warp_max(greatest_begin);
    least_end = -warp_max(-least_end);
    if (lane == 0) {
      record.lo = least_begin;
      record.hi = greatest_end;
      record.full_lo = greatest_begin;
      record.full_hi = least_end;
    }
    for (int k = lane; k < kRecordKeys; k += 32) {
      // least_begin is INT_MAX where no row sees a key: no position is read then.
      const bool key = least_begin < greatest_end && k < greatest_end - least_begin;
      record.first_positions[k] = key ? int(positions[b * seq_len + least_begin + k]) : -1;
    }
  }
  mark_block(timeline, BlockMark::End);
}

// The dK/dV blocks' key tiles by their work (set_attention_backward_key_order). In rank
// order (block_tile) a key tile's work, the query tiles that see its keys, falls with its
// rank within one document, so the heaviest blocks start first. With packed documents it
// rises and falls again with every document, and heavy blocks start in the last wave: in a
// list-scheduling model of the H200's timelines (scripts/attention_block_order.py
// --documents) the dK/dV kernel at B1 T16384, 20 documents, rho 0.25 takes 1.05-1.09x as
// long in rank order as heaviest first (longest processing time first).
constexpr int kOrderThreads = 256;
constexpr int kOrderBins = 1024;
constexpr int kOrderWindow = 4096;  // key tiles whose work one pass over the query tiles counts
static_assert(kOrderBins % kOrderThreads == 0 && kOrderWindow % kOrderThreads == 0);

// order[b, rank] for rank < ceil(T / rows): batch row b's key tiles of `rows` compacted
// keys by work, heaviest first, in kOrderBins - 1 bins of equal width up to the row's
// greatest work; by index within a bin; the tiles past the row's keys last. A tile's work:
// the query tiles of query_tiles' summary whose visible keys meet it. work: scratch of
// [B, ceil(T / rows)], each entry written and read by one thread. One block a batch row.
__global__ void __launch_bounds__(kOrderThreads)
    order_key_tiles_by_work(const QueryTileRange* query_tiles, const int64_t* counts,
                            int64_t seq_len, int rows, int* work, int* order,
                            BlockStamps* timeline) {
  begin_dependent_kernel();
  HAM_STATIC_SHARED(int, window_steps, [kOrderWindow + 1]);
  HAM_STATIC_SHARED(int, bin_start, [kOrderBins]);
  HAM_STATIC_SHARED(int, chunk_bins, [kOrderThreads]);
  HAM_STATIC_SHARED(int, warp_prefix, [32]);
  HAM_STATIC_SHARED(int, carry);
  HAM_STATIC_SHARED(int, greatest);
  mark_block(timeline, BlockMark::Start);
  const int64_t b = blockIdx.x;
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  const int tiles = int((seq_len + rows - 1) / rows);
  const int query_tiles_per_row = int((seq_len + kQueryTileRows - 1) / kQueryTileRows);
  const int keys = int(counts[b]);
  int* row_work = work + b * tiles;
  int* row_order = order + b * tiles;
  for (int k = tid; k < kOrderBins; k += threads) bin_start[k] = 0;
  if (tid == 0) greatest = 0;
  // The work of a window of key tiles at a time, from a difference array of it: +1 at the
  // first tile in the window that a query tile's visible keys meet, -1 past the last.
  for (int w0 = 0; w0 < tiles; w0 += kOrderWindow) {
    const int w_end = min(tiles, w0 + kOrderWindow);
    for (int i = tid; i <= kOrderWindow; i += threads) window_steps[i] = 0;
    if (tid == 0) carry = 0;
    __syncthreads();
    for (int j = tid; j < query_tiles_per_row; j += threads) {
      const QueryTileRange range = query_tiles[b * query_tiles_per_row + j];
      if (range.begin >= range.end) continue;
      const int first = range.begin / rows, last = (range.end - 1) / rows;
      if (first < w_end && last >= w0) {
        atomicAdd(&window_steps[max(first, w0) - w0], 1);
        atomicAdd(&window_steps[min(last, w_end - 1) + 1 - w0], -1);
      }
    }
    __syncthreads();
    for (int r0 = w0; r0 < w_end; r0 += threads) {
      const int r = r0 + tid;
      const int step = r < w_end ? window_steps[r - w0] : 0;
      const int tile_work = block_exclusive_scan(step, carry, warp_prefix) + step;
      if (r < w_end) {
        const bool has_keys = int64_t(r) * rows < keys;
        row_work[r] = has_keys ? tile_work : -1;
        if (has_keys) atomicMax(&greatest, tile_work);
      }
    }
    __syncthreads();  // the window's steps are read before the next window zeroes them
  }
  __syncthreads();  // greatest (where no window ran)
  const int top = max(greatest, 1);
  auto bin_of = [&](int tile_work) {
    return tile_work < 0 ? 0 : 1 + int(int64_t(tile_work) * (kOrderBins - 2) / top);
  };
  for (int r = tid; r < tiles; r += threads) atomicAdd(&bin_start[bin_of(row_work[r])], 1);
  if (tid == 0) carry = 0;
  __syncthreads();
  // Each bin's first rank: the count of the tiles in the bins above it.
  for (int k0 = 0; k0 < kOrderBins; k0 += threads) {
    const int k = kOrderBins - 1 - (k0 + tid);
    const int in_bin = bin_start[k];
    bin_start[k] = block_exclusive_scan(in_bin, carry, warp_prefix);
  }
  __syncthreads();
  // A tile's rank: its bin's next, after the tiles of its bin before it in this chunk of
  // blockDim tiles; then the bins advance past the chunk.
  for (int r0 = 0; r0 < tiles; r0 += threads) {
    const int r = r0 + tid;
    const int bin = r < tiles ? bin_of(row_work[r]) : -1;
    chunk_bins[tid] = bin;
    __syncthreads();
    if (r < tiles) {
      int before = 0;
      for (int i = 0; i < tid; ++i) before += chunk_bins[i] == bin ? 1 : 0;
      row_order[bin_start[bin] + before] = r;
    }
    __syncthreads();
    if (r < tiles) atomicAdd(&bin_start[bin], 1);
    __syncthreads();
  }
  mark_block(timeline, BlockMark::End);
}

// dp[b, pos_kj] = sum over kv heads g, in order, of dp_partial[b, g, kj].
template <class T>
__global__ void gather_value_scale_grad(const compute_t<T>* partial, const int64_t* positions,
                                        const int64_t* counts, int64_t batch, int64_t seq_len,
                                        int64_t kv_heads, T* dp, BlockStamps* timeline) {
  begin_dependent_kernel();
  using C = compute_t<T>;
  mark_block(timeline, BlockMark::Start);
  HAM_GRID_STRIDE_LOOP(n, batch * seq_len) {
    const int64_t b = n / seq_len, kj = n % seq_len;
    if (kj >= counts[b]) continue;
    C total = C(0);
    for (int64_t g = 0; g < kv_heads; ++g) total += partial[(b * kv_heads + g) * seq_len + kj];
    dp[b * seq_len + positions[n]] = store<T>(total);
  }
  mark_block(timeline, BlockMark::End);
}

// ---- Host side -------------------------------------------------------------------------

template <class T>
AttentionArgs<T> make_args(const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& value_scale, const CompactSelection& selection,
                           double scale) {
  AttentionArgs<T> a{};
  a.q = ptr<const T>(q);
  a.k = ptr<const T>(k);
  a.v = ptr<const T>(v);
  a.p = ptr_or_null<const T>(value_scale);
  a.positions = ptr<const int64_t>(selection.key_positions);
  a.counts = ptr<const int64_t>(selection.key_counts);
  a.begin = ptr<const int64_t>(selection.visible_begin);
  a.end = ptr<const int64_t>(selection.visible_end);
  a.batch = q.size(0);
  a.seq_len = q.size(1);
  a.q_heads = q.size(2);
  a.kv_heads = k.size(2);
  a.key_dim = q.size(3);
  a.value_dim = v.size(3);
  a.scale = compute_t<T>(scale);
  return a;
}

void check_grid(const Tensor& q) {
  HAM_CHECK(q.size(1) < (int64_t(1) << 30), kOp, ": sequence length ", q.size(1),
            " too long for the CUDA kernels");
  // a token's row step (heads x head dim x 2 bytes, head dims up to 256) in a signed int32
  HAM_CHECK(q.size(2) < (int64_t(1) << 20), kOp, ": ", q.size(2),
            " query heads, too many for the CUDA kernels");
}

// The grid of block_tile<rows>: a block per tile of `rows` rows, head and batch row.
dim3 block_grid(int64_t seq_len, int rows, int64_t heads, int64_t batch) {
  const int64_t blocks = ceil_div(seq_len, rows) * heads * batch;
  HAM_CHECK(blocks < (int64_t(1) << 31), kOp, ": ", blocks, " blocks (T ", seq_len, " in tiles of ",
            rows, ", ", heads, " heads, batch ", batch, ") exceed the CUDA grid");
  return dim3(unsigned(blocks));
}

// Calls fn.template operator()<DK, DV>() when (key_dim, value_dim) has a tiled instance;
// returns whether it did.
template <class Fn>
bool dispatch_head_dims(int64_t key_dim, int64_t value_dim, Fn&& fn) {
  auto with_value_dim = [&]<int DK>() {
    switch (value_dim) {
      case 32: fn.template operator()<DK, 32>(); return true;
      case 64: fn.template operator()<DK, 64>(); return true;
      case 128: fn.template operator()<DK, 128>(); return true;
      case 192: fn.template operator()<DK, 192>(); return true;
      case 256: fn.template operator()<DK, 256>(); return true;
      default: return false;
    }
  };
  switch (key_dim) {
    case 32: return with_value_dim.template operator()<32>();
    case 64: return with_value_dim.template operator()<64>();
    case 128: return with_value_dim.template operator()<128>();
    case 256: return with_value_dim.template operator()<256>();
    default: return false;
  }
}

// Whether a tiled kernel with `bytes` of dynamic shared memory fits the device.
template <class T>
bool tiled_fits(void (*kernel)(AttentionArgs<T>), size_t bytes) {
  return bytes + static_shared_bytes(kOp, kernel) <= max_shared_per_block();
}

// Launches a tiled kernel with `bytes` of dynamic shared memory, unless that does not fit
// the device; returns whether it launched. A kernel that stamps its blocks names itself
// (`stamped`), so that a recording run gets its timeline (cuda/block_timeline.h), of an
// entry a block, or `stamped_entries` (the persistent kernels: a query tile each). Every
// tiled kernel begins with begin_dependent_kernel (the wgmma dQ and dK/dV kernels wait
// after their prologues): the launch is a dependent one where set_dependent_launches
// (cuda/dependent_launch.h).
template <class T>
bool launch_tiled(void (*kernel)(AttentionArgs<T>), dim3 grid, size_t bytes,
                  const AttentionArgs<T>& args, int threads = kTileThreads,
                  const KernelName* stamped = nullptr, int64_t stamped_entries = 0) {
  if (!tiled_fits(kernel, bytes)) return false;
  allow_dynamic_shared(kOp, kernel, bytes);
  AttentionArgs<T> launched = args;
  if (stamped != nullptr) {
    launched.timeline =
        block_timeline_for_launch(*stamped, stamped_entries > 0 ? stamped_entries : grid.x);
  }
  HAM_LAUNCH_DEPENDENT(grid, threads, bytes, launch_stream(), kernel)(launched);
  HAM_CUDA_CHECK_LAUNCH();
  return true;
}

// set_attention_forward_rows, _keys and _wgmma, set_attention_backward_wgmma
// (cuda/routed_attention.h).
std::atomic<int> g_forward_rows{128}, g_forward_keys{64},
    g_forward_wgmma{kAttentionWgmmaAutomatic},
    g_backward_wgmma{kAttentionWgmmaAutomatic};
std::atomic<int64_t> g_forward_wgmma_launches{0}, g_backward_wgmma_launches{0};
// set_attention_forward_persistent and set_attention_backward_dq_persistent, and the calls
// that ran so.
std::atomic<int> g_forward_persistent{0}, g_backward_dq_persistent{0};
std::atomic<int64_t> g_forward_persistent_launches{0}, g_backward_dq_persistent_launches{0};
// set_attention_backward_dkdv_persistent, and the calls that ran so.
std::atomic<int> g_backward_dkdv_persistent{0};
std::atomic<int64_t> g_backward_dkdv_persistent_launches{0};
// set_attention_backward_dq_keys, and the calls whose dQ ran in 32-key and in 16-key tiles.
std::atomic<int> g_backward_dq_keys{32};
std::atomic<int64_t> g_backward_dq_32_key_launches{0};
std::atomic<int64_t> g_backward_dq_16_key_launches{0};
// set_attention_backward_overlap, and the calls whose zeroing pass ran beside the others.
std::atomic<bool> g_backward_overlap{true};
std::atomic<int64_t> g_overlapped_prologues{0};
// set_attention_backward_dq_records, and the calls whose dQ blocks started from them.
std::atomic<bool> g_backward_dq_records{false};
std::atomic<int64_t> g_backward_dq_record_launches{0};
std::atomic<int64_t> g_key_prologues_before_wait{0};
// set_attention_backward_key_order, and the calls whose dK/dV blocks took their tiles so.
std::atomic<bool> g_backward_key_order{false};
std::atomic<int64_t> g_backward_key_order_launches{0};
// set_attention_backward_zeros_in_dq, and the calls whose dQ blocks wrote those zeros.
std::atomic<bool> g_backward_zeros_in_dq{true};
std::atomic<int64_t> g_backward_zeros_in_dq_launches{0};

// Warpgroups a block for a pass set (by `setter`) to `setting`, 0 for mma.sync: the
// automatic choice where wgmma runs, else 0; a pass set to wgmma where it cannot run is an
// error.
int wgmma_groups(int setting, const char* pass, const char* setter, int automatic) {
  if (setting == kAttentionWgmmaAutomatic) {
    return automatic != 0 && attention_wgmma_available() ? automatic : 0;
  }
  HAM_CHECK(setting == 0 || attention_wgmma_available(), kOp, ": the wgmma ", pass,
            " kernels (", setter, ") need a build with sm_90a code (90a in "
            "CMAKE_CUDA_ARCHITECTURES) and a GPU of compute capability 9.0");
  return setting;
}

// The tensor-core kernels read q, k, v 16 bytes at a time.
bool tensor_core_ready(const Tensor& q, const Tensor& k, const Tensor& v) {
  return q.dtype() == DType::BF16 && aligned_16(q.raw_data()) && aligned_16(k.raw_data()) &&
         aligned_16(v.raw_data());
}

template <class T>
void launch_warp_rows(void (*kernel)(AttentionArgs<T>), int64_t rows, const AttentionArgs<T>& args) {
  if (rows == 0) return;
  HAM_CHECK(ceil_div(rows, kWarpRowsPerBlock) < (int64_t(1) << 31), kOp, ": ", rows,
            " rows exceed the grid");
  HAM_LAUNCH(unsigned(ceil_div(rows, kWarpRowsPerBlock)), kThreads, 0, launch_stream(), kernel)(
      args);
  HAM_CUDA_CHECK_LAUNCH();
}

// The query tiles' summary of a batch's rows (summarize_query_tiles): ranges, QueryTileRange
// [B, ceil(T / kQueryTileRows)] as pairs of I32, and where `records` their QueryTileKeys
// (else undefined).
struct QueryTileSummary {
  Tensor ranges, records;
};
QueryTileSummary summarize_query_tiles_on(const int64_t* begin, const int64_t* end,
                                          const int64_t* positions, int64_t batch,
                                          int64_t seq_len, Device device, bool records) {
  const int64_t query_tiles = batch * ceil_div(seq_len, kQueryTileRows);
  QueryTileSummary summary;
  summary.ranges = Tensor::empty(Shape{query_tiles, 2}, DType::I32, device);
  if (records) {
    static_assert(sizeof(QueryTileKeys) % sizeof(int32_t) == 0);
    summary.records = Tensor::empty(
        Shape{query_tiles, int64_t(sizeof(QueryTileKeys) / sizeof(int32_t))}, DType::I32,
        device);
  }
  const unsigned blocks = unsigned(ceil_div(query_tiles, kWarpRowsPerBlock));
  HAM_LAUNCH_DEPENDENT(blocks, kThreads, 0, launch_stream(), summarize_query_tiles)(
      begin, end, positions, batch, seq_len,
      reinterpret_cast<QueryTileRange*>(summary.ranges.raw_data()),
      records ? reinterpret_cast<QueryTileKeys*>(summary.records.raw_data()) : nullptr,
      block_timeline_for_launch(KernelName{"summarize_query_tiles", {}, 0}, blocks));
  HAM_CUDA_CHECK_LAUNCH();
  return summary;
}

// order_key_tiles_by_work's order, [B, ceil(T / rows)] I32, from the query tiles' ranges.
Tensor order_key_tiles_on(const Tensor& query_tile_ranges, const int64_t* counts, int64_t batch,
                          int64_t seq_len, int rows, Device device) {
  const int64_t tiles = ceil_div(seq_len, rows);
  Tensor work = Tensor::empty(Shape{batch, tiles}, DType::I32, device);
  Tensor order = Tensor::empty(Shape{batch, tiles}, DType::I32, device);
  HAM_LAUNCH_DEPENDENT(unsigned(batch), kOrderThreads, 0, launch_stream(), order_key_tiles_by_work)(
      reinterpret_cast<const QueryTileRange*>(query_tile_ranges.raw_data()), counts, seq_len,
      rows, ptr<int>(work), ptr<int>(order),
      block_timeline_for_launch(KernelName{"order_key_tiles_by_work", {rows}, 1}, batch));
  HAM_CUDA_CHECK_LAUNCH();
  return order;
}

// The persistent forward (forward_wgmma_persistent): the query tiles' records
// (summarize_query_tiles), then a grid of `blocks` blocks (-1: as many as the SMs hold at
// once), never more than the query tiles. Returns whether it launched: false where its
// shared memory does not fit the device.
// The grid of a persistent kernel (PersistentQueryTiles, PersistentKeyTiles) of `threads`
// threads and `bytes` of dynamic shared memory: `blocks` blocks (-1: as many as the SMs hold
// at once), never more than its tiles of kQueryTileRows rows of each head (query heads, or
// kv heads for the dK/dV kernel).
constexpr int kPersistentThreads = 128;
dim3 persistent_grid(void (*kernel)(AttentionArgs<bf16>), int blocks, size_t bytes, int threads,
                     int64_t seq_len, int64_t heads, int64_t batch) {
  const int64_t tiles = ceil_div(seq_len, kQueryTileRows) * heads * batch;
  HAM_CHECK(tiles < (int64_t(1) << 31), kOp, ": ", tiles,
            " tiles exceed a persistent kernel's 32-bit count");
  int64_t grid = blocks;
  if (blocks < 0) {
    grid = int64_t(resident_blocks_per_sm(kOp, kernel, threads, bytes)) * multiprocessor_count();
  }
  grid = std::min(grid, tiles);
  HAM_CHECK(grid > 0 && grid < (int64_t(1) << 31), kOp, ": ", grid,
            " blocks for a persistent kernel over ", tiles, " tiles");
  return dim3(unsigned(grid));
}

template <int DK, int DV>
bool launch_persistent_forward(AttentionArgs<bf16> a, int blocks, Device device) {
  using Shape = PersistentForwardShape<DK, DV>;
  static_assert(Shape::kThreads == kPersistentThreads);
  auto* kernel = &forward_wgmma_persistent<DK, DV>;
  if (!tiled_fits(kernel, Shape::bytes)) return false;
  const dim3 grid = persistent_grid(kernel, blocks, Shape::bytes, Shape::kThreads, a.seq_len,
                                    a.q_heads, a.batch);
  const QueryTileSummary summary = summarize_query_tiles_on(a.begin, a.end, a.positions,
                                                            a.batch, a.seq_len, device, true);
  a.query_tile_keys = reinterpret_cast<const QueryTileKeys*>(summary.records.raw_data());
  const KernelName name{"forward_wgmma_persistent", {DK, DV}, 2};
  return launch_tiled(kernel, grid, Shape::bytes, a, Shape::kThreads, &name,
                      ceil_div(a.seq_len, kQueryTileRows) * a.q_heads * a.batch);
}

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& value_scale,
             const CompactSelection& selection, double scale, Tensor& out, Tensor& lse) {
  if (q.numel() == 0 || v.size(3) == 0) return;
  check_grid(q);
  use_device_of(q);
  dispatch_floating(kOp, q.dtype(), [&]<class T>() {
    AttentionArgs<T> a = make_args<T>(q, k, v, value_scale, selection, scale);
    a.out = ptr<T>(out);
    a.lse = ptr<compute_t<T>>(lse);
    bool tiled = false;
    if constexpr (!std::is_same_v<T, double>) {
      auto grid_of_rows = [&](int rows) {
        return block_grid(a.seq_len, rows, a.q_heads, a.batch);
      };
      const dim3 grid = grid_of_rows(64);
      dispatch_head_dims(a.key_dim, a.value_dim, [&]<int DK, int DV>() {
        if constexpr (std::is_same_v<T, bf16>) {
          // The tensor-core kernels write out's rows 16 bytes at a time (store_forward_rows).
          if (tensor_core_ready(q, k, v) && aligned_16(out.raw_data())) {
            auto launch_mma = [&]<int kM, int kKeyTile = 0>() {
              using Shape = MmaShape<DK, DV, kM, kKeyTile>;
              const KernelName name{"forward_mma", {DK, DV, kM, kKeyTile}, 4};
              return launch_tiled(&forward_mma<DK, DV, kM, kKeyTile>, grid_of_rows(Shape::kRows),
                                  Shape::forward_bytes, a, kMmaThreads, &name);
            };
            if constexpr (kWgmmaHeads<DK, DV>) {
              const int groups = wgmma_groups(g_forward_wgmma.load(), "forward",
                                              "set_attention_forward_wgmma",
                                              kWgmmaAutomaticForward<DK, DV>);
              if (groups != 0) {
                auto launch_wgmma = [&]<int kGroups>() {
                  using Wgmma = WgmmaForwardShape<DK, DV, kGroups>;
                  const KernelName name{"forward_wgmma", {DK, DV, kGroups}, 3};
                  return launch_tiled(&forward_wgmma<DK, DV, kGroups>,
                                      grid_of_rows(Wgmma::kRows), Wgmma::bytes, a,
                                      Wgmma::kThreads, &name);
                };
                const int persistent = g_forward_persistent.load();
                if constexpr (kWgmmaFits<DK, DV>) {
                  if (groups == 1 && persistent != 0) {
                    tiled = launch_persistent_forward<DK, DV>(a, persistent, q.device());
                    if (tiled) g_forward_persistent_launches.fetch_add(1);
                  }
                }
                if (!tiled) {
                  tiled = groups == 2 ? launch_wgmma.template operator()<2>()
                                      : launch_wgmma.template operator()<1>();
                }
                if (tiled) g_forward_wgmma_launches.fetch_add(1);
              }
            }
            // 128-row blocks for the common heads and the paper's value heads of 192 only
            // (each instance adds to the build; MmaShape says why not for 256).
            if constexpr ((DK == 64 || DK == 128) && (DV == 64 || DV == 128 || DV == 192)) {
              if (!tiled && g_forward_rows.load() == 128) {
                if constexpr (DV == 128) {
                  if (!tiled && g_forward_keys.load() == 32) {
                    tiled = launch_mma.template operator()<2, 32>();
                  }
                }
                if (!tiled) tiled = launch_mma.template operator()<2>();
              }
            }
            if (!tiled) tiled = launch_mma.template operator()<1>();
          }
        }
        if (!tiled) {
          tiled = launch_tiled(&forward_tiled<T, DK, DV>, grid, TileShape<DK, DV>::forward_bytes, a);
        }
      });
    }
    if (!tiled) launch_warp_rows(&forward_generic<T>, a.batch * a.seq_len * a.q_heads, a);
  });
}

void backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& value_scale, const CompactSelection& selection, const Tensor& out,
              const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
              Tensor& dvalue_scale) {
  use_device_of(q);
  cudaStream_t stream = launch_stream();
  if (q.numel() == 0) {  // no kernel runs: every gradient is zero
    for (Tensor* t : {&dk, &dv, &dvalue_scale}) {
      if (t->defined() && t->numel() > 0) {
        HAM_CUDA_CHECK(cudaMemsetAsync(t->raw_data(),
                                       0, size_t(t->numel()) * dtype_size(t->dtype()), stream));
      }
    }
    return;
  }
  check_grid(q);
  dispatch_floating(kOp, q.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    AttentionArgs<T> a = make_args<T>(q, k, v, value_scale, selection, scale);
    const int64_t rows = a.batch * a.seq_len * a.q_heads;
    Tensor delta = Tensor::empty(Shape{a.batch, a.seq_len, a.q_heads}, compute_dtype<T>(), q.device());
    // Warpgroups a block of the wgmma backward kernels (0: they do not run). Their dQ
    // kernel forms D itself (row_deltas) and runs before the dK/dV pass; elsewhere
    // backward_prologue forms D.
    int wgmma_groups_backward = 0;
    bool dq_forms_delta = false;
    // The tensor-core kernels also read dO 16 bytes at a time and write the rows of dq, dk
    // and dv so (store_query_grads, store_key_gradients).
    const bool tensor_cores = tensor_core_ready(q, k, v) &&
                              aligned_16(dout.raw_data()) && aligned_16(dq.raw_data()) &&
                              aligned_16(dk.raw_data()) && aligned_16(dv.raw_data());
    const int dq_keys = g_backward_dq_keys.load();
    // The wgmma dQ kernel in 32- or 16-key tiles starts from the query tiles' records where
    // set (set_attention_backward_dq_records).
    const bool dq_records_set = g_backward_dq_records.load();
    // The dK/dV blocks take their key tiles by work where set (set_attention_backward_key_order).
    const bool order_key_tiles = g_backward_key_order.load();
    // The wgmma dQ kernel for these head dims and warpgroups, its shared memory, its key
    // tile and whether it reads the records.
    // persistent: its blocks (-1: as many as the SMs hold), 0 for a block a query tile.
    struct WgmmaDq {
      void (*kernel)(AttentionArgs<bf16>);
      size_t bytes;
      int keys;
      bool from_records;
      int persistent = 0;
    };
    // The persistent dQ kernel where set (set_attention_backward_dq_persistent), in 32-key
    // tiles.
    const int dq_persistent = g_backward_dq_persistent.load();
    // The persistent dK/dV kernel where set (set_attention_backward_dkdv_persistent): one
    // warpgroup, head dims 64 and 128.
    const int dkdv_persistent = g_backward_dkdv_persistent.load();
    auto wgmma_dq = [&]<int DK, int DV, int kGroups>() {
      using Wgmma = WgmmaBackwardShape<DK, DV, kGroups>;
      if constexpr (kWgmmaDqTakesShortTiles<DK, DV, kGroups>) {
        if (dq_keys == 32 && dq_persistent != 0) {
          using Persistent = PersistentDqShape<DK, DV>;
          static_assert(Persistent::kThreads == Wgmma::kThreads &&
                        Persistent::kThreads == kPersistentThreads);
          return WgmmaDq{&backward_dq_wgmma_persistent<DK, DV>, Persistent::bytes,
                         Persistent::kTile, true, dq_persistent};
        }
        auto short_tiles = [&]<int kKeys>() {
          const size_t bytes = Wgmma::bytes(KeyGrads::Both, kKeys);
          return dq_records_set
                     ? WgmmaDq{&backward_dq_wgmma<DK, DV, kGroups, kKeys, true>, bytes, kKeys,
                               true}
                     : WgmmaDq{&backward_dq_wgmma<DK, DV, kGroups, kKeys>, bytes, kKeys, false};
        };
        if (dq_keys == 32) return short_tiles.template operator()<32>();
        if (dq_keys == 16) return short_tiles.template operator()<16>();
      }
      return WgmmaDq{&backward_dq_wgmma<DK, DV, kGroups>, Wgmma::bytes(), Wgmma::kTile, false};
    };
    // Whether the dQ kernel that is to run reads the records (the query tiles' summary then
    // writes them).
    bool dq_from_records = false;
    if constexpr (std::is_same_v<T, bf16>) {
      if (tensor_cores) {
        dispatch_head_dims(a.key_dim, a.value_dim, [&]<int DK, int DV>() {
          if constexpr (kWgmmaHeads<DK, DV>) {
            wgmma_groups_backward = wgmma_groups(g_backward_wgmma.load(), "backward",
                                                 "set_attention_backward_wgmma",
                                                 kWgmmaAutomaticBackward<DK, DV>);
            auto dq_fits = [&]<int kGroups>() {
              const WgmmaDq dq_pass = wgmma_dq.template operator()<DK, DV, kGroups>();
              return tiled_fits(dq_pass.kernel, dq_pass.bytes);
            };
            dq_forms_delta = wgmma_groups_backward != 0 && aligned_16(out.raw_data()) &&
                             (wgmma_groups_backward == 2 ? dq_fits.template operator()<2>()
                                                         : dq_fits.template operator()<1>());
            dq_from_records = wgmma_groups_backward == 1 &&
                              wgmma_dq.template operator()<DK, DV, 1>().from_records;
          }
        });
      }
    }
    BackwardPrologue<T> prologue{ptr<const T>(dout), ptr<const T>(out),
                                 dq_forms_delta ? nullptr : ptr<C>(delta),
                                 ptr<T>(dk), ptr<T>(dv), ptr_or_null<T>(dvalue_scale),
                                 a.positions, a.begin, a.end, a.batch * a.seq_len, a.seq_len,
                                 a.q_heads, a.kv_heads, a.key_dim, a.value_dim};
    const bool packable =
        a.key_dim % kPackWidth<T> == 0 &&
        rows_packable<T>(a.value_dim, {prologue.dout, prologue.out, prologue.dk, prologue.dv});
    void (*prologue_kernel)(BackwardPrologue<T>) =
        packable ? &backward_prologue<T, kPackWidth<T>> : &backward_prologue<T, 1>;
    auto launch_prologue = [&] {
      const unsigned blocks = unsigned(ceil_div(a.batch * a.seq_len, kWarpRowsPerBlock));
      prologue.timeline = block_timeline_for_launch(
          KernelName{"backward_prologue", {packable ? kPackWidth<T> : 1}, 1}, blocks);
      HAM_LAUNCH_DEPENDENT(blocks, kThreads, 0, launch_stream(), prologue_kernel)(prologue);
      HAM_CUDA_CHECK_LAUNCH();
    };
    // Where the dQ kernel forms D, the prologue only zeroes the rows of dk, dv and dp that
    // no later kernel writes (the tokens not selected), so with set_attention_backward_overlap
    // it runs beside the other passes: its stores, bound by HBM, under the short blocks of
    // the tensor-core passes, bound by latency. The passes go on the device's high-priority
    // second stream, forked before the prologue, so that the block scheduler places their
    // blocks first and the prologue's (on the current stream, of the lowest priority) in
    // what they leave; with equal priorities the prologue's blocks, launched first, held
    // the SMs until they were done (the H200's block timelines, thirty-sixth session).
    // Joined before the backward returns.
    // Where set (set_attention_backward_zeros_in_dq) and the dQ kernel forms D, its blocks
    // write those zeros too, and no first pass runs.
    const bool zeros_in_dq = dq_forms_delta && g_backward_zeros_in_dq.load();
    std::optional<ForkedStream> passes_beside;
    if (dq_forms_delta && !zeros_in_dq && g_backward_overlap.load()) {
      passes_beside.emplace(q.device().index, StreamPriority::High);
    }
    if (!zeros_in_dq) launch_prologue();
    auto launch_passes = [&] {
      // Counted by the stream the passes take, not by the setting.
      if (passes_beside && has_greatest_priority(launch_stream())) {
        g_overlapped_prologues.fetch_add(1);
      }
      Tensor dp_partial;
      if (value_scale.defined()) {
        dp_partial = Tensor::empty(Shape{a.batch, a.kv_heads, a.seq_len}, compute_dtype<T>(),
                                   q.device());
      }
      a.lse = const_cast<C*>(ptr<const C>(lse));
      a.dout = ptr<const T>(dout);
      a.delta = ptr<const C>(delta);
      a.delta_out = dq_forms_delta ? ptr<C>(delta) : nullptr;
      a.zero_unselected = zeros_in_dq;
      a.dp_zeros = zeros_in_dq ? ptr_or_null<T>(dvalue_scale) : nullptr;
      a.out = const_cast<T*>(ptr<const T>(out));  // read: row_deltas
      a.dq = ptr<T>(dq);
      a.dk = ptr<T>(dk);
      a.dv = ptr<T>(dv);
      a.dp_partial = dp_partial.defined() ? ptr<C>(dp_partial) : nullptr;

      bool tiled_dkdv = false, tiled_dq = false;
      if constexpr (!std::is_same_v<T, double>) {
        // The dK/dV kernels' query bound (visible_rows_end); the generic kernels need none.
        // Where the dQ kernel reads them, also the tiles' QueryTileKeys (its blocks of one
        // warpgroup are 64 rows: one tile each).
        const QueryTileSummary summary = summarize_query_tiles_on(
            a.begin, a.end, a.positions, a.batch, a.seq_len, q.device(), dq_from_records);
        a.query_tiles = reinterpret_cast<const QueryTileRange*>(summary.ranges.raw_data());
        a.query_tile_keys =
            dq_from_records ? reinterpret_cast<const QueryTileKeys*>(summary.records.raw_data())
                            : nullptr;
        // Where set, each dK/dV launch below first orders the key tiles of its blocks' rows
        // by their work (set_attention_backward_key_order). Returns whether it launched the
        // order kernel (just ahead of the dK/dV launch).
        Tensor key_tile_order;
        auto order_key_tiles_for = [&](int key_rows) {
          if (!order_key_tiles || a.key_tile_order_rows == key_rows) return false;
          key_tile_order = order_key_tiles_on(summary.ranges, a.counts, a.batch, a.seq_len,
                                              key_rows, q.device());
          a.key_tile_order = ptr<const int>(key_tile_order);
          a.key_tile_order_rows = key_rows;
          return true;
        };
        const dim3 key_grid = block_grid(a.seq_len, kTiledKeyRows, a.kv_heads, a.batch);
        const dim3 query_grid = block_grid(a.seq_len, 64, a.q_heads, a.batch);
        dispatch_head_dims(a.key_dim, a.value_dim, [&]<int DK, int DV>() {
          if constexpr (std::is_same_v<T, bf16>) {
            if (tensor_cores) {
              using Shape = MmaBackwardShape<DK, DV>;
              if constexpr (kWgmmaHeads<DK, DV>) {
                const int groups = wgmma_groups_backward;
                if (groups != 0) {
                  auto launch_wgmma = [&]<int kGroups>() {
                    using Wgmma = WgmmaBackwardShape<DK, DV, kGroups>;
                    // dQ first: it forms D where dq_forms_delta, which dK/dV reads.
                    const WgmmaDq dq_pass = wgmma_dq.template operator()<DK, DV, kGroups>();
                    HAM_CHECK(dq_pass.from_records == (a.query_tile_keys != nullptr), kOp,
                              ": the dQ kernel and the query tiles' records disagree");
                    const KernelName dq_name{
                        "backward_dq_wgmma",
                        {DK, DV, kGroups, dq_pass.keys, int(dq_pass.from_records)},
                        dq_pass.from_records ? 5 : 4};
                    // Just after the query tiles' summary: its prologue runs before its
                    // wait (backward_dq_wgmma). The persistent kernel stamps an entry a
                    // query tile.
                    const KernelName persistent_dq_name{"backward_dq_wgmma_persistent",
                                                        {DK, DV}, 2};
                    const bool persistent = dq_pass.persistent != 0;
                    const dim3 dq_grid =
                        persistent
                            ? persistent_grid(dq_pass.kernel, dq_pass.persistent, dq_pass.bytes,
                                              kPersistentThreads, a.seq_len, a.q_heads, a.batch)
                            : block_grid(a.seq_len, Wgmma::kRows, a.q_heads, a.batch);
                    tiled_dq = launch_tiled(
                        dq_pass.kernel, dq_grid, dq_pass.bytes, a, Wgmma::kThreads,
                        persistent ? &persistent_dq_name : &dq_name,
                        persistent ? ceil_div(a.seq_len, kQueryTileRows) * a.q_heads * a.batch
                                   : 0);
                    if (tiled_dq && dq_pass.persistent != 0) {
                      g_backward_dq_persistent_launches.fetch_add(1);
                    }
                    HAM_CHECK(tiled_dq || !dq_forms_delta, kOp,
                              ": the wgmma dQ kernel that was to form D did not launch");
                    if (zeros_in_dq) g_backward_zeros_in_dq_launches.fetch_add(1);
                    if (tiled_dq && dq_pass.keys == 32) g_backward_dq_32_key_launches.fetch_add(1);
                    if (tiled_dq && dq_pass.keys == 16) g_backward_dq_16_key_launches.fetch_add(1);
                    if (tiled_dq && dq_pass.from_records) {
                      g_backward_dq_record_launches.fetch_add(1);
                    }
                    const dim3 keys = block_grid(a.seq_len, Wgmma::kRows, a.kv_heads, a.batch);
                    auto launch_dkdv = [&]<KeyGrads kPart>() {
                      const bool order_just_ahead = order_key_tiles_for(Wgmma::kRows);
                      // Its prologue before its wait where the kernel just ahead is the dQ
                      // pass or the dK half: not the order kernel, nor the query tiles'
                      // summary (where the dQ pass did not launch).
                      AttentionArgs<bf16> args = a;
                      args.key_prologue_before_wait =
                          !order_just_ahead && (kPart == KeyGrads::Values || tiled_dq);
                      // KeyGrads: 0 both, 1 keys, 2 values
                      const KernelName name{"backward_dkdv_wgmma", {DK, DV, kGroups, int(kPart)},
                                            4};
                      bool launched = false;
                      // The persistent dK/dV kernel where set and it takes these heads
                      // (set_attention_backward_dkdv_persistent): an entry a key tile.
                      if constexpr (kGroups == 1 && kPart == KeyGrads::Both &&
                                    kWgmmaFits<DK, DV>) {
                        if (dkdv_persistent != 0) {
                          auto* kernel = &backward_dkdv_wgmma_persistent<DK, DV>;
                          const KernelName persistent_name{"backward_dkdv_wgmma_persistent",
                                                           {DK, DV}, 2};
                          const dim3 grid =
                              persistent_grid(kernel, dkdv_persistent, Wgmma::bytes(),
                                              Wgmma::kThreads, a.seq_len, a.kv_heads, a.batch);
                          launched = launch_tiled(
                              kernel, grid, Wgmma::bytes(), args, Wgmma::kThreads,
                              &persistent_name,
                              ceil_div(a.seq_len, kQueryTileRows) * a.kv_heads * a.batch);
                          if (launched) g_backward_dkdv_persistent_launches.fetch_add(1);
                        }
                      }
                      if (!launched) {
                        launched =
                            launch_tiled(&backward_dkdv_wgmma<DK, DV, kGroups, kPart>, keys,
                                         Wgmma::bytes(kPart), args, Wgmma::kThreads, &name);
                      }
                      if (launched && args.key_prologue_before_wait) {
                        g_key_prologues_before_wait.fetch_add(1);
                      }
                      return launched;
                    };
                    if constexpr (kWgmmaSplitKeyGrads<DK, DV>) {
                      tiled_dkdv = launch_dkdv.template operator()<KeyGrads::Keys>() &&
                                   launch_dkdv.template operator()<KeyGrads::Values>();
                    } else {
                      tiled_dkdv = launch_dkdv.template operator()<KeyGrads::Both>();
                    }
                  };
                  if (groups == 2) {
                    launch_wgmma.template operator()<2>();
                  } else {
                    launch_wgmma.template operator()<1>();
                  }
                  if (tiled_dkdv && tiled_dq) g_backward_wgmma_launches.fetch_add(1);
                }
              }
              if (!tiled_dkdv) {
                order_key_tiles_for(kMmaRows);
                if constexpr (Shape::kSplitKeyGrads) {
                  // dk, then dv and the router's share (when the first fits, so does the second)
                  tiled_dkdv = launch_tiled(&backward_dkdv_mma<DK, DV, KeyGrads::Keys>, key_grid,
                                            Shape::dkdv_bytes(KeyGrads::Keys), a, kMmaThreads) &&
                               launch_tiled(&backward_dkdv_mma<DK, DV, KeyGrads::Values>, key_grid,
                                            Shape::dkdv_bytes(KeyGrads::Values), a,
                                            kMmaThreads);
                } else {
                  tiled_dkdv = launch_tiled(&backward_dkdv_mma<DK, DV>, key_grid,
                                            Shape::dkdv_bytes(), a, kMmaThreads);
                }
              }
              if (!tiled_dq) {
                tiled_dq = launch_tiled(&backward_dq_mma<DK, DV>,
                                        block_grid(a.seq_len, Shape::kDqRows, a.q_heads, a.batch),
                                        Shape::dq_bytes, a, kMmaThreads);
              }
            }
          }
          if (!tiled_dkdv) {
            order_key_tiles_for(kTiledKeyRows);
            tiled_dkdv = launch_tiled(&backward_dkdv_tiled<T, DK, DV>, key_grid,
                                      TileShape<DK, DV>::dkdv_bytes, a);
          }
          if (!tiled_dq) {
            tiled_dq = launch_tiled(&backward_dq_tiled<T, DK, DV>, query_grid,
                                    TileShape<DK, DV>::dq_bytes, a);
          }
        });
        if (tiled_dkdv && a.key_tile_order != nullptr) g_backward_key_order_launches.fetch_add(1);
      }
      if (!tiled_dkdv) {
        launch_warp_rows(&backward_dkdv_generic<T>, a.batch * a.seq_len * a.kv_heads, a);
      }
      if (!tiled_dq) launch_warp_rows(&backward_dq_generic<T>, rows, a);
      if (dvalue_scale.defined()) {
        const unsigned gather_blocks = grid_for(a.batch * a.seq_len);
        HAM_LAUNCH_DEPENDENT(gather_blocks, kThreads, 0, launch_stream(),
                             gather_value_scale_grad<T>)(
            a.dp_partial, a.positions, a.counts, a.batch, a.seq_len, a.kv_heads,
            ptr<T>(dvalue_scale),
            block_timeline_for_launch(KernelName{"gather_value_scale_grad", {}, 0},
                                      gather_blocks));
        HAM_CUDA_CHECK_LAUNCH();
      }
    };
    if (passes_beside) {
      passes_beside->run(launch_passes);
      passes_beside->join();
    } else {
      launch_passes();
    }
  });
}

// Whether the bf16 forward at these head dims runs on wgmma with one warpgroup a block as
// set (set_attention_forward_wgmma, through wgmma_groups as forward() does), where the
// persistent forward may take it.
bool forward_on_one_warpgroup(int64_t key_dim, int64_t value_dim) {
  int automatic = 0;
  bool fits = false;
  dispatch_head_dims(key_dim, value_dim, [&]<int DK, int DV>() {
    automatic = kWgmmaAutomaticForward<DK, DV>;
    fits = kWgmmaFits<DK, DV>;
  });
  return fits && wgmma_groups(g_forward_wgmma.load(), "forward", "set_attention_forward_wgmma",
                              automatic) == 1;
}

// Routed attention's own switch of dependent launches (cuda/dependent_launch.h), as the
// autotuner gives it, where the GPU runs them: the setting is process-wide, but the tuner
// applies a choice only for the op's call, so each pass at each shape takes them or not.
// They were one switch for both hard ops, and the gated delta rule's forward took 1.29x as
// long with them at B2 T16384 (docs/gpu_results.md, sixty-eighth session).
void tune_dependent_launches(std::vector<TunedSetting>& settings) {
  if (dependent_launches_supported()) settings.push_back({"dependent_launches", {"off", "on"}});
}

// What the autotuner keys both passes by (cuda/autotune.h): the bf16 tensors' sizes.
std::string tune_shape(const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& value_scale) {
  return detail::concat("bf16 B", q.size(0), " T", q.size(1), " H", q.size(2), "x", k.size(2),
                        " D", q.size(3), "x", v.size(3),
                        value_scale.defined() ? ", value scale" : "");
}

// The forward under the autotuner's choice (cuda/autotune.h), for bf16 where it runs on one
// wgmma warpgroup a block: a block a query tile or persistent blocks
// (set_attention_forward_persistent), as plain or dependent launches; the same outputs to
// the bit.
void tuned_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& value_scale,
                   const CompactSelection& selection, double scale, Tensor& out, Tensor& lse) {
  auto run = [&] {
    forward(q, k, v, value_scale, selection, scale, out, lse);
    return true;
  };
  if (q.dtype() != DType::BF16 || q.numel() == 0 ||
      !forward_on_one_warpgroup(q.size(3), v.size(3))) {
    run();
    return;
  }
  auto problem = [&] {
    std::vector<TunedSetting> settings = {{"attention_forward_persistent", {"0", "-1"}}};
    tune_dependent_launches(settings);
    return TuneProblem{tune_shape(q, k, v, value_scale), settings,
                       {{"out", &out}, {"lse", &lse}}};
  };
  run_tuned("routed_attention forward", problem, run);
}

// The backward under the autotuner's choice (cuda/autotune.h), for bf16: the dK/dV blocks'
// key order; where the wgmma dQ kernel runs on one warpgroup a block, its key tile, its
// start from records and whether it runs persistent (in 32-key tiles); where it runs at
// all, whether it writes the unselected keys' zeros; and plain or dependent launches. Each
// variant gives the same gradients to the bit.
void tuned_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& value_scale, const CompactSelection& selection,
                    const Tensor& out, const Tensor& lse, double scale, Tensor& dq, Tensor& dk,
                    Tensor& dv, Tensor& dvalue_scale) {
  auto run = [&] {
    backward(dout, q, k, v, value_scale, selection, out, lse, scale, dq, dk, dv, dvalue_scale);
    return true;
  };
  if (q.dtype() != DType::BF16 || q.numel() == 0) {
    run();
    return;
  }
  auto problem = [&] {
    const int64_t key_dim = q.size(3), value_dim = v.size(3);
    const int groups_set = g_backward_wgmma.load();
    const bool dq_on_one_warpgroup =
        attention_wgmma_available() && (key_dim == 64 || key_dim == 128) &&
        (value_dim == 64 || value_dim == 128) &&
        (groups_set == kAttentionWgmmaAutomatic || groups_set == 1);
    std::vector<TunedSetting> settings;
    if (dq_on_one_warpgroup) {
      // The persistent kernel runs in 32-key tiles and always starts from the records:
      // 5 of the 8 combinations differ.
      settings.push_back({"attention_backward_dq_keys", {"32", "16"}});
      settings.push_back({"attention_backward_dq_records",
                          {"off", "on"},
                          {{"attention_backward_dq_persistent", "0"}}});
      settings.push_back({"attention_backward_dq_persistent",
                          {"0", "-1"},
                          {{"attention_backward_dq_keys", "32"}}});
    }
    settings.push_back({"attention_backward_key_order", {"off", "on"}});
    // Where the wgmma dQ kernel forms D (one warpgroup a block or two).
    if (attention_wgmma_available() && attention_wgmma_takes_head_dims(key_dim, value_dim) &&
        groups_set != 0) {
      settings.push_back({"attention_backward_zeros_in_dq", {"on", "off"}});
    }
    tune_dependent_launches(settings);
    return TuneProblem{tune_shape(q, k, v, value_scale), settings,
                       {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dvalue_scale", &dvalue_scale}}};
  };
  run_tuned("routed_attention backward", problem, run);
}

}  // namespace

int set_attention_forward_rows(int rows) {
  HAM_CHECK(rows == 64 || rows == 128, "set_attention_forward_rows: ", rows,
            " rows per block; the tensor-core forward takes 64 or 128");
  return g_forward_rows.exchange(rows);
}

int set_attention_forward_keys(int keys) {
  HAM_CHECK(keys == 32 || keys == 64, "set_attention_forward_keys: ", keys,
            " keys per tile; the 128-row tensor-core forward takes 32 or 64");
  return g_forward_keys.exchange(keys);
}

int set_attention_backward_wgmma(int kernels) {
  HAM_CHECK(kernels >= kAttentionWgmmaAutomatic && kernels <= 2,
            "set_attention_backward_wgmma: ", kernels,
            "; the backward's kernels are -1 (automatic), 0 (mma.sync), 1 or 2 (wgmma, "
            "warpgroups a block)");
  return g_backward_wgmma.exchange(kernels);
}

int64_t attention_backward_wgmma_launches() { return g_backward_wgmma_launches.load(); }

int set_attention_backward_dq_keys(int keys) {
  HAM_CHECK(keys == 16 || keys == 32 || keys == 64, "set_attention_backward_dq_keys: ", keys,
            " keys per tile; the wgmma dQ kernel takes 16, 32 or 64");
  return g_backward_dq_keys.exchange(keys);
}

int64_t attention_backward_dq_32_key_launches() {
  return g_backward_dq_32_key_launches.load();
}

int64_t attention_backward_dq_16_key_launches() {
  return g_backward_dq_16_key_launches.load();
}

bool set_attention_backward_overlap(bool overlap) { return g_backward_overlap.exchange(overlap); }

bool set_attention_backward_dq_records(bool records) {
  return g_backward_dq_records.exchange(records);
}

int64_t attention_backward_dq_record_launches() { return g_backward_dq_record_launches.load(); }
int64_t attention_key_prologues_before_wait() { return g_key_prologues_before_wait.load(); }

bool set_attention_backward_key_order(bool by_work) {
  return g_backward_key_order.exchange(by_work);
}

int64_t attention_backward_key_order_launches() { return g_backward_key_order_launches.load(); }

bool set_attention_backward_zeros_in_dq(bool in_dq) {
  return g_backward_zeros_in_dq.exchange(in_dq);
}

int64_t attention_backward_zeros_in_dq_launches() {
  return g_backward_zeros_in_dq_launches.load();
}

Tensor attention_key_tile_order(const CompactSelection& selection, int rows) {
  const Tensor& positions = selection.key_positions;
  HAM_CHECK(positions.device().is_cuda(), "attention_key_tile_order: the selection is on ",
            positions.device().str(), ", not a GPU");
  HAM_CHECK(positions.dim() == 2, "attention_key_tile_order: key_positions of shape ",
            shape_str(positions.shape()), "; expected [B, T]");
  HAM_CHECK(rows > 0, "attention_key_tile_order: ", rows, " rows a key tile; expected > 0");
  use_device_of(positions);
  const int64_t batch = positions.size(0), seq_len = positions.size(1);
  if (batch == 0 || seq_len == 0) {
    return Tensor::empty(Shape{batch, 0}, DType::I32, positions.device());
  }
  const QueryTileSummary summary = summarize_query_tiles_on(
      ptr<const int64_t>(selection.visible_begin), ptr<const int64_t>(selection.visible_end),
      ptr<const int64_t>(positions), batch, seq_len, positions.device(), false);
  return order_key_tiles_on(summary.ranges, ptr<const int64_t>(selection.key_counts), batch,
                            seq_len, rows, positions.device());
}

int64_t attention_overlapped_prologues() { return g_overlapped_prologues.load(); }

int set_attention_forward_wgmma(int kernels) {
  HAM_CHECK(kernels >= kAttentionWgmmaAutomatic && kernels <= 2, "set_attention_forward_wgmma: ",
            kernels, "; the forward's kernels are -1 (automatic), 0 (mma.sync), 1 or 2 (wgmma, "
            "warpgroups a block)");
  return g_forward_wgmma.exchange(kernels);
}

int64_t attention_forward_wgmma_launches() { return g_forward_wgmma_launches.load(); }

int set_attention_forward_persistent(int blocks) {
  HAM_CHECK(blocks >= -1, "set_attention_forward_persistent: ", blocks,
            " blocks; expected 0 (off), -1 (as many as the SMs hold at once) or a count");
  return g_forward_persistent.exchange(blocks);
}

int64_t attention_forward_persistent_launches() { return g_forward_persistent_launches.load(); }

int set_attention_backward_dq_persistent(int blocks) {
  HAM_CHECK(blocks >= -1, "set_attention_backward_dq_persistent: ", blocks,
            " blocks; expected 0 (off), -1 (as many as the SMs hold at once) or a count");
  return g_backward_dq_persistent.exchange(blocks);
}

int64_t attention_backward_dq_persistent_launches() {
  return g_backward_dq_persistent_launches.load();
}

int set_attention_backward_dkdv_persistent(int blocks) {
  HAM_CHECK(blocks >= -1, "set_attention_backward_dkdv_persistent: ", blocks,
            " blocks; expected 0 (off), -1 (as many as the SMs hold at once) or a count");
  return g_backward_dkdv_persistent.exchange(blocks);
}

int64_t attention_backward_dkdv_persistent_launches() {
  return g_backward_dkdv_persistent_launches.load();
}

bool attention_wgmma_takes_head_dims(int64_t key_dim, int64_t value_dim) {
  bool takes = false;
  dispatch_head_dims(key_dim, value_dim, [&]<int DK, int DV>() { takes = kWgmmaHeads<DK, DV>; });
  return takes;
}

bool attention_wgmma_available() {
#if defined(HAM_CUDA_EMULATOR)
  return true;
#elif defined(HAM_CUDA_WGMMA)
  int device = 0, major = 0, minor = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  HAM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  HAM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

namespace {

const bool registered = [] {
  compact_selection_kernels().register_kernel(DeviceKind::CUDA, &compact_selection);
  routed_attention_forward_kernels().register_kernel(DeviceKind::CUDA, &tuned_forward);
  routed_attention_backward_kernels().register_kernel(DeviceKind::CUDA, &tuned_backward);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

// CUDA kernels of core/ops/routed_attention_decode.h (the CPU reference is
// core/cpu/routed_attention_decode.cpp): flash-decoding over a KV cache.
//
// Decoding is memory-bound: each new query reads every visible cached key and value once,
// and a handful of queries alone would leave most of the GPU idle, so the keys are split
// across blocks too. A block of 4 warps owns one row r = (b, i), one kv head g, a slice of
// up to kGroup of g's query heads (the cache is read once for all of them) and split s: the
// visible keys [s L, min(s L + L, visible[r])). L is chosen on the host so that one wave of
// blocks fills the GPU.
//
// The block walks its keys in tiles of TK (64, or fewer where wide heads would not leave
// two blocks an SM): the tile's key and value rows go to shared memory by 16-byte cp.async,
// three tiles in a ring, so two tiles' bytes are in flight while the block computes on the
// third (one barrier a tile). Warp w owns the tile's keys w TK/4 .. (w + 1) TK/4 - 1 and
// keeps its own running softmax, so warps never wait for one another inside a tile:
//   scores   the kSplit = 128 / TK lanes of key j each take every kSplit-th 16-byte pack
//            of k_j against q in shared memory, then add their parts by shuffles:
//            s[j][h] = scale <q_h, k_j>
//   softmax  per head, over the warp's keys of the tile (shuffles):
//            m' = max(m, max_j s),  alpha_h = e^{m - m'},  P[j][h] = e^{s - m'},
//            l' = alpha l + sum_j P[j][h]
//   values   lane owns the column pairs c = 2 lane + 64 u (u < kPairs); for each key j of
//            the warp, P[j][h] p_j comes by shuffle and the row v_j from shared memory:
//            acc[h][c] = alpha_h acc[h][c] + sum_j P[j][h] p_j v_j[c]      (v' = p v)
// At the end the 4 warps' (m, l, acc) merge in shared memory, in warp order:
//   M = max_w m_w,  l = sum_w e^{m_w - M} l_w,  acc = sum_w e^{m_w - M} acc_w,
// and the block writes o_s = acc / l, lse_s = M + log l (o_s = 0, lse_s = -inf when the
// split holds no key). With one split these are the results; otherwise a second kernel
// merges the splits of each (b, i, h) in split order (deterministic, no atomics):
//   lse = log sum_s e^{lse_s},   o = sum_s e^{lse_s - lse} o_s.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/routed_attention_decode.h"
#include "cuda/async_copy.cuh"
#include "cuda/launch.h"
#include "cuda/routed_attention.h"

namespace ham::cuda {

namespace {

constexpr const char* kOp = "routed_attention_decode (cuda)";
constexpr int kDecodeThreads = 128;  // 4 warps
constexpr int kWarps = kDecodeThreads / 32;
constexpr int kStages = 3;           // tiles in the shared-memory ring: two in flight
constexpr int kMostTileKeys = 64;    // 2 lanes a key
constexpr int kLeastTileKeys = 8;    // 16 lanes a key
constexpr int kAutomaticMostTileKeys = 32;  // choose_tile_keys
constexpr int kWarpMostKeys = kMostTileKeys / kWarps;
constexpr int kMaxPairs = 8;         // column pairs per lane: Dv <= 512
constexpr int kMaxValueDim = 64 * kMaxPairs;
constexpr int64_t kMinKeysPerSplit = 128;

// 0: the host picks the tile (launch_decode); else the keys a tile, set for benchmarks.
std::atomic<int> g_decode_tile_keys{0};

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return ::log(x); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows (b, i) whose visible counts travel inside the kernel's arguments: no host-to-device
// copy, which would wait for the stream, between the layers of a decoding step.
constexpr int kInlineRows = 64;

template <class T>
struct DecodeArgs {
  const T *q, *k, *v, *p;  // p (value scales [B, C]) may be null
  const int64_t* visible;  // [B * n] on the device, or null: then inline_visible
  int64_t inline_visible[kInlineRows];
  T* out;
  compute_t<T>* lse;
  compute_t<T>* part_o;    // [B * n, Hq, splits, Dv] when splits > 1
  compute_t<T>* part_lse;  // [B * n, Hq, splits]
  int64_t queries, capacity, q_heads, kv_heads, key_dim, value_dim;
  int group, slices, splits, split_keys, tile_keys;
  bool packed_k, packed_v;  // key / value rows move as 16-byte cp.async packs
  compute_t<T> scale;
};

// The shared-memory carve of one block, the same on host (sizing) and device. Rows are
// whole 16-byte packs (an unpacked row's tail is zero in shared memory and in q). A key row
// is padded so that the kSplit lanes of 8 / kSplit keys (a quarter warp's 16-byte loads)
// start on distinct banks: its packs are kSplit (mod 8) for kSplit < 8.
template <class T, int kGroup>
struct DecodeLayout {
  static constexpr int kPack = kPackWidth<T>;  // elements a 16-byte pack
  int split, key_packs, ldk, ldv;              // lanes a key; packs of k; row strides (T)
  size_t q, m, l, prob, ring, merge, stage, bytes;
  __host__ __device__ DecodeLayout(int64_t key_dim, int64_t value_dim, int tile_keys) {
    using C = compute_t<T>;
    split = kDecodeThreads / tile_keys;
    key_packs = int((key_dim + kPack - 1) / kPack);
    const int pad = split < 8 ? ((split - key_packs % 8) % 8 + 8) % 8 : 0;
    ldk = (key_packs + pad) * kPack;
    ldv = int((value_dim + kPack - 1) / kPack) * kPack;
    stage = size_t(tile_keys) * size_t(ldk + ldv) * sizeof(T);  // K rows, then V rows
    size_t at = 0;
    q = take(at, size_t(key_packs) * kPack * kGroup * sizeof(C));  // [kGroup][key_packs * kPack]
    m = take(at, size_t(kWarps) * kGroup * sizeof(C));            // [warp][kGroup]
    l = take(at, size_t(kWarps) * kGroup * sizeof(C));
    prob = take(at, size_t(kWarps) * kGroup * kWarpMostKeys * sizeof(C));  // [warp][kGroup][key]
    // The ring, and after the last tile the warps' accumulators [warp][kGroup][Dv] in it.
    ring = merge = take(at, std::max(kStages * stage,
                                     size_t(kWarps) * kGroup * size_t(value_dim) * sizeof(C)));
    bytes = at;
  }
  // Offset of the next `n` bytes from `at`, 16-byte aligned.
  __host__ __device__ static size_t take(size_t& at, size_t n) {
    const size_t here = at;
    at += (n + 15) / 16 * 16;
    return here;
  }
};

// A thread's items in a tile's rows of `width` items each (16-byte packs, or elements of
// an unpacked row): a row of up to kDecodeThreads items takes `width` consecutive threads,
// kDecodeThreads / width rows at a time (the threads left over idle); a wider row takes
// every thread, each every kDecodeThreads-th item. Set once a block, so that a copy costs
// an add and a compare.
struct RowWalk {
  int width, first_row, item, rows_step;
  __device__ explicit RowWalk(int items_a_row)
      : width(items_a_row),
        first_row(int(threadIdx.x) / items_a_row),
        item(int(threadIdx.x) % items_a_row),
        rows_step(max(1, kDecodeThreads / items_a_row)) {
    if (first_row >= rows_step) first_row = kMostTileKeys;  // idle: past every tile's rows
  }
  // fn(j, u) for each of this thread's items (j, u) in rows [0, rows).
  template <class Fn>
  __device__ __forceinline__ void each(int rows, Fn&& fn) const {
    for (int j = first_row; j < rows; j += rows_step) {
      for (int u = item; u < width; u += kDecodeThreads) fn(j, u);
    }
  }
};

// Issues the copies of `rows` cached rows (stride src_stride elements) of one kv head into
// a ring slot's rows (stride ld): 16-byte cp.async packs when `packed`, else element by
// element (a dim not a whole number of packs, or an unaligned cache) with the row's tail
// zeroed. `walk` is this thread's RowWalk over packs (packed) or elements.
template <class T>
__device__ __forceinline__ void issue_rows(bool packed, const RowWalk& walk, const T* src,
                                           int64_t src_stride, int64_t dim, int rows, int ld,
                                           T* dst) {
  constexpr int N = kPackWidth<T>;
  if (packed) {
    const char* src_bytes = reinterpret_cast<const char*>(src);
    const uint32_t stride_bytes = uint32_t(src_stride * int64_t(sizeof(T)));
    walk.each(rows, [&](int j, int u) {
      const char* row =
          static_cast<const char*>(strided_address(src_bytes, uint32_t(j), stride_bytes));
      async_copy_16(dst + j * ld + u * N, row + u * 16);
    });
  } else {
    walk.each(rows, [&](int j, int d) {
      dst[j * ld + d] = d < dim ? src[j * src_stride + d] : store<T>(compute_t<T>(0));
    });
  }
}

// kGroup query heads per block, kPairs column pairs per lane (Dv <= 64 kPairs): a narrow
// head's accumulators take no registers it does not use.
template <class T, int kGroup, int kPairs>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(DecodeArgs<T> a) {
  using C = compute_t<T>;
  constexpr int N = kPackWidth<T>, NC = kPackWidth<C>;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  const DecodeLayout<T, kGroup> lay(a.key_dim, a.value_dim, a.tile_keys);
  C* s_q = reinterpret_cast<C*>(smem_raw + lay.q);
  C* s_m = reinterpret_cast<C*>(smem_raw + lay.m);
  C* s_l = reinterpret_cast<C*>(smem_raw + lay.l);
  C* s_prob = reinterpret_cast<C*>(smem_raw + lay.prob);
  C* s_acc = reinterpret_cast<C*>(smem_raw + lay.merge);
  unsigned char* ring = smem_raw + lay.ring;

  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int64_t row = blockIdx.x;  // b * n + i
  const int64_t b = row / a.queries;
  const int g = int(blockIdx.y) / a.slices;
  const int first_head = g * a.group + (int(blockIdx.y) % a.slices) * kGroup;
  const int heads = min(kGroup, g * a.group + a.group - first_head);  // of this slice
  const int split = int(blockIdx.z);
  const int64_t Dk = a.key_dim, Dv = a.value_dim;
  const int64_t visible = a.visible ? a.visible[row] : a.inline_visible[row];
  const int64_t lo = int64_t(split) * a.split_keys;
  const int64_t hi = min(lo + a.split_keys, visible);
  const int TK = a.tile_keys, tiles = hi > lo ? int((hi - lo + TK - 1) / TK) : 0;

  const int64_t k_stride = a.kv_heads * Dk, v_stride = a.kv_heads * Dv;
  const T* k_base = a.k + (b * a.capacity * a.kv_heads + g) * Dk;
  const T* v_base = a.v + (b * a.capacity * a.kv_heads + g) * Dv;
  const RowWalk k_walk(a.packed_k ? lay.key_packs : lay.key_packs * N);
  const RowWalk v_walk(a.packed_v ? lay.ldv / N : lay.ldv);
  auto issue = [&](int tile) {  // tile `tile` into ring slot tile % kStages, if it exists
    if (tile >= tiles) return;
    const int64_t t0 = lo + int64_t(tile) * TK;
    const int rows = int(min(int64_t(TK), hi - t0));
    T* sk = reinterpret_cast<T*>(ring + size_t(tile % kStages) * lay.stage);
    issue_rows(a.packed_k, k_walk, k_base + t0 * k_stride, k_stride, Dk, rows, lay.ldk, sk);
    issue_rows(a.packed_v, v_walk, v_base + t0 * v_stride, v_stride, Dv, rows, lay.ldv,
               sk + TK * lay.ldk);
  };
  issue(0);
  async_copy_commit();
  issue(1);
  async_copy_commit();

  // q of the slice's heads, [kGroup][key_packs * N] (zeros for heads past the slice and
  // for the tail of an unpacked row), while the first tiles load.
  const int64_t q_width = int64_t(lay.key_packs) * N;
  for (int64_t idx = tid; idx < q_width * kGroup; idx += kDecodeThreads) {
    const int h = int(idx / q_width);
    const int64_t d = idx % q_width;
    s_q[idx] = h < heads && d < Dk ? C(load(a.q[(row * a.q_heads + first_head + h) * Dk + d]))
                                   : C(0);
  }

  C m_run[kGroup], l_run[kGroup], acc[kGroup][2 * kPairs];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    m_run[h] = -INFINITY;
    l_run[h] = C(0);
#pragma unroll
    for (int e = 0; e < 2 * kPairs; ++e) acc[h][e] = C(0);
  }

  // This lane's key of each tile: j = warp's first + lane / kSplit, part lane % kSplit.
  const int warp_keys = TK / kWarps, kSplit = lay.split;
  const int part = lane % kSplit, key = lane / kSplit, j = warp * warp_keys + key;
  // Column pairs 2 lane + 64 u of v this lane holds (u < lane_pairs).
  const int lane_pairs = int(min(int64_t(kPairs), (Dv - 2 * lane + 63) / 64));
  // Its value scale, one tile ahead (read where the tile is computed).
  auto scale_at = [&](int tile) {
    const int64_t t = lo + int64_t(tile) * TK + j;
    return a.p && tile < tiles && t < hi ? C(load(a.p[b * a.capacity + t])) : C(1);
  };
  C scale_ahead = scale_at(0);
  for (int tile = 0; tile < tiles; ++tile) {
    async_copy_wait<1>();  // this thread's copies of `tile` have landed ...
    __syncthreads();       // ... and everyone's; the slot of tile - 1 is free
    issue(tile + 2);
    async_copy_commit();
    const C value_scale = scale_ahead;
    scale_ahead = scale_at(tile + 1);

    const int64_t t0 = lo + int64_t(tile) * TK;
    const int warp_valid =
        int(max(int64_t(0), min(int64_t(warp_keys), hi - t0 - warp * warp_keys)));
    if (warp_valid == 0) continue;  // warp-uniform: none of this warp's keys is visible
    const T* sk = reinterpret_cast<const T*>(ring + size_t(tile % kStages) * lay.stage);
    const T* sv = sk + TK * lay.ldk;

    // Scores: this lane's part of <q_h, k_j>, then the key's kSplit parts summed.
    C dot[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) dot[h] = C(0);
    const T* k_row = sk + j * lay.ldk;
    for (int u = part; u < lay.key_packs; u += kSplit) {
      const Pack<T, N> kp = *reinterpret_cast<const Pack<T, N>*>(k_row + u * N);
      C kd[N];
#pragma unroll
      for (int e = 0; e < N; ++e) kd[e] = C(load(kp.v[e]));
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const C* q_pack = s_q + h * q_width + u * N;
#pragma unroll
        for (int e0 = 0; e0 < N; e0 += NC) {
          const Pack<C, NC> qp = *reinterpret_cast<const Pack<C, NC>*>(q_pack + e0);
#pragma unroll
          for (int e = 0; e < NC; ++e) dot[h] += qp.v[e] * kd[e0 + e];
        }
      }
    }
    for (int offset = 1; offset < kSplit; offset <<= 1) {
#pragma unroll
      for (int h = 0; h < kGroup; ++h) dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], offset);
    }

    // The warp's online softmax per head over its keys of the tile.
    const bool valid = key < warp_valid;
    C* s_prob_warp = s_prob + warp * kGroup * kWarpMostKeys;
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const C score = valid ? a.scale * dot[h] : C(-INFINITY);
      const C step_max = warp_max(score);
      const C m_new = m_run[h] > step_max ? m_run[h] : step_max;
      const C alpha = m_run[h] == -INFINITY ? C(0) : exp_(m_run[h] - m_new);
      const C e = valid ? exp_(score - m_new) : C(0);
      l_run[h] = alpha * l_run[h] + warp_sum(part == 0 ? e : C(0));  // each key once
      m_run[h] = m_new;
      if (part == 0) s_prob_warp[h * kWarpMostKeys + key] = e * value_scale;  // P[j][h] p_j
#pragma unroll
      for (int c = 0; c < 2 * kPairs; ++c) acc[h][c] *= alpha;
    }
    __syncwarp();

    // acc[h][c] += sum_j P[j][h] p_j v_j[c] over the warp's valid keys, four keys' P at once.
    const T* v_row = sv + warp * warp_keys * lay.ldv + 2 * lane;  // pair 0 of the warp's key 0
    for (int j4 = 0; j4 < warp_valid; j4 += 4, v_row += 4 * lay.ldv) {
      C p4[kGroup][4];  // 16-byte loads: one for 4 floats, two for 4 doubles
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
#pragma unroll
        for (int e0 = 0; e0 < 4; e0 += NC) {
          const Pack<C, NC> pp =
              *reinterpret_cast<const Pack<C, NC>*>(s_prob_warp + h * kWarpMostKeys + j4 + e0);
#pragma unroll
          for (int e = 0; e < NC; ++e) p4[h][e0 + e] = pp.v[e];
        }
      }
      auto add_key = [&](int e) {
#pragma unroll
        for (int u = 0; u < kPairs; ++u) {
          if (u < lane_pairs) {
            const Pack<T, 2> vp =
                *reinterpret_cast<const Pack<T, 2>*>(v_row + e * lay.ldv + 64 * u);
            const C v0 = C(load(vp.v[0])), v1 = C(load(vp.v[1]));
#pragma unroll
            for (int h = 0; h < kGroup; ++h) {
              acc[h][2 * u] += p4[h][e] * v0;
              acc[h][2 * u + 1] += p4[h][e] * v1;
            }
          }
        }
      };
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (j4 + e < warp_valid) add_key(e);  // (warp-uniform)
      }
    }
  }
  // The last tile's wait covered every copy (the groups after it are empty). Once every
  // warp is done with the ring, it holds the merge.
  __syncthreads();

  // Merge the warps: each publishes (m, l, acc); then thread c of the block combines
  // columns c, c + 128, ... of every head in warp order.
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    if (lane == 0) {
      s_m[warp * kGroup + h] = m_run[h];
      s_l[warp * kGroup + h] = l_run[h];
    }
    C* acc_out = s_acc + (int64_t(warp) * kGroup + h) * Dv;
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      const int64_t c = 2 * lane + 64 * u;
      if (c >= Dv) break;
      acc_out[c] = acc[h][2 * u];
      if (c + 1 < Dv) acc_out[c + 1] = acc[h][2 * u + 1];
    }
  }
  __syncthreads();
  const bool direct = a.splits == 1;
  for (int h = 0; h < heads; ++h) {
    C most = -INFINITY;
    for (int w = 0; w < kWarps; ++w) most = s_m[w * kGroup + h] > most ? s_m[w * kGroup + h] : most;
    C weight[kWarps], l = C(0);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      weight[w] = most == -INFINITY || s_m[w * kGroup + h] == -INFINITY
                      ? C(0)
                      : exp_(s_m[w * kGroup + h] - most);
      l += weight[w] * s_l[w * kGroup + h];
    }
    const C inv = l == C(0) ? C(0) : C(1) / l;  // no key in this split: o = 0, lse = -inf
    const int64_t rh = row * a.q_heads + first_head + h;
    for (int64_t c = tid; c < Dv; c += kDecodeThreads) {
      C o = C(0);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o += weight[w] * s_acc[(int64_t(w) * kGroup + h) * Dv + c];
      o *= inv;
      if (direct) a.out[rh * Dv + c] = store<T>(o);
      else a.part_o[(rh * a.splits + split) * Dv + c] = o;
    }
    if (tid == 0) {
      const C lse = l == C(0) ? C(-INFINITY) : most + log_(l);
      if (direct) a.lse[rh] = lse;
      else a.part_lse[rh * a.splits + split] = lse;
    }
  }
}

// Merges the splits of each (b, i, h), in split order:
//   lse = M + log sum_s e^{lse_s - M} (M = max_s lse_s),  o = sum_s e^{lse_s - lse} o_s.
template <class T>
__global__ void merge_splits_kernel(DecodeArgs<T> a, int64_t row_heads) {
  using C = compute_t<T>;
  const int64_t Dv = a.value_dim;
  HAM_GRID_STRIDE_LOOP(idx, row_heads * Dv) {
    const int64_t rh = idx / Dv, c = idx % Dv;
    const C* lse_s = a.part_lse + rh * a.splits;
    C most = -INFINITY;
    for (int s = 0; s < a.splits; ++s) most = lse_s[s] > most ? lse_s[s] : most;
    if (most == -INFINITY) {  // no visible key at all
      a.out[idx] = store<T>(C(0));
      if (c == 0) a.lse[rh] = most;
      continue;
    }
    C total = C(0), o = C(0);
    for (int s = 0; s < a.splits; ++s) {
      const C w = exp_(lse_s[s] - most);
      total += w;
      o += w * a.part_o[(rh * a.splits + s) * Dv + c];
    }
    a.out[idx] = store<T>(o / total);
    if (c == 0) a.lse[rh] = most + log_(total);
  }
}

// Keys a tile for decode_kernel<T, kGroup, kPairs>: the largest of 32, 16, 8 at which two
// blocks fit an SM (so one block's barrier wait overlaps another's work), else the largest
// that fits at all; or the one set_attention_decode_keys asks for (64 only so). On the H200
// (2026-11-27) 64 keys took 1.00-1.89x the time of 32 and 16 keys 1.01-1.18x, except at
// 16 x 16 heads of 128 and 65536 keys (0.93x), where 32 was faster still (0.77x of 64).
template <class T, int kGroup, int kPairs>
int choose_tile_keys(const DecodeArgs<T>& a, size_t limit) {
  auto* kernel = &decode_kernel<T, kGroup, kPairs>;
  auto bytes_at = [&](int keys) {
    return DecodeLayout<T, kGroup>(a.key_dim, a.value_dim, keys).bytes;
  };
  auto no_fit = [&](int keys) {
    HAM_FAIL(kOp, ": Dk = ", a.key_dim, ", Dv = ", a.value_dim, " in ", sizeof(T),
             "-byte elements need ", bytes_at(keys), " bytes of shared memory per block at ",
             keys, " keys a tile, more than the device's ", limit);
  };
  if (const int set = g_decode_tile_keys.load(); set != 0) {
    if (bytes_at(set) > limit) no_fit(set);
    return set;
  }
  int fitting = 0;
  for (int keys = kAutomaticMostTileKeys; keys >= kLeastTileKeys; keys /= 2) {
    const size_t bytes = bytes_at(keys);
    if (bytes > limit) continue;
    if (resident_blocks_per_sm(kOp, kernel, kDecodeThreads, bytes) >= 2) return keys;
    if (fitting == 0) fitting = keys;
  }
  if (fitting == 0) no_fit(kLeastTileKeys);
  return fitting;
}

template <class T, int kGroup, int kPairs>
void launch_decode(DecodeArgs<T>& a, int64_t rows, int64_t most_visible, Device device) {
  auto* kernel = &decode_kernel<T, kGroup, kPairs>;
  a.tile_keys = choose_tile_keys<T, kGroup, kPairs>(a, max_shared_per_block());
  const size_t bytes = DecodeLayout<T, kGroup>(a.key_dim, a.value_dim, a.tile_keys).bytes;
  allow_dynamic_shared(kOp, kernel, bytes);
  // Splits: as many blocks as the GPU holds at once (one wave: a second, partial wave of
  // splits would double the time; on the H200 a fixed 4 blocks per SM, of which 3 fit, ran
  // 1.29 waves), each split a whole number of tiles and at least kMinKeysPerSplit keys (a
  // split's fixed costs, q, the ring's first fill and its partial result, stay small).
  const int resident_per_sm = resident_blocks_per_sm(kOp, kernel, kDecodeThreads, bytes);
  const int64_t resident = std::max(1, resident_per_sm) * int64_t(multiprocessor_count());
  const int64_t base_blocks = rows * a.kv_heads * a.slices;
  const int64_t tiles = std::max<int64_t>(1, ceil_div(most_visible, a.tile_keys));
  const int64_t wanted = std::clamp<int64_t>(resident / base_blocks, 1, tiles);
  const int64_t tiles_per_split = std::max<int64_t>(ceil_div(kMinKeysPerSplit, a.tile_keys),
                                                    ceil_div(tiles, wanted));
  a.split_keys = int(tiles_per_split * a.tile_keys);
  a.splits = int(std::max<int64_t>(1, ceil_div(most_visible, a.split_keys)));
  HAM_CHECK(a.kv_heads * a.slices <= 65535, kOp, ": ", a.kv_heads, " kv heads exceed the grid");
  HAM_CHECK(rows < (int64_t(1) << 31), kOp, ": ", rows, " query rows exceed the grid");

  Tensor part_o, part_lse;
  if (a.splits > 1) {
    part_o = Tensor::empty(Shape{rows * a.q_heads * a.splits * a.value_dim}, compute_dtype<T>(), device);
    part_lse = Tensor::empty(Shape{rows * a.q_heads * a.splits}, compute_dtype<T>(), device);
    a.part_o = ptr<compute_t<T>>(part_o);
    a.part_lse = ptr<compute_t<T>>(part_lse);
  }
  const dim3 grid(unsigned(rows), unsigned(a.kv_heads * a.slices), unsigned(a.splits));
  HAM_LAUNCH(grid, kDecodeThreads, bytes, launch_stream(), kernel)(a);
  HAM_CUDA_CHECK_LAUNCH();
  if (a.splits > 1) {
    const int64_t row_heads = rows * a.q_heads;
    HAM_LAUNCH(grid_for(row_heads * a.value_dim), kThreads, 0, launch_stream(),
               merge_splits_kernel<T>)(a, row_heads);
    HAM_CUDA_CHECK_LAUNCH();
  }
}

// Heads per block for kPairs column pairs per lane: the accumulators stay at 32 registers
// (kGroup x 2 kPairs) or fewer.
template <class T, int kPairs>
void launch_for_group(DecodeArgs<T>& a, int64_t rows, int64_t most_visible, Device device) {
  auto run = [&]<int kGroup>() {
    a.slices = int(ceil_div(a.group, kGroup));
    launch_decode<T, kGroup, kPairs>(a, rows, most_visible, device);
  };
  constexpr int kMostHeads = 16 / kPairs;
  if constexpr (kMostHeads >= 8) {
    if (a.group >= 8) return run.template operator()<8>();
  }
  if constexpr (kMostHeads >= 4) {
    if (a.group >= 4) return run.template operator()<4>();
  }
  if (a.group >= 2) return run.template operator()<2>();
  run.template operator()<1>();
}

void decode(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
            const Tensor& value_scale, const Tensor& visible, double scale, Tensor& out,
            Tensor& lse) {
  if (out.numel() == 0) return;
  use_device_of(q);
  const int64_t B = q.size(0), n = q.size(1), rows = B * n;
  const std::vector<int64_t> counts = visible.to_vector<int64_t>();
  const int64_t most_visible = *std::max_element(counts.begin(), counts.end());
  const Tensor visible_on_device = rows > kInlineRows ? visible.to(q.device()) : Tensor();
  dispatch_floating(kOp, q.dtype(), [&]<class T>() {
    DecodeArgs<T> a{};
    a.q = ptr<const T>(q);
    a.k = ptr<const T>(k_cache);
    a.v = ptr<const T>(v_cache);
    a.p = ptr_or_null<const T>(value_scale);
    if (visible_on_device.defined()) {
      a.visible = ptr<const int64_t>(visible_on_device);
    } else {
      std::copy(counts.begin(), counts.end(), a.inline_visible);
    }
    a.out = ptr<T>(out);
    a.lse = ptr<compute_t<T>>(lse);
    a.queries = n;
    a.capacity = k_cache.size(1);
    a.q_heads = q.size(2);
    a.kv_heads = k_cache.size(2);
    a.key_dim = q.size(3);
    a.value_dim = v_cache.size(3);
    a.group = int(a.q_heads / a.kv_heads);
    a.scale = compute_t<T>(scale);
    a.packed_k = aligned_16(a.k) && (a.key_dim * int64_t(sizeof(T))) % 16 == 0;
    a.packed_v = aligned_16(a.v) && (a.value_dim * int64_t(sizeof(T))) % 16 == 0;
    HAM_CHECK(a.value_dim <= kMaxValueDim, kOp, ": Dv = ", a.value_dim, " of v_cache ",
              shape_str(v_cache.shape()), " exceeds ", kMaxValueDim);
    if (a.value_dim <= 128) launch_for_group<T, 2>(a, rows, most_visible, q.device());
    else if (a.value_dim <= 256) launch_for_group<T, 4>(a, rows, most_visible, q.device());
    else launch_for_group<T, kMaxPairs>(a, rows, most_visible, q.device());
  });
}

}  // namespace

int set_attention_decode_keys(int keys) {
  HAM_CHECK(keys == 0 || keys == 8 || keys == 16 || keys == 32 || keys == 64,
            "set_attention_decode_keys: ", keys, " keys a tile; expected 0 (automatic), 8, 16, "
            "32 or 64");
  return g_decode_tile_keys.exchange(keys);
}

namespace {

const bool registered = [] {
  routed_attention_decode_kernels().register_kernel(DeviceKind::CUDA, &decode);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

// CUDA kernels of core/ops/routed_attention_decode.h (the CPU reference is
// core/cpu/routed_attention_decode.cpp): flash-decoding over a KV cache.
//
// Decoding is memory-bound: each new query reads every visible cached key and value once,
// and a handful of queries alone would leave most of the GPU idle, so the keys are split
// across blocks too. A block of 128 threads owns one row r = (b, i), one kv head g, a
// slice of up to kGroup of g's query heads (the cache is read once for all of them) and
// split s: the visible keys [s L, min(s L + L, visible[r])). L is chosen on the host so
// that the grid fills the GPU. Per tile of BK keys (64, or 32 or 16 where 64 would not
// fit shared memory), staged in shared memory with 16-byte loads where the rows allow:
//   scores   thread t takes key j = t % BK and every (128 / BK)-th element of Dk from
//            t / BK on, for all the slice's heads; the parts are then added:
//            s[j][h] = scale <q_h, k_j>
//   softmax  warp w keeps the running max m_h and sum l_h of heads h = w, w + 4, ...:
//            m' = max(m, max_j s),  alpha_h = e^{m - m'},  P[j][h] = e^{s - m'},
//            l' = alpha l + sum_j P[j][h]
//   values   thread t owns value columns c = t, t + 128, ... (Dv <= 512) for every head:
//            acc[h][c] = alpha_h acc[h][c] + sum_j P[j][h] p_j v_j[c]      (v' = p v)
// The block ends with o_s = acc / l and lse_s = m + log l (o_s = 0, lse_s = -inf when the
// split holds no key). With one split these are the results; otherwise a second kernel
// merges the splits of each (b, i, h) in split order (deterministic, no atomics):
//   lse = log sum_s e^{lse_s},   o = sum_s e^{lse_s - lse} o_s.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/ops/routed_attention_decode.h"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

constexpr const char* kOp = "routed_attention_decode (cuda)";
constexpr int kDecodeThreads = 128;                  // 4 warps
constexpr int kWarps = kDecodeThreads / 32;
constexpr int kMaxColumnsPerThread = 4;              // Dv <= 512
constexpr int kMaxValueDim = kDecodeThreads * kMaxColumnsPerThread;
constexpr int kLoadsInFlight = 8;                    // tile loads a thread issues at once
constexpr int64_t kMinTilesPerSplit = 2;

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
  int ldk;             // shared row stride of the key tile (elements)
  bool packed_k, packed_v;  // rows move as 16-byte packs
  compute_t<T> scale;
};

// The shared-memory carve of one block, the same on host (sizing) and device.
template <class T, int kGroup>
struct DecodeLayout {
  size_t q, k, v, parts, probs, alpha, m, l, pscale, bytes;
  __host__ __device__ DecodeLayout(int64_t key_dim, int64_t value_dim, int ldk, int tile_keys) {
    using C = compute_t<T>;
    size_t at = 0;
    q = take(at, size_t(key_dim) * kGroup * sizeof(C));             // [Dk][kGroup]
    k = take(at, size_t(tile_keys) * ldk * sizeof(T));              // [BK][ldk]
    v = take(at, size_t(tile_keys) * value_dim * sizeof(T));        // [BK][Dv]
    parts = take(at, size_t(kDecodeThreads) * kGroup * sizeof(C));  // [128 / BK][BK][kGroup]
    probs = take(at, size_t(tile_keys) * kGroup * sizeof(C));       // [BK][kGroup]
    alpha = take(at, kGroup * sizeof(C));
    m = take(at, kGroup * sizeof(C));
    l = take(at, kGroup * sizeof(C));
    pscale = take(at, size_t(tile_keys) * sizeof(C));
    bytes = at;
  }
  // Offset of the next `n` bytes from `at`, 16-byte aligned.
  __host__ __device__ static size_t take(size_t& at, size_t n) {
    const size_t here = at;
    at += (n + 15) / 16 * 16;
    return here;
  }
};

// rows [0, n) of a shared [BK][ld] tile from cache rows first, first + 1, ... of (b, g):
// global row j is at src + j * stride (elements). Packed: 16-byte loads (rows and src
// 16-byte aligned), kLoadsInFlight of them issued before any is stored.
template <class T>
__device__ void load_tile(T* tile, int ld, const T* src, int64_t stride, int n, int64_t d,
                          bool packed) {
  if (packed) {
    constexpr int N = kPackWidth<T>;
    using P = Pack<T, N>;
    const int chunks = int(d / N), total = n * chunks;
    for (int base = int(threadIdx.x); base < total; base += kDecodeThreads * kLoadsInFlight) {
      P held[kLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int idx = base + u * kDecodeThreads;
        if (idx < total) {
          held[u] = *reinterpret_cast<const P*>(src + (idx / chunks) * stride + (idx % chunks) * N);
        }
      }
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int idx = base + u * kDecodeThreads;
        if (idx < total) {
          T* dst = tile + (idx / chunks) * ld + (idx % chunks) * N;
#pragma unroll
          for (int e = 0; e < N; ++e) dst[e] = held[u].v[e];
        }
      }
    }
  } else {
    const int total = n * int(d);
    for (int idx = int(threadIdx.x); idx < total; idx += kDecodeThreads) {
      tile[(idx / d) * ld + idx % d] = src[(idx / d) * stride + idx % d];
    }
  }
}

template <class T, int kGroup>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(DecodeArgs<T> a) {
  using C = compute_t<T>;
  constexpr int kHeadsPerWarp = (kGroup + kWarps - 1) / kWarps;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  const DecodeLayout<T, kGroup> layout(a.key_dim, a.value_dim, a.ldk, a.tile_keys);
  C* s_q = reinterpret_cast<C*>(smem_raw + layout.q);
  T* s_k = reinterpret_cast<T*>(smem_raw + layout.k);
  T* s_v = reinterpret_cast<T*>(smem_raw + layout.v);
  C* s_parts = reinterpret_cast<C*>(smem_raw + layout.parts);
  C* s_probs = reinterpret_cast<C*>(smem_raw + layout.probs);
  C* s_alpha = reinterpret_cast<C*>(smem_raw + layout.alpha);
  C* s_m = reinterpret_cast<C*>(smem_raw + layout.m);
  C* s_l = reinterpret_cast<C*>(smem_raw + layout.l);
  C* s_pscale = reinterpret_cast<C*>(smem_raw + layout.pscale);

  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int64_t row = blockIdx.x;  // b * n + i
  const int64_t b = row / a.queries;
  const int g = int(blockIdx.y) / a.slices;
  const int first_head = g * a.group + (int(blockIdx.y) % a.slices) * kGroup;
  const int heads = min(kGroup, g * a.group + a.group - first_head);  // of this slice
  const int split = int(blockIdx.z);
  const int64_t Dk = a.key_dim, Dv = a.value_dim;
  const int BK = a.tile_keys;
  const int64_t visible = a.visible ? a.visible[row] : a.inline_visible[row];
  const int64_t lo = int64_t(split) * a.split_keys;
  const int64_t hi = min(lo + a.split_keys, visible);

  // q of the slice's heads, transposed to [Dk][kGroup] (zeros for heads past the slice).
  for (int64_t idx = tid; idx < Dk * kGroup; idx += kDecodeThreads) {
    const int64_t d = idx / kGroup;
    const int h = int(idx % kGroup);
    s_q[idx] = h < heads ? C(load(a.q[(row * a.q_heads + first_head + h) * Dk + d])) : C(0);
  }

  // Running max and sum of the heads this warp keeps (h = warp + kWarps u).
  C m_run[kHeadsPerWarp], l_run[kHeadsPerWarp];
#pragma unroll
  for (int u = 0; u < kHeadsPerWarp; ++u) {
    m_run[u] = -INFINITY;
    l_run[u] = C(0);
  }
  C acc[kMaxColumnsPerThread][kGroup];
#pragma unroll
  for (int r = 0; r < kMaxColumnsPerThread; ++r) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) acc[r][h] = C(0);
  }

  const int parts = kDecodeThreads / BK;
  const int j_mine = tid % BK, part = tid / BK;
  const int64_t k_stride = a.kv_heads * Dk, v_stride = a.kv_heads * Dv;
  const T* k_base = a.k + (b * a.capacity * a.kv_heads + g) * Dk;
  const T* v_base = a.v + (b * a.capacity * a.kv_heads + g) * Dv;
  for (int64_t t0 = lo; t0 < hi; t0 += BK) {
    const int n = int(min(int64_t(BK), hi - t0));
    __syncthreads();  // the previous tile's readers are done (and s_q is written)
    load_tile(s_k, a.ldk, k_base + t0 * k_stride, k_stride, n, Dk, a.packed_k);
    load_tile(s_v, int(Dv), v_base + t0 * v_stride, v_stride, n, Dv, a.packed_v);
    if (tid < n) s_pscale[tid] = a.p ? C(load(a.p[b * a.capacity + t0 + tid])) : C(1);
    __syncthreads();

    // Scores, part by part: thread (j, part) sums elements part, part + parts, ... of Dk.
    {
      C dot[kGroup];
#pragma unroll
      for (int h = 0; h < kGroup; ++h) dot[h] = C(0);
      if (j_mine < n) {
        const T* k_row = s_k + j_mine * a.ldk;
        for (int64_t d = part; d < Dk; d += parts) {
          const C kd = C(load(k_row[d]));
#pragma unroll
          for (int h = 0; h < kGroup; ++h) dot[h] += s_q[d * kGroup + h] * kd;
        }
      }
#pragma unroll
      for (int h = 0; h < kGroup; ++h) s_parts[(part * BK + j_mine) * kGroup + h] = dot[h];
    }
    __syncthreads();

    // Online softmax, one warp per head: lanes over the tile's keys.
#pragma unroll
    for (int u = 0; u < kHeadsPerWarp; ++u) {
      const int h = warp + kWarps * u;
      if (h >= kGroup) continue;
      C s_lane[2];
      C tile_max = -INFINITY;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = lane + 32 * e;
        C s = -INFINITY;
        if (j < n) {
          s = C(0);
          for (int q_part = 0; q_part < parts; ++q_part) s += s_parts[(q_part * BK + j) * kGroup + h];
          s *= a.scale;
        }
        s_lane[e] = s;
        tile_max = s > tile_max ? s : tile_max;
      }
      tile_max = warp_max(tile_max);
      const C m_new = m_run[u] > tile_max ? m_run[u] : tile_max;
      const C alpha = m_run[u] == -INFINITY ? C(0) : exp_(m_run[u] - m_new);
      C sum = C(0);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = lane + 32 * e;
        const C prob = s_lane[e] == -INFINITY ? C(0) : exp_(s_lane[e] - m_new);
        sum += prob;
        if (j < BK) s_probs[j * kGroup + h] = j < n ? prob * s_pscale[j] : C(0);
      }
      sum = warp_sum(sum);
      m_run[u] = m_new;
      l_run[u] = alpha * l_run[u] + sum;
      if (lane == 0) s_alpha[h] = alpha;
    }
    __syncthreads();

    // acc[h][c] = alpha_h acc[h][c] + sum_j P[j][h] p_j v_j[c]
    C alpha[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) alpha[h] = s_alpha[h];
#pragma unroll
    for (int r = 0; r < kMaxColumnsPerThread; ++r) {
      const int64_t c = tid + int64_t(r) * kDecodeThreads;
      if (c >= Dv) break;
      C sums[kGroup];
#pragma unroll
      for (int h = 0; h < kGroup; ++h) sums[h] = C(0);
      for (int j = 0; j < n; ++j) {
        const C vj = C(load(s_v[j * Dv + c]));
#pragma unroll
        for (int h = 0; h < kGroup; ++h) sums[h] += s_probs[j * kGroup + h] * vj;
      }
#pragma unroll
      for (int h = 0; h < kGroup; ++h) acc[r][h] = alpha[h] * acc[r][h] + sums[h];
    }
  }

  // Publish each head's max and sum, then write o = acc / l and lse = m + log l.
#pragma unroll
  for (int u = 0; u < kHeadsPerWarp; ++u) {
    const int h = warp + kWarps * u;
    if (h < kGroup && lane == 0) {
      s_m[h] = m_run[u];
      s_l[h] = l_run[u];
    }
  }
  __syncthreads();
  const bool direct = a.splits == 1;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    if (h >= heads) break;
    const C l = s_l[h];
    const C inv = l == C(0) ? C(0) : C(1) / l;  // no key in this split: o = 0, lse = -inf
    const int64_t rh = row * a.q_heads + first_head + h;
#pragma unroll
    for (int r = 0; r < kMaxColumnsPerThread; ++r) {
      const int64_t c = tid + int64_t(r) * kDecodeThreads;
      if (c >= Dv) break;
      const C o = acc[r][h] * inv;
      if (direct) a.out[rh * Dv + c] = store<T>(o);
      else a.part_o[(rh * a.splits + split) * Dv + c] = o;
    }
    if (tid == 0) {
      const C lse = l == C(0) ? C(-INFINITY) : s_m[h] + log_(l);
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

// Smallest row stride >= d (elements) whose length in 4-byte words is odd, so that lanes
// reading one element of consecutive rows hit different banks (8-byte elements: an odd
// count of them).
int bank_spread_stride(int64_t d, size_t element) {
  int64_t ld = d;
  if (element == 8) return int(ld % 2 ? ld : ld + 1);
  while ((ld * int64_t(element)) % 4 != 0 || (ld * int64_t(element) / 4) % 2 == 0) ++ld;
  return int(ld);
}

template <class T, int kGroup>
void launch_decode(DecodeArgs<T>& a, int64_t rows, int64_t most_visible, Device device) {
  const size_t limit = max_shared_per_block();
  size_t bytes = 0;
  for (int tile : {64, 32, 16}) {
    a.tile_keys = tile;
    bytes = DecodeLayout<T, kGroup>(a.key_dim, a.value_dim, a.ldk, tile).bytes;
    if (bytes <= limit) break;
  }
  HAM_CHECK(bytes <= limit, kOp, ": Dk = ", a.key_dim, ", Dv = ", a.value_dim, " in ",
            sizeof(T), "-byte elements need ", bytes, " bytes of shared memory per block, more "
            "than the device's ", limit);
  // Splits: enough blocks for 4 per multiprocessor, each split a whole number of tiles, at
  // least kMinTilesPerSplit (a split's fixed costs, q and its partial result, stay small).
  const int64_t base_blocks = rows * a.kv_heads * a.slices;
  const int64_t tiles = std::max<int64_t>(1, ceil_div(most_visible, a.tile_keys));
  const int64_t wanted = ceil_div(4 * int64_t(multiprocessor_count()), base_blocks);
  const int64_t tiles_per_split = std::max<int64_t>(
      kMinTilesPerSplit, ceil_div(tiles, std::clamp<int64_t>(wanted, 1, tiles)));
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
  auto* kernel = &decode_kernel<T, kGroup>;
  if (bytes > 48 * 1024) {
    HAM_CUDA_CHECK_CTX(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), kOp,
        ": ", bytes, " bytes of dynamic shared memory");
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
    a.ldk = bank_spread_stride(a.key_dim, sizeof(T));
    a.packed_k = aligned_16(a.k) && (a.key_dim * int64_t(sizeof(T))) % 16 == 0;
    a.packed_v = aligned_16(a.v) && (a.value_dim * int64_t(sizeof(T))) % 16 == 0;
    HAM_CHECK(a.value_dim <= kMaxValueDim, kOp, ": Dv = ", a.value_dim, " of v_cache ",
              shape_str(v_cache.shape()), " exceeds ", kMaxValueDim);
    auto run = [&]<int kGroup>() {
      a.slices = int(ceil_div(a.group, kGroup));
      launch_decode<T, kGroup>(a, rows, most_visible, q.device());
    };
    if (a.group >= 8) run.template operator()<8>();
    else if (a.group >= 4) run.template operator()<4>();
    else if (a.group >= 2) run.template operator()<2>();
    else run.template operator()<1>();
  });
}

const bool registered = [] {
  routed_attention_decode_kernels().register_kernel(DeviceKind::CUDA, &decode);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

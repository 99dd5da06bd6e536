// CUDA kernels of core/ops/routed_attention_decode.h (the CPU reference is
// core/cpu/routed_attention_decode.cpp): flash-decoding over a KV cache.
//
// Decoding is memory-bound: each new query reads every visible cached key and value once,
// and a handful of queries alone would leave most of the GPU idle, so the keys are split
// across blocks too. A block of 4 warps owns one row r = (b, i), one kv head g, a slice of
// up to kGroup of g's query heads (the cache is read once for all of them) and split s: the
// visible keys [s L, min(s L + L, visible[r])). L is chosen on the host so that one wave of
// blocks fills the GPU. The block walks its keys in steps of 128: warp w takes the 32 keys
// 32 w .. 32 w + 31 of each step, and each warp keeps its own running softmax, so the
// keys stream from memory into registers with no barrier until the end:
//   scores   lane j reads key j's row (16-byte loads, 2 in flight) against q in shared
//            memory (every lane reads the same q element: a broadcast), for every head:
//            s[j][h] = scale <q_h, k_j>
//   softmax  per head, over the warp's 32 keys (shuffles):
//            m' = max(m, max_j s),  alpha_h = e^{m - m'},  P[j][h] = e^{s - m'},
//            l' = alpha l + sum_j P[j][h]
//   values   lane owns the column pairs c = 2 lane + 64 u (u < kPairs); for each key j of
//            the step, P[j][h] p_j comes by shuffle and the row v_j by a coalesced load
//            (16 / kPairs rows' loads in flight):
//            acc[h][c] = alpha_h acc[h][c] + sum_j P[j][h] p_j v_j[c]      (v' = p v)
// At the end the 4 warps' (m, l, acc) merge in shared memory, in warp order:
//   M = max_w m_w,  l = sum_w e^{m_w - M} l_w,  acc = sum_w e^{m_w - M} acc_w,
// and the block writes o_s = acc / l, lse_s = M + log l (o_s = 0, lse_s = -inf when the
// split holds no key). With one split these are the results; otherwise a second kernel
// merges the splits of each (b, i, h) in split order (deterministic, no atomics):
//   lse = log sum_s e^{lse_s},   o = sum_s e^{lse_s - lse} o_s.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/routed_attention_decode.h"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

constexpr const char* kOp = "routed_attention_decode (cuda)";
constexpr int kDecodeThreads = 128;  // 4 warps
constexpr int kWarps = kDecodeThreads / 32;
constexpr int kStepKeys = kDecodeThreads;  // keys a block takes per step: 32 per warp
constexpr int kMaxPairs = 8;               // column pairs per lane: Dv <= 512
constexpr int kMaxValueDim = 64 * kMaxPairs;
constexpr int kKeyLoadsInFlight = 2;       // 16-byte loads of a key row issued at once
constexpr int64_t kMinStepsPerSplit = 1;

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
  int group, slices, splits, split_keys;
  bool packed_k, paired_v;  // key rows move as 16-byte packs; value columns in pairs
  compute_t<T> scale;
};

// The shared-memory carve of one block, the same on host (sizing) and device.
template <class T, int kGroup>
struct DecodeLayout {
  size_t q, m, l, acc, bytes;
  __host__ __device__ DecodeLayout(int64_t key_dim, int64_t value_dim) {
    using C = compute_t<T>;
    size_t at = 0;
    q = take(at, size_t(key_dim) * kGroup * sizeof(C));                 // [kGroup][Dk]
    m = take(at, size_t(kWarps) * kGroup * sizeof(C));                  // [warp][kGroup]
    l = take(at, size_t(kWarps) * kGroup * sizeof(C));
    acc = take(at, size_t(kWarps) * kGroup * value_dim * sizeof(C));    // [warp][kGroup][Dv]
    bytes = at;
  }
  // Offset of the next `n` bytes from `at`, 16-byte aligned.
  __host__ __device__ static size_t take(size_t& at, size_t n) {
    const size_t here = at;
    at += (n + 15) / 16 * 16;
    return here;
  }
};

// dot[h] = <q_h, k> for the key row k (Dk elements) and q_h in shared memory ([kGroup][Dk]).
template <class T, int kGroup>
__device__ __forceinline__ void key_scores(const T* k, const compute_t<T>* s_q, int64_t Dk,
                                           bool packed, compute_t<T> (&dot)[kGroup]) {
  using C = compute_t<T>;
  if (packed) {
    constexpr int N = kPackWidth<T>;
    using P = Pack<T, N>;
    const P* row = reinterpret_cast<const P*>(k);
    const int packs = int(Dk / N);
    for (int base = 0; base < packs; base += kKeyLoadsInFlight) {
      P held[kKeyLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kKeyLoadsInFlight; ++u) {
        if (base + u < packs) held[u] = row[base + u];
      }
#pragma unroll
      for (int u = 0; u < kKeyLoadsInFlight; ++u) {
        if (base + u >= packs) break;
#pragma unroll
        for (int e = 0; e < N; ++e) {
          const int d = (base + u) * N + e;
          const C kd = C(load(held[u].v[e]));
#pragma unroll
          for (int h = 0; h < kGroup; ++h) dot[h] += s_q[h * Dk + d] * kd;
        }
      }
    }
  } else {
    for (int64_t d = 0; d < Dk; ++d) {
      const C kd = C(load(k[d]));
#pragma unroll
      for (int h = 0; h < kGroup; ++h) dot[h] += s_q[h * Dk + d] * kd;
    }
  }
}

// kGroup query heads per block, kPairs column pairs per lane (Dv <= 64 kPairs): a narrow
// head's accumulators take no registers it does not use.
template <class T, int kGroup, int kPairs>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(DecodeArgs<T> a) {
  using C = compute_t<T>;
  HAM_DYNAMIC_SHARED(unsigned char, smem_raw);
  const DecodeLayout<T, kGroup> layout(a.key_dim, a.value_dim);
  C* s_q = reinterpret_cast<C*>(smem_raw + layout.q);
  C* s_m = reinterpret_cast<C*>(smem_raw + layout.m);
  C* s_l = reinterpret_cast<C*>(smem_raw + layout.l);
  C* s_acc = reinterpret_cast<C*>(smem_raw + layout.acc);

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

  // q of the slice's heads, [kGroup][Dk] (zeros for heads past the slice).
  for (int64_t idx = tid; idx < Dk * kGroup; idx += kDecodeThreads) {
    const int h = int(idx / Dk);
    const int64_t d = idx % Dk;
    s_q[idx] = h < heads ? C(load(a.q[(row * a.q_heads + first_head + h) * Dk + d])) : C(0);
  }
  __syncthreads();

  C m_run[kGroup], l_run[kGroup], acc[kGroup][2 * kPairs];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    m_run[h] = -INFINITY;
    l_run[h] = C(0);
#pragma unroll
    for (int e = 0; e < 2 * kPairs; ++e) acc[h][e] = C(0);
  }

  const int64_t k_stride = a.kv_heads * Dk, v_stride = a.kv_heads * Dv;
  const T* k_base = a.k + (b * a.capacity * a.kv_heads + g) * Dk;
  const T* v_base = a.v + (b * a.capacity * a.kv_heads + g) * Dv;
  for (int64_t t0 = lo + 32 * warp; t0 < hi; t0 += kStepKeys) {
    const int n = int(min(int64_t(32), hi - t0));  // keys of this warp's step (uniform)
    const int64_t t = t0 + lane;

    // Scores of the lane's key, then the warp's online softmax per head.
    C s[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) s[h] = C(0);
    // (the value scale's load first, so that it is in flight with the key row's)
    const C value_scale = lane < n && a.p ? C(load(a.p[b * a.capacity + t])) : C(1);
    if (lane < n) key_scores<T, kGroup>(k_base + t * k_stride, s_q, Dk, a.packed_k, s);
    C prob[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const C score = lane < n ? a.scale * s[h] : C(-INFINITY);
      const C step_max = warp_max(score);
      const C m_new = m_run[h] > step_max ? m_run[h] : step_max;
      const C alpha = m_run[h] == -INFINITY ? C(0) : exp_(m_run[h] - m_new);
      const C e = lane < n ? exp_(score - m_new) : C(0);
      l_run[h] = alpha * l_run[h] + warp_sum(e);
      m_run[h] = m_new;
      prob[h] = e * value_scale;  // P[j][h] p_j, shuffled to the value columns below
#pragma unroll
      for (int c = 0; c < 2 * kPairs; ++c) acc[h][c] *= alpha;
    }

    // acc[h][c] += sum_j P[j][h] p_j v_j[c], the warp reading rows v_j together, kUnroll
    // rows' loads in flight before the first is used.
    constexpr int kUnroll = 16 / kPairs;
    const T* v_rows = v_base + t0 * v_stride;
    for (int j0 = 0; j0 < n; j0 += kUnroll) {
      Pack<T, 2> held[kUnroll][kPairs];
#pragma unroll
      for (int jj = 0; jj < kUnroll; ++jj) {
        const T* v_row = v_rows + (j0 + jj) * v_stride;
#pragma unroll
        for (int u = 0; u < kPairs; ++u) {
          const int64_t c = 2 * lane + 64 * u;
          if (j0 + jj >= n || c >= Dv) continue;
          if (a.paired_v) {
            held[jj][u] = *reinterpret_cast<const Pack<T, 2>*>(v_row + c);
          } else {
            held[jj][u].v[0] = v_row[c];
            held[jj][u].v[1] = c + 1 < Dv ? v_row[c + 1] : store<T>(C(0));
          }
        }
      }
#pragma unroll
      for (int jj = 0; jj < kUnroll; ++jj) {
        if (j0 + jj >= n) break;
        C pj[kGroup];
#pragma unroll
        for (int h = 0; h < kGroup; ++h) pj[h] = __shfl_sync(0xffffffffu, prob[h], j0 + jj);
#pragma unroll
        for (int u = 0; u < kPairs; ++u) {
          if (2 * lane + 64 * u >= Dv) break;
          const C v0 = C(load(held[jj][u].v[0])), v1 = C(load(held[jj][u].v[1]));
#pragma unroll
          for (int h = 0; h < kGroup; ++h) {
            acc[h][2 * u] += pj[h] * v0;
            acc[h][2 * u + 1] += pj[h] * v1;
          }
        }
      }
    }
  }

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

template <class T, int kGroup, int kPairs>
void launch_decode(DecodeArgs<T>& a, int64_t rows, int64_t most_visible, Device device) {
  const size_t bytes = DecodeLayout<T, kGroup>(a.key_dim, a.value_dim).bytes;
  const size_t limit = max_shared_per_block();
  HAM_CHECK(bytes <= limit, kOp, ": Dk = ", a.key_dim, ", Dv = ", a.value_dim, " in ",
            sizeof(T), "-byte elements need ", bytes, " bytes of shared memory per block, more "
            "than the device's ", limit);
  auto* kernel = &decode_kernel<T, kGroup, kPairs>;
  allow_dynamic_shared(kOp, kernel, bytes);
  // Splits: as many blocks as the GPU holds at once (one wave: a second, partial wave of
  // splits would double the time; on the H200 a fixed 4 blocks per SM, of which 3 fit, ran
  // 1.29 waves), each split a whole number of 128-key steps, at least kMinStepsPerSplit (a
  // split's fixed costs, q and its partial result, stay small).
  const int resident_per_sm = resident_blocks_per_sm(kOp, kernel, kDecodeThreads, bytes);
  const int64_t resident = std::max(1, resident_per_sm) * int64_t(multiprocessor_count());
  const int64_t base_blocks = rows * a.kv_heads * a.slices;
  const int64_t steps = std::max<int64_t>(1, ceil_div(most_visible, kStepKeys));
  const int64_t wanted = std::clamp<int64_t>(resident / base_blocks, 1, steps);
  const int64_t steps_per_split = std::max<int64_t>(kMinStepsPerSplit, ceil_div(steps, wanted));
  a.split_keys = int(steps_per_split * kStepKeys);
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
    a.paired_v = reinterpret_cast<uintptr_t>(a.v) % (2 * sizeof(T)) == 0 && a.value_dim % 2 == 0;
    HAM_CHECK(a.value_dim <= kMaxValueDim, kOp, ": Dv = ", a.value_dim, " of v_cache ",
              shape_str(v_cache.shape()), " exceeds ", kMaxValueDim);
    if (a.value_dim <= 128) launch_for_group<T, 2>(a, rows, most_visible, q.device());
    else if (a.value_dim <= 256) launch_for_group<T, 4>(a, rows, most_visible, q.device());
    else launch_for_group<T, kMaxPairs>(a, rows, most_visible, q.device());
  });
}

const bool registered = [] {
  routed_attention_decode_kernels().register_kernel(DeviceKind::CUDA, &decode);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

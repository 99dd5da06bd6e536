// CUDA kernel of core/ops/gated_delta_rule_decode.h (the CPU reference is
// core/cpu/gated_delta_rule_decode.cpp): the fused recurrent step of decoding, the state
// updated in place.
//
// Decoding reads and writes the whole state [K, V] of every head for a token or a few, so
// the kernel is a pass over the state: each element is loaded once, kept in a register for
// all n tokens of the call, and stored once. A block of 256 threads (8 warps) owns one
// (b, h) and a tile of 32 value columns; lane c holds column col0 + c, and warp w holds rows
// w, w + 8, ... of S (K <= 8 kRows). Per token t (k_t and q_t staged in shared memory):
//   S <- e^{g_t} S                                  (each thread its own rows)
//   p = S^T k_t          partial sums over a warp's rows, added over the 8 warps in order
//   fit partials         warp 0: <p, v>, ||p||^2, ||v||^2 over the tile's columns
//   S <- S + beta_t k_t (v_t - p)^T
//   o_t = S^T q_t        as p; warp 0 writes the tile's 32 columns
// The fit error's three sums are added over the V tiles in tile order by
// cuda/gated_delta_rule_fit.cuh. Deterministic; no atomics.
#include <cstdint>

#include "core/ops/gated_delta_rule_decode.h"
#include "cuda/gated_delta_rule_fit.cuh"
#include "cuda/launch.h"

namespace ham::cuda {

namespace {

constexpr const char* kOp = "gated_delta_rule_decode (cuda)";
constexpr int kColumns = 32;                    // value columns per block (one per lane)
constexpr int kRowGroups = 8;                   // warps: row a belongs to warp a % 8
constexpr int kDecodeThreads = kColumns * kRowGroups;
constexpr int64_t kMaxKeyDim = 512;             // kRows = 64 registers of state per thread

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }

template <class T>
struct DecodeArgs {
  const T *q, *k, *v, *g, *beta;
  const float* g_f32;            // f32 gates with bf16 q, k, v (then g is null)
  compute_t<T>* state;           // [B, H, K, V]
  T* o;
  compute_t<T>* fit_part;        // [B * n * H, tiles, 3]
  int64_t tokens, heads, key_dim, value_dim;
  int tiles;
};

template <class T, int kRows>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(DecodeArgs<T> a) {
  using C = compute_t<T>;
  HAM_STATIC_SHARED(C, s_k, [kRows * kRowGroups]);
  HAM_STATIC_SHARED(C, s_q, [kRows * kRowGroups]);
  HAM_STATIC_SHARED(C, s_p, [kRowGroups][kColumns]);
  HAM_STATIC_SHARED(C, s_o, [kRowGroups][kColumns]);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int tile = int(blockIdx.x);
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t K = a.key_dim, V = a.value_dim;
  const int64_t col = int64_t(tile) * kColumns + lane;
  const bool live = col < V;  // a ragged last tile's missing columns stay 0
  C* state = a.state + (b * a.heads + h) * K * V;

  C S[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = warp + int64_t(kRowGroups) * r;
    S[r] = live && row < K ? state[row * V + col] : C(0);
  }
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t row = (b * a.tokens + t) * a.heads + h;  // index into [B, n, H]
    for (int64_t i = threadIdx.x; i < kRows * kRowGroups; i += kDecodeThreads) {
      s_k[i] = i < K ? C(load(a.k[row * K + i])) : C(0);
      s_q[i] = i < K ? C(load(a.q[row * K + i])) : C(0);
    }
    const C decay = exp_(a.g_f32 ? C(a.g_f32[row]) : C(load(a.g[row])));
    const C beta = C(load(a.beta[row]));
    const C v = live ? C(load(a.v[row * V + col])) : C(0);
    __syncthreads();  // k_t, q_t staged; the previous token's s_p, s_o reads are done

    // S <- e^g S;  p = S^T k
    C part = C(0);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      S[r] *= decay;
      part += S[r] * s_k[warp + kRowGroups * r];
    }
    s_p[warp][lane] = part;
    __syncthreads();
    C p = C(0);
#pragma unroll
    for (int w = 0; w < kRowGroups; ++w) p += s_p[w][lane];

    if (warp == 0) {  // the fit error's sums over this tile's columns
      const C pv = warp_sum(p * v), pp = warp_sum(p * p), vv = warp_sum(v * v);
      if (lane == 0) {
        C* sums = a.fit_part + (row * a.tiles + tile) * 3;
        sums[0] = pv;
        sums[1] = pp;
        sums[2] = vv;
      }
    }
    // S <- S + beta k (v - p)^T;  o = S^T q
    const C write = beta * (v - p);
    part = C(0);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      S[r] += s_k[warp + kRowGroups * r] * write;
      part += S[r] * s_q[warp + kRowGroups * r];
    }
    s_o[warp][lane] = part;
    __syncthreads();
    if (warp == 0 && live) {
      C o = C(0);
#pragma unroll
      for (int w = 0; w < kRowGroups; ++w) o += s_o[w][lane];
      a.o[row * V + col] = store<T>(o);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = warp + int64_t(kRowGroups) * r;
    if (live && row < K) state[row * V + col] = S[r];
  }
}

void decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
            Tensor& state, Tensor& o, Tensor& fit_error) {
  const int64_t B = q.size(0), n = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  if (B * n * H == 0) return;
  if (K == 0 || V == 0) {  // p = 0 and o = 0: fit_error = 1 - 0 / (0 + eps) = 1
    o.zero_();
    fit_error.fill_(1.0);
    return;
  }
  HAM_CHECK(K <= kMaxKeyDim, kOp, ": K = ", K, " of q ", shape_str(q.shape()), " exceeds ",
            kMaxKeyDim);
  HAM_CHECK(B <= 65535 && H <= 65535, kOp, ": B = ", B, ", H = ", H,
            " exceed the grid (at most 65535 each)");
  use_device_of(q);
  dispatch_floating(kOp, q.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    DecodeArgs<T> a{};
    a.q = ptr<const T>(q);
    a.k = ptr<const T>(k);
    a.v = ptr<const T>(v);
    a.beta = ptr<const T>(beta);
    if (g.dtype() == q.dtype()) a.g = ptr<const T>(g);
    else a.g_f32 = ptr<const float>(g);  // mixed precision: f32 gates with bf16 inputs
    a.state = ptr<C>(state);
    a.o = ptr<T>(o);
    a.tokens = n;
    a.heads = H;
    a.key_dim = K;
    a.value_dim = V;
    a.tiles = int((V + kColumns - 1) / kColumns);
    const int64_t rows = B * n * H;
    Tensor fit_part = Tensor::empty(Shape{std::max<int64_t>(1, rows * a.tiles * 3)},
                                    compute_dtype<T>(), q.device());
    a.fit_part = ptr<C>(fit_part);
    auto launch = [&]<int kRows>() {
      HAM_LAUNCH(dim3(unsigned(a.tiles), unsigned(H), unsigned(B)), kDecodeThreads, 0,
                 launch_stream(), decode_kernel<T, kRows>)(a);
      HAM_CUDA_CHECK_LAUNCH();
    };
    // Registers of state per thread: the smallest power of two covering K / 8.
    if (K <= 8) launch.template operator()<1>();
    else if (K <= 16) launch.template operator()<2>();
    else if (K <= 32) launch.template operator()<4>();
    else if (K <= 64) launch.template operator()<8>();
    else if (K <= 128) launch.template operator()<16>();
    else if (K <= 256) launch.template operator()<32>();
    else launch.template operator()<64>();
    launch_fit_error<T>(fit_part, rows, a.tiles, fit_error);
  });
}

const bool registered = [] {
  gated_delta_rule_decode_kernels().register_kernel(DeviceKind::CUDA, &decode);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

// CUDA kernels of core/ops/cross_entropy.h: softmax cross-entropy over rows of logits
// [rows, V] with integer targets (rows whose target is ignore_index take no part):
//   lse_r = m + log(sum_j e^(z_rj - m)),  m = max_j z_rj
//   loss  = sum over kept rows of (lse_r - z_r[target_r])
//   dz_rj = (e^(z_rj - lse_r) - [j == target_r]) * dloss * scale      (0 on ignored rows)
// One block per row (a warp when V <= 1024); row sums in f32, row losses in f64 and
// their total by the deterministic reduction of cuda/reduce_utils.cuh. The forward
// returns the kept-row count, so it waits for the device once; the same readback
// carries the first out-of-range target, reported with the CPU kernel's message.
// Rows move as 16-byte packs where V and the pointers allow, and the forward reads a row
// once: each thread keeps a running max m and sum s = sum e^(z - m) of its values, and
// the group combines them as m* = max m, s* = sum s e^(m - m*). (The fused linear
// cross-entropy measured 0.93 of torch on the H200 with two passes of 2-byte loads, max
// then sum.)
//
// lse, the loss and dloss are f32 for f32 and bf16 logits and f64 for f64 logits
// (S = compute_t<T>; cross_entropy_stats_dtype in core/ops/cross_entropy.h).
//
// Fused with the output projection, these kernels serve ops::linear_cross_entropy
// (core/ops/linear_cross_entropy.h), which walks the rows in chunks: one GEMM makes a
// chunk's logits in a reused buffer, and cross_entropy_with_grad_rows gives their loss and
// turns them in place into dz for two more GEMMs (dh, dW), in one kernel: a block keeps
// the first 100 KB of its row in shared memory between the lse pass and the gradient
// pass, so a bf16 row of up to 51200 logits is read from memory once, not twice as by
// the two kernels in turn. Its kept-row count and first bad row gather on the device, so
// the chunks never wait for it (the forward kernel alone reads its count back).
#include <cstdint>

#include "core/ops/cross_entropy.h"
#include "cuda/launch.h"
#include "cuda/reduce_utils.cuh"

namespace ham::cuda {

namespace {

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return ::log(x); }

template <bool kWarp>
__device__ __forceinline__ int64_t row_index() {
  return kWarp ? int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32 : int64_t(blockIdx.x);
}

// lse of one row (every thread of the group gets it), in one pass over it (N values a
// load; N divides V). A thread keeps kBatch of its loads in flight before using any, and
// takes its packs in increasing order, so the sums do not depend on kBatch. Where `cache`
// is given, packs p < cached_packs are also stored to cache[p], each by the thread that
// reads it again in write_row_grad.
template <bool kWarp, int N, class T>
__device__ compute_t<T> row_logsumexp(const T* z, int64_t vocab, Pack<T, N>* cache = nullptr,
                                      int64_t cached_packs = 0) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  constexpr int kBatch = 4;
  const C neg_inf = -INFINITY;
  C m = neg_inf, s = C(0);  // this thread's running max and sum of e^(z - m)
  const P* packs = reinterpret_cast<const P*>(z);
  const int64_t count = vocab / N, stride = Group::size();
  for (int64_t p0 = Group::lane(); p0 < count; p0 += kBatch * stride) {
    P in[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (p0 + u * stride < count) in[u] = packs[p0 + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t p = p0 + u * stride;
      if (p >= count) break;
      if (p < cached_packs) cache[p] = in[u];
      C v[N];
      C pack_max = neg_inf;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        v[e] = load(in[u].v[e]);
        pack_max = v[e] > pack_max ? v[e] : pack_max;  // NaN is skipped here, kept in s
      }
      if (pack_max > m) {
        s *= exp_(m - pack_max);  // 0 while m = -inf
        m = pack_max;
      }
      if (m == neg_inf) continue;  // every value so far is -inf: s stays 0
#pragma unroll
      for (int e = 0; e < N; ++e) s += exp_(v[e] - m);
    }
  }
  const C row_max = Group::max(m, neg_inf);
  const C sum = Group::sum(m == neg_inf ? C(0) : s * exp_(m - row_max));
  return row_max + log_(sum);
}

// One row's gradient d[p] <- (e^(z - lse) - [index == t]) g over its packs, z's pack p
// coming from read(p). kBatch of the thread's packs are loaded before any is stored: d
// may be z (so a load may not move above an earlier store, and one pack a time would leave
// one load in flight), and each pack is read before it is written. Returns z[t] where this
// thread read it, else NaN. (ptxas: 40 registers for bf16, 6 blocks per SM, with 2; 4
// took 56, and bounded to 40 it spilled.)
template <bool kWarp, int N, class T, class Read>
__device__ compute_t<T> write_row_grad(Read read, Pack<T, N>* d, int64_t vocab, int64_t t,
                                       compute_t<T> row_lse, compute_t<T> g) {
  using C = compute_t<T>;
  using Group = RowGroup<kWarp>;
  using P = Pack<T, N>;
  constexpr int kBatch = 2;
  const int64_t count = vocab / N, stride = Group::size();
  C target_logit = C(NAN);
  for (int64_t p0 = Group::lane(); p0 < count; p0 += kBatch * stride) {
    P in[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (p0 + u * stride < count) in[u] = read(p0 + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t p = p0 + u * stride;
      if (p >= count) break;
      P out;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const C z = load(in[u].v[e]);
        C value = exp_(z - row_lse) * g;
        if (p * N + e == t) {
          value -= g;
          target_logit = z;
        }
        out.v[e] = store<T>(value);
      }
      d[p] = out;
    }
  }
  return target_logit;
}

// Zeros over a row of V values, N a store.
template <bool kWarp, int N, class T>
__device__ void zero_row(T* row, int64_t vocab) {
  using P = Pack<T, N>;
  P zeros;
#pragma unroll
  for (int e = 0; e < N; ++e) zeros.v[e] = store<T>(compute_t<T>(0));
  P* d = reinterpret_cast<P*>(row);
  for (int64_t p = RowGroup<kWarp>::lane(); p < vocab / N; p += RowGroup<kWarp>::size()) {
    d[p] = zeros;
  }
}

// Device-side bookkeeping of the forward: kept rows and the first bad row.
struct CrossEntropyStats {
  unsigned long long kept;
  unsigned long long first_bad_row;  // rows when every target is valid
};

template <bool kWarp, int N, class T, class I>
__global__ void cross_entropy_rows(const T* logits, const I* targets, int64_t rows,
                                   int64_t vocab, int64_t ignore_index, compute_t<T>* lse,
                                   double* row_loss, CrossEntropyStats* stats) {
  using Group = RowGroup<kWarp>;
  const int64_t r = row_index<kWarp>();
  if (kWarp && r >= rows) return;
  const int64_t t = int64_t(targets[r]);
  const bool ignored = t == ignore_index;
  const bool bad = !ignored && (t < 0 || t >= vocab);
  if (ignored || bad) {  // uniform over the group
    if (Group::lane() == 0) {
      lse[r] = compute_t<T>(0);
      row_loss[r] = 0.0;
      if (bad) atomicMin(&stats->first_bad_row, (unsigned long long)r);
    }
    return;
  }
  const T* z = logits + r * vocab;
  const auto row_lse = row_logsumexp<kWarp, N>(z, vocab);
  if (Group::lane() != 0) return;
  lse[r] = row_lse;
  row_loss[r] = double(row_lse) - double(load(z[t]));
  atomicAdd(&stats->kept, 1ull);
}

template <bool kWarp, int N, class T, class I>
__global__ void cross_entropy_backward_rows(const T* logits, const I* targets,
                                            const compute_t<T>* lse, int64_t rows, int64_t vocab,
                                            int64_t ignore_index, const compute_t<T>* dloss,
                                            double scale, T* dlogits) {
  using C = compute_t<T>;
  using P = Pack<T, N>;
  const int64_t r = row_index<kWarp>();
  if (kWarp && r >= rows) return;
  const int64_t t = int64_t(targets[r]);
  if (t == ignore_index) {
    zero_row<kWarp, N>(dlogits + r * vocab, vocab);
    return;
  }
  const P* z = reinterpret_cast<const P*>(logits + r * vocab);
  write_row_grad<kWarp, N, T>([&](int64_t p) { return z[p]; },
                              reinterpret_cast<P*>(dlogits + r * vocab), vocab, t, lse[r],
                              C(double(dloss[0]) * scale));
}

// The forward and the backward of a row in one kernel, the gradient written over the
// logits: one pass for the lse, a second for the gradient, which also meets z[t] for the
// row's loss before overwriting it. The row's first cached_packs packs stay in shared
// memory between the passes (block rows only: warp rows ignore cached_packs; the rest is
// read twice), so most rows of a vocabulary up to 50K are read from memory once.
template <bool kWarp, int N, class T, class I>
__global__ void cross_entropy_with_grad_rows(T* logits, const I* targets, int64_t rows,
                                             int64_t vocab, int64_t ignore_index,
                                             compute_t<T> scale, int64_t cached_packs,
                                             int64_t row_offset, double* row_loss,
                                             CrossEntropyStats* stats) {
  using C = compute_t<T>;
  using P = Pack<T, N>;
  HAM_DYNAMIC_SHARED(unsigned char, cache_bytes);
  P* cache = reinterpret_cast<P*>(cache_bytes);
  const int64_t r = row_index<kWarp>();
  if (kWarp && r >= rows) return;
  const int64_t t = int64_t(targets[r]);
  T* z = logits + r * vocab;
  const bool ignored = t == ignore_index;
  const bool bad = !ignored && (t < 0 || t >= vocab);
  if (ignored || bad) {  // uniform over the group
    zero_row<kWarp, N>(z, vocab);
    if (RowGroup<kWarp>::lane() == 0) {
      row_loss[r] = 0.0;
      if (bad) atomicMin(&stats->first_bad_row, (unsigned long long)(row_offset + r));
    }
    return;
  }
  const int64_t cached = kWarp ? 0 : cached_packs;
  const C row_lse = row_logsumexp<kWarp, N>(z, vocab, cache, cached);
  const P* packs = reinterpret_cast<const P*>(z);
  const C target_logit = write_row_grad<kWarp, N, T>(
      [&](int64_t p) { return p < cached ? cache[p] : packs[p]; },
      reinterpret_cast<P*>(z), vocab, t, row_lse, scale);
  if ((t / N) % RowGroup<kWarp>::size() == RowGroup<kWarp>::lane()) {  // z[t]'s reader
    row_loss[r] = double(row_lse) - double(target_logit);
    atomicAdd(&stats->kept, 1ull);
  }
}

struct ReadRowLoss {
  const double* row_loss;
  __device__ double operator()(int64_t, int64_t l, int64_t) const { return row_loss[l]; }
};

int64_t cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                      Tensor& lse, Tensor& loss_sum) {
  const int64_t rows = targets.numel(), vocab = logits.size(-1);
  use_device_of(logits);
  const Device device = logits.device();
  Tensor row_loss = Tensor::empty({rows}, DType::F64, device);
  Tensor stats_buffer = Tensor::empty({2}, DType::I64, device);
  auto* stats = ptr<CrossEntropyStats>(stats_buffer);
  CrossEntropyStats host_stats{0, (unsigned long long)rows};
  HAM_CUDA_CHECK(cudaMemcpyAsync(stats, &host_stats, sizeof host_stats, cudaMemcpyHostToDevice,
                                 launch_stream()));
  dispatch_index("cross_entropy", targets.dtype(), [&]<class I>() {
    dispatch_floating("cross_entropy", logits.dtype(), [&]<class T>() {
      auto run = [&]<int N>() {
        launch_rows(rows, vocab, &cross_entropy_rows<true, N, T, I>,
                    &cross_entropy_rows<false, N, T, I>, ptr<const T>(logits),
                    ptr<const I>(targets), rows, vocab, ignore_index, ptr<compute_t<T>>(lse),
                    ptr<double>(row_loss), stats);
      };
      if (rows_packable<T>(vocab, {logits.raw_data()})) run.template operator()<kPackWidth<T>>();
      else run.template operator()<1>();
      reduce_middle<double, ReduceForms::Rows>(
          device, 1, rows, 1, ReadRowLoss{ptr<const double>(row_loss)},
          StoreScaled<compute_t<T>, double>{ptr<compute_t<T>>(loss_sum), 1.0});
    });
  });
  HAM_CUDA_CHECK(cudaMemcpyAsync(&host_stats, stats, sizeof host_stats, cudaMemcpyDeviceToHost,
                                 launch_stream()));
  HAM_CUDA_CHECK(cudaStreamSynchronize(launch_stream()));
  if (host_stats.first_bad_row < (unsigned long long)rows) {
    const int64_t row = int64_t(host_stats.first_bad_row);
    const int64_t t = targets.reshape({rows}).slice(row, row + 1).to_vector<int64_t>()[0];
    HAM_FAIL("cross_entropy: target ", t, " at row ", row, " is out of range for V = ", vocab,
             " (ignore_index ", ignore_index, ")");
  }
  return int64_t(host_stats.kept);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            int64_t ignore_index, const Tensor& dloss, double scale,
                            Tensor& dlogits) {
  const int64_t rows = targets.numel(), vocab = logits.size(-1);
  use_device_of(logits);
  dispatch_index("cross_entropy backward", targets.dtype(), [&]<class I>() {
    dispatch_floating("cross_entropy backward", logits.dtype(), [&]<class T>() {
      auto run = [&]<int N>() {
        launch_rows(rows, vocab, &cross_entropy_backward_rows<true, N, T, I>,
                    &cross_entropy_backward_rows<false, N, T, I>, ptr<const T>(logits),
                    ptr<const I>(targets), ptr<const compute_t<T>>(lse), rows, vocab,
                    ignore_index, ptr<const compute_t<T>>(dloss), scale, ptr<T>(dlogits));
      };
      if (rows_packable<T>(vocab, {logits.raw_data(), dlogits.raw_data()})) {
        run.template operator()<kPackWidth<T>>();
      } else {
        run.template operator()<1>();
      }
    });
  });
}

// Bytes of a block row kept in shared memory between the fused kernel's two passes: a
// whole bf16 row of a vocabulary up to 51200, two blocks per SM.
constexpr int64_t kRowCacheBytes = 100 * 1024;

void cross_entropy_with_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             double scale, int64_t row_offset, Tensor& loss_sum, Tensor& tally) {
  const int64_t rows = targets.numel(), vocab = logits.size(-1);
  use_device_of(logits);
  const Device device = logits.device();
  HAM_CHECK(tally.dtype() == DType::I64 && tally.numel() == 2 && tally.device() == device,
            "cross_entropy_with_grad: tally must be i64[2] on ", device.str(), ", got ",
            tally.str());
  if (rows == 0) {
    loss_sum.zero_();
    return;
  }
  Tensor row_loss = Tensor::empty({rows}, DType::F64, device);
  auto* stats = ptr<CrossEntropyStats>(tally);
  dispatch_index("cross_entropy_with_grad", targets.dtype(), [&]<class I>() {
    dispatch_floating("cross_entropy_with_grad", logits.dtype(), [&]<class T>() {
      using C = compute_t<T>;
      auto run = [&]<int N>() {
        const int64_t cached_packs =  // block rows only (the warp kernel keeps no cache)
            std::min<int64_t>(vocab / N, kRowCacheBytes / int64_t(sizeof(Pack<T, N>)));
        launch_rows_shared("cross_entropy_with_grad", rows, vocab,
                           size_t(cached_packs) * sizeof(Pack<T, N>),
                           &cross_entropy_with_grad_rows<true, N, T, I>,
                           &cross_entropy_with_grad_rows<false, N, T, I>, ptr<T>(logits),
                           ptr<const I>(targets), rows, vocab, ignore_index, C(scale),
                           cached_packs, row_offset, ptr<double>(row_loss), stats);
      };
      if (rows_packable<T>(vocab, {logits.raw_data()})) run.template operator()<kPackWidth<T>>();
      else run.template operator()<1>();
      reduce_middle<double, ReduceForms::Rows>(
          device, 1, rows, 1, ReadRowLoss{ptr<const double>(row_loss)},
          StoreScaled<compute_t<T>, double>{ptr<compute_t<T>>(loss_sum), 1.0});
    });
  });
}

const bool registered = [] {
  cross_entropy_kernels().register_kernel(DeviceKind::CUDA, &cross_entropy);
  cross_entropy_backward_kernels().register_kernel(DeviceKind::CUDA, &cross_entropy_backward);
  cross_entropy_with_grad_kernels().register_kernel(DeviceKind::CUDA, &cross_entropy_with_grad);
  return true;
}();

}  // namespace

}  // namespace ham::cuda

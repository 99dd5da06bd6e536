// CUDA kernels of core/ops/conv1d.h, the short causal depthwise convolution. x [B, T, C],
// weight [C, W], bias [C] optional, doc_ids [B, T] optional:
//   y[b, t, c] = bias[c] + sum_{j<W} weight[c, j] x[b, t - (W-1) + j, c]
// with taps before the start of t's document dropped (a document starts at t = 0 and
// wherever doc_ids changes). Backward, over the same kept taps (s = t - (W-1) + j):
//   dx[b, s, c]   = sum_j weight[c, j] dy[b, s + (W-1) - j, c]
//   dweight[c, j] = sum_{b,t} dy[b, t, c] x[b, t - (W-1) + j, c]
//   dbias[c]      = sum_{b,t} dy[b, t, c]
//
// Widths up to 8 (the models use 4) take the span kernels: a thread walks one channel down
// a span of rows of one sequence, a warp 32 neighbouring channels, and keeps by lag
// d = W-1-j the taps, the last W inputs and (backward) the W rows of dx still open in
// registers. So x and dy are read once (plus W-1 rows at a span's edges) and y or dx written
// once, where the per-element kernels read W inputs and W-1 ids an output. A row's kept taps
// are its lags d <= past, past = the earlier steps of its document capped at W-1, stepped
// from one id a row. The backward is one pass: dx, and each thread's dweight and dbias sums
// over its span in f64, added over a block's 8 spans in fixed order, then over the blocks in
// order (reduce_detail::add_splits), so the result depends on the shape, never on the GPU.
// Wider convolutions (and all, with set_conv1d_spans(false)) take the per-element kernels
// (the *_any_width ones), with dweight and dbias from the deterministic column sums of
// cuda/reduce_utils.cuh.
// With SiLU (the models' short convs) the forward writes z = silu(y) and the backward takes
// dz: the span kernels recompute each row's y from the taps and window they hold anyway
// (the backward reads x W-1 rows past its span for it) and turn dz into dy in registers;
// the per-element path recomputes y into a scratch tensor and forms dy there first.
#include "cuda/conv1d.h"

#include <atomic>
#include <cstdint>

#include "core/ops/conv1d.h"
#include "cuda/activation.cuh"
#include "cuda/launch.h"
#include "cuda/reduce_utils.cuh"

namespace ham::cuda {

namespace {

constexpr int kChannelLanes = 32;  // a span block's channels (threadIdx.x): one warp's row
constexpr int kBlockSpans = 8;     // a span block's spans (threadIdx.y)
constexpr int kRowsALoad = 4;      // rows whose loads a thread issues before using any
constexpr int kMaxSpanWidth = 8;   // the widest convolution the span kernels take
constexpr int kMaxSpanRows = 4096;
// Blocks an SM holds at least, by register width: 3 (80 registers a thread) at widths up to 4.
template <int kW>
constexpr int kSpanBlocksAnSm = kW <= 4 ? 3 : 2;

std::atomic<int> g_span_rows{0};     // set_conv1d_span_rows
std::atomic<bool> g_spans_on{true};  // set_conv1d_spans

// Earlier steps of row (b, t)'s document, capped at `cap`. ids may be null.
template <class I>
__device__ __forceinline__ int64_t steps_back(const I* ids, int64_t row, int64_t t, int64_t cap) {
  int64_t past = 0;
  while (past < cap && t - past > 0 && (!ids || ids[row - past] == ids[row - past - 1])) ++past;
  return past;
}

// Steps from (b, t) to the end of its document, t included, capped at `cap`.
template <class I>
__device__ __forceinline__ int64_t steps_ahead(const I* ids, int64_t row, int64_t t, int64_t seq,
                                               int64_t cap) {
  int64_t ahead = 1;
  while (ahead < cap && t + ahead < seq && (!ids || ids[row + ahead] == ids[row + ahead - 1])) {
    ++ahead;
  }
  return ahead;
}

// ---------------------------------------------------------------------------------------
// The span kernels (W <= kMaxSpanWidth)

// How the rows are cut into spans: `length` rows each, `per_seq` spans a sequence (the last
// may be shorter), `count` in all.
struct Spans {
  int64_t seq, length, per_seq, count;
};

Spans spans_for(int64_t batch, int64_t seq, int64_t channels) {
  int64_t length = g_span_rows.load();
  if (length == 0) {  // the longest power of two from 16 to 256 that leaves 2^18 threads
    length = 16;
    while (length < 256 && batch * seq * channels / (2 * length) >= (int64_t(1) << 18)) {
      length *= 2;
    }
  }
  const int64_t per_seq = (seq + length - 1) / length;
  return {seq, length, per_seq, batch * per_seq};
}

// This thread's channel and span: rows t0 .. t1-1 of the sequence whose row t = 0 is `first`.
struct SpanOfThread {
  int64_t c, first, t0, t1;
  bool active;
  __device__ SpanOfThread(const Spans& s, int64_t channels) {
    const int64_t span = int64_t(blockIdx.x) * kBlockSpans + threadIdx.y;
    c = int64_t(blockIdx.y) * kChannelLanes + threadIdx.x;
    active = span < s.count && c < channels;
    const int64_t b = span / s.per_seq;
    first = b * s.seq;
    t0 = (span % s.per_seq) * s.length;
    t1 = min(t0 + s.length, s.seq);
  }
};

// past = earlier steps of the current row's document, capped at W-1; step() moves to the
// next row given its id (ids null: one document a sequence).
template <class I>
struct DocumentPast {
  const I* ids;
  int cap, past;
  I last;  // the current row's id
  __device__ DocumentPast(const I* ids_, int width, int64_t row, int64_t t)
      : ids(ids_), cap(width - 1), past(int(steps_back(ids_, row, t, width - 1))),
        last(ids_ ? ids_[row] : I(0)) {}
  __device__ void step(I id) {
    past = (ids && id != last) ? 0 : min(past + 1, cap);
    last = id;
  }
};

// v[d] = v[d-1] down the lags, v[0] = newest.
template <int kW, class C>
__device__ __forceinline__ void shift_in(C (&v)[kW], C newest) {
#pragma unroll
  for (int d = kW - 1; d > 0; --d) v[d] = v[d - 1];
  v[0] = newest;
}

// tap[d] = weight[c, W-1-d] (0 past W); window[d] = x at t0-1-d inside the sequence (0
// elsewhere), so that after the first row's shift_in window[d] is x at t0-d.
template <int kW, class T, class C>
__device__ __forceinline__ void load_taps_and_window(const T* x, const T* weight, int width,
                                                     int64_t channels, const SpanOfThread& at,
                                                     C (&tap)[kW], C (&window)[kW]) {
#pragma unroll
  for (int d = 0; d < kW; ++d) {
    tap[d] = d < width ? C(load(weight[at.c * width + width - 1 - d])) : C(0);
    const int64_t t = at.t0 - 1 - d;
    window[d] = d + 1 < width && t >= 0 ? C(load(x[(at.first + t) * channels + at.c])) : C(0);
  }
}

// y of the current row: bias + its kept taps, j = W-1-d ascending (the forward's and the
// backward's recomputation's order, so that both get the same y).
template <int kW, class C>
__device__ __forceinline__ C row_output(const C (&tap)[kW], const C (&window)[kW], int past,
                                        C bias) {
  C acc = bias;
#pragma unroll
  for (int d = kW - 1; d >= 0; --d) {
    if (d <= past) acc += tap[d] * window[d];
  }
  return acc;
}

template <int kW, class T, class I>
__global__ void __launch_bounds__(kChannelLanes* kBlockSpans, kSpanBlocksAnSm<kW>)
    conv_forward_spans(const T* x, const T* weight, const T* bias, const I* ids,
                       int64_t channels, int width, bool with_silu, Spans spans, T* y) {
  using C = compute_t<T>;
  const SpanOfThread at(spans, channels);
  if (!at.active) return;
  C tap[kW], window[kW];
  load_taps_and_window(x, weight, width, channels, at, tap, window);
  const C bias_c = bias ? C(load(bias[at.c])) : C(0);
  DocumentPast<I> doc(ids, width, at.first + at.t0, at.t0);
  for (int64_t t = at.t0; t < at.t1; t += kRowsALoad) {
    C xs[kRowsALoad];
    I id[kRowsALoad];
#pragma unroll
    for (int r = 0; r < kRowsALoad; ++r) {
      const bool in = t + r < at.t1;
      xs[r] = in ? C(load(x[(at.first + t + r) * channels + at.c])) : C(0);
      id[r] = ids && in ? ids[at.first + t + r] : I(0);
    }
#pragma unroll
    for (int r = 0; r < kRowsALoad; ++r) {
      if (t + r >= at.t1) break;
      if (t + r > at.t0) doc.step(id[r]);
      shift_in(window, xs[r]);
      const C out = row_output(tap, window, doc.past, bias_c);
      y[(at.first + t + r) * channels + at.c] = store<T>(with_silu ? silu(out) : out);
    }
  }
}

// dx of rows t0 .. t1-1, and into weight_partial[blockIdx.x][c][j] and
// bias_partial[blockIdx.x][c] (where not null) the block's sums of the dweight and dbias
// terms of those rows. Row t's dy reaches dx of rows t-W+1 .. t, so a thread reads dy W-1
// rows past its span, and dx of row t-(kW-1) is whole once row t is taken (kept lags are
// below W <= kW): pending[d] holds row t-d. with_silu: `dy` holds dz, and each row's dy is
// dz silu'(y) with y recomputed (so x is read as far as dy).
template <int kW, class T, class I>
__global__ void __launch_bounds__(kChannelLanes* kBlockSpans, kSpanBlocksAnSm<kW>)
    conv_backward_spans(const T* dy, const T* x, const T* weight, const T* bias, const I* ids,
                        int64_t channels, int width, bool with_silu, Spans spans, T* dx,
                        double* weight_partial, double* bias_partial) {
  using C = compute_t<T>;
  using reduce_detail::Acc;
  HAM_STATIC_SHARED(Acc, sums, [kBlockSpans][kW + 1][kChannelLanes]);
  const SpanOfThread at(spans, channels);
  Acc weight_sum[kW] = {}, bias_sum = 0;  // by lag
  if (at.active) {
    C tap[kW], window[kW], pending[kW] = {};
    load_taps_and_window(x, weight, width, channels, at, tap, window);
    const C bias_c = bias ? C(load(bias[at.c])) : C(0);
    DocumentPast<I> doc(ids, width, at.first + at.t0, at.t0);
    const int64_t reads_end = min(spans.seq, at.t1 + width - 1), walk_end = at.t1 + kW - 1;
    const int64_t x_end = with_silu ? reads_end : at.t1;
    for (int64_t t = at.t0; t < walk_end; t += kRowsALoad) {
      C grad[kRowsALoad], xs[kRowsALoad];
      I id[kRowsALoad];
#pragma unroll
      for (int r = 0; r < kRowsALoad; ++r) {
        const int64_t row = at.first + t + r;
        grad[r] = t + r < reads_end ? C(load(dy[row * channels + at.c])) : C(0);
        xs[r] = t + r < x_end ? C(load(x[row * channels + at.c])) : C(0);
        id[r] = ids && t + r < reads_end ? ids[row] : I(0);
      }
#pragma unroll
      for (int r = 0; r < kRowsALoad; ++r) {
        const int64_t tr = t + r;
        if (tr >= walk_end) break;
        shift_in(pending, C(0));
        shift_in(window, xs[r]);
        if (tr < reads_end) {
          if (tr > at.t0) doc.step(id[r]);
          if (with_silu) grad[r] = silu_grad(grad[r], row_output(tap, window, doc.past, bias_c));
          const bool own = tr < at.t1;  // row tr's dweight and dbias terms are this span's
#pragma unroll
          for (int d = 0; d < kW; ++d) {
            if (d > doc.past) continue;
            pending[d] += tap[d] * grad[r];
            if (own) weight_sum[d] += Acc(grad[r] * window[d]);
          }
          if (own) bias_sum += Acc(grad[r]);
        }
        const int64_t done = tr - (kW - 1);
        if (dx && done >= at.t0) {
          dx[(at.first + done) * channels + at.c] = store<T>(pending[kW - 1]);
        }
      }
    }
  }
  if (!weight_partial && !bias_partial) return;  // the same in the whole block
#pragma unroll
  for (int d = 0; d < kW; ++d) sums[threadIdx.y][d][threadIdx.x] = weight_sum[d];
  sums[threadIdx.y][kW][threadIdx.x] = bias_sum;
  __syncthreads();
  if (threadIdx.y != 0 || at.c >= channels) return;
  const int64_t group = blockIdx.x;
#pragma unroll
  for (int k = 0; k <= kW; ++k) {
    if (k < kW && k >= width) continue;
    Acc total = 0;
    for (int s = 0; s < kBlockSpans; ++s) total += sums[s][k][threadIdx.x];  // fixed order
    if (k == kW) {
      if (bias_partial) bias_partial[group * channels + at.c] = total;
    } else if (weight_partial) {
      weight_partial[(group * channels + at.c) * width + width - 1 - k] = total;
    }
  }
}

dim3 span_grid(const Spans& s, int64_t channels) {
  const int64_t groups = (s.count + kBlockSpans - 1) / kBlockSpans;
  const int64_t channel_blocks = (channels + kChannelLanes - 1) / kChannelLanes;
  HAM_CHECK(groups < (int64_t(1) << 31) && channel_blocks <= 65535, "causal_conv1d: ", s.count,
            " spans of ", s.length, " rows x ", channels, " channels exceed the grid");
  return dim3(unsigned(groups), unsigned(channel_blocks));
}

// Whether `width` takes the span kernels.
bool takes_spans(int64_t width) { return g_spans_on.load() && width <= kMaxSpanWidth; }

// Calls fn.template operator()<kW>() with the span kernels' register width for `width`.
template <class Fn>
void dispatch_span_width(int64_t width, Fn&& fn) {
  if (width <= 4) fn.template operator()<4>();
  else fn.template operator()<kMaxSpanWidth>();
}

// ---------------------------------------------------------------------------------------
// The per-element kernels (any width)

template <class T, class I>
__global__ void conv_forward_any_width(const T* x, const T* weight, const T* bias, const I* ids,
                                       int64_t seq, int64_t channels, int64_t width,
                                       bool with_silu, T* y, int64_t n) {
  using C = compute_t<T>;
  HAM_GRID_STRIDE_LOOP(k, n) {
    const int64_t row = k / channels, c = k % channels, t = row % seq;
    const int64_t past = steps_back(ids, row, t, width - 1);
    C acc = bias ? C(load(bias[c])) : C(0);
    for (int64_t j = width - 1 - past; j < width; ++j) {
      acc += C(load(weight[c * width + j])) * C(load(x[(row - (width - 1) + j) * channels + c]));
    }
    y[k] = store<T>(with_silu ? silu(acc) : acc);
  }
}

// dy[k] = dz[k] silu'(y[k]), in place of y (the per-element path's pre-activation scratch).
template <class T>
__global__ void silu_grad_in_place(const T* dz, T* y_then_dy, int64_t n) {
  using C = compute_t<T>;
  HAM_GRID_STRIDE_LOOP(k, n) {
    y_then_dy[k] = store<T>(silu_grad(C(load(dz[k])), C(load(y_then_dy[k]))));
  }
}

template <class T, class I>
__global__ void conv_backward_input_any_width(const T* dy, const T* weight, const I* ids,
                                              int64_t seq, int64_t channels, int64_t width, T* dx,
                                              int64_t n) {
  using C = compute_t<T>;
  HAM_GRID_STRIDE_LOOP(k, n) {
    const int64_t row = k / channels, c = k % channels, t = row % seq;
    const int64_t ahead = steps_ahead(ids, row, t, seq, width);
    C acc = C(0);
    for (int64_t j = width - ahead; j < width; ++j) {
      acc += C(load(weight[c * width + j])) * C(load(dy[(row + (width - 1) - j) * channels + c]));
    }
    dx[k] = store<T>(acc);
  }
}

// value(0, row, c * W + j) = dy[row, c] x[row - (W-1) + j, c] for kept taps, else 0.
template <class T, class I>
struct WeightGradTerm {
  const T *dy, *x;
  const I* ids;
  int64_t seq, channels, width;
  __device__ compute_t<T> operator()(int64_t, int64_t row, int64_t col) const {
    using C = compute_t<T>;
    const int64_t c = col / width, j = col % width, t = row % seq;
    if (j < width - 1 - steps_back(ids, row, t, width - 1)) return C(0);
    return C(load(dy[row * channels + c])) * C(load(x[(row - (width - 1) + j) * channels + c]));
  }
};

template <class T>
struct BiasGradTerm {
  const T* dy;
  int64_t channels;
  __device__ compute_t<T> operator()(int64_t, int64_t row, int64_t c) const {
    return load(dy[row * channels + c]);
  }
};

// ---------------------------------------------------------------------------------------
// The kernel table's entries

// Calls fn(ids pointer) with the doc_ids' index type, or a null int64 pointer without them.
template <class Fn>
void with_doc_ids(const char* op, const Tensor& doc_ids, Fn&& fn) {
  if (!doc_ids.defined()) {
    fn(static_cast<const int64_t*>(nullptr));
    return;
  }
  dispatch_index(op, doc_ids.dtype(), [&]<class I>() { fn(ptr<const I>(doc_ids)); });
}

void causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& doc_ids, Conv1dActivation activation, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t seq = x.size(1), channels = x.size(2), width = weight.size(1);
  const bool with_silu = activation == Conv1dActivation::SiLU;
  use_device_of(x);
  dispatch_floating("causal_conv1d", x.dtype(), [&]<class T>() {
    with_doc_ids("causal_conv1d", doc_ids, [&]<class I>(const I* ids) {
      if (takes_spans(width)) {
        const Spans spans = spans_for(x.size(0), seq, channels);
        dispatch_span_width(width, [&]<int kW>() {
          HAM_LAUNCH(span_grid(spans, channels), dim3(kChannelLanes, kBlockSpans), 0,
                     launch_stream(), conv_forward_spans<kW, T, I>)(
              ptr<const T>(x), ptr<const T>(weight), ptr_or_null<const T>(bias), ids, channels,
              int(width), with_silu, spans, ptr<T>(y));
        });
      } else {
        HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), conv_forward_any_width)(
            ptr<const T>(x), ptr<const T>(weight), ptr_or_null<const T>(bias), ids, seq,
            channels, width, with_silu, ptr<T>(y), n);
      }
      HAM_CUDA_CHECK_LAUNCH();
    });
  });
}

// The span kernel, then each wanted parameter gradient's sum over the blocks' partials.
template <class T, class I>
void backward_by_spans(const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, const I* ids, bool with_silu, Tensor& dx,
                       Tensor& dweight, Tensor& dbias) {
  using C = compute_t<T>;
  const int64_t channels = x.size(2), width = weight.size(1);
  const Spans spans = spans_for(x.size(0), x.size(1), channels);
  const dim3 grid = span_grid(spans, channels);
  const int64_t groups = grid.x;
  Tensor scratch;
  reduce_detail::Acc *weight_partial = nullptr, *bias_partial = nullptr;
  const int64_t weight_count = dweight.defined() ? channels * width : 0;
  const int64_t bias_count = dbias.defined() ? channels : 0;
  if (groups > 0 && weight_count + bias_count > 0) {
    scratch = Tensor::empty({groups * (weight_count + bias_count)}, DType::F64, x.device());
    reduce_detail::Acc* base = ptr<reduce_detail::Acc>(scratch);
    if (weight_count > 0) weight_partial = base;
    if (bias_count > 0) bias_partial = base + groups * weight_count;
  }
  if (groups > 0 && channels > 0) {
    dispatch_span_width(width, [&]<int kW>() {
      HAM_LAUNCH(grid, dim3(kChannelLanes, kBlockSpans), 0, launch_stream(),
                 conv_backward_spans<kW, T, I>)(
          ptr<const T>(dy), ptr<const T>(x), ptr<const T>(weight), ptr_or_null<const T>(bias),
          ids, channels, int(width), with_silu, spans, ptr_or_null<T>(dx), weight_partial,
          bias_partial);
    });
    HAM_CUDA_CHECK_LAUNCH();
  }
  // Each wanted gradient: its blocks' partials added in order (with no rows, T = 0, there
  // are none: the sums are 0).
  auto add_blocks = [&](int64_t count, const reduce_detail::Acc* partial, Tensor& out) {
    if (count == 0) return;
    HAM_LAUNCH(grid_for(count), kThreads, 0, launch_stream(),
               reduce_detail::add_splits<C, StoreScaled<T, C>>)(
        count, groups, partial, StoreScaled<T, C>{ptr<T>(out), C(1)});
    HAM_CUDA_CHECK_LAUNCH();
  };
  add_blocks(weight_count, weight_partial, dweight);
  add_blocks(bias_count, bias_partial, dbias);
}

template <class T, class I>
void backward_any_width(const Tensor& dz_or_dy, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, const I* ids, bool with_silu, Tensor& dx,
                        Tensor& dweight, Tensor& dbias) {
  using C = compute_t<T>;
  const int64_t seq = x.size(1), channels = x.size(2), width = weight.size(1);
  const int64_t rows = x.size(0) * seq, n = x.numel();
  Tensor dy = dz_or_dy;
  if (with_silu && n > 0) {  // dy = dz silu'(y), y recomputed into the scratch first
    dy = Tensor::empty(x.shape(), x.dtype(), x.device());
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), conv_forward_any_width)(
        ptr<const T>(x), ptr<const T>(weight), ptr_or_null<const T>(bias), ids, seq, channels,
        width, false, ptr<T>(dy), n);
    HAM_CUDA_CHECK_LAUNCH();
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), silu_grad_in_place)(
        ptr<const T>(dz_or_dy), ptr<T>(dy), n);
    HAM_CUDA_CHECK_LAUNCH();
  }
  if (dx.defined() && n > 0) {
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), conv_backward_input_any_width)(
        ptr<const T>(dy), ptr<const T>(weight), ids, seq, channels, width, ptr<T>(dx), n);
    HAM_CUDA_CHECK_LAUNCH();
  }
  if (dweight.defined()) {
    reduce_middle<C, ReduceForms::Columns>(
        x.device(), 1, rows, channels * width,
        WeightGradTerm<T, I>{ptr<const T>(dy), ptr<const T>(x), ids, seq, channels, width},
        StoreScaled<T, C>{ptr<T>(dweight), C(1)});
  }
  if (dbias.defined()) {
    reduce_middle<C, ReduceForms::Columns>(x.device(), 1, rows, channels,
                                           BiasGradTerm<T>{ptr<const T>(dy), channels},
                                           StoreScaled<T, C>{ptr<T>(dbias), C(1)});
  }
}

void causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& doc_ids,
                            Conv1dActivation activation, Tensor& dx, Tensor& dweight,
                            Tensor& dbias) {
  use_device_of(x);
  const bool with_silu = activation == Conv1dActivation::SiLU;
  dispatch_floating("causal_conv1d_backward", x.dtype(), [&]<class T>() {
    with_doc_ids("causal_conv1d_backward", doc_ids, [&]<class I>(const I* ids) {
      if (takes_spans(weight.size(1))) {
        backward_by_spans<T>(dy, x, weight, bias, ids, with_silu, dx, dweight, dbias);
      } else {
        backward_any_width<T>(dy, x, weight, bias, ids, with_silu, dx, dweight, dbias);
      }
    });
  });
}

const bool registered = [] {
  causal_conv1d_kernels().register_kernel(DeviceKind::CUDA, &causal_conv1d);
  causal_conv1d_backward_kernels().register_kernel(DeviceKind::CUDA, &causal_conv1d_backward);
  return true;
}();

}  // namespace

int set_conv1d_span_rows(int rows) {
  HAM_CHECK(rows >= 0 && rows <= kMaxSpanRows, "set_conv1d_span_rows: ", rows,
            " rows (0: automatic, else 1 to ", kMaxSpanRows, ")");
  return g_span_rows.exchange(rows);
}

bool set_conv1d_spans(bool on) { return g_spans_on.exchange(on); }

}  // namespace ham::cuda

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/conv1d.h"
#include "core/ops/unary.h"

namespace ham::cpu {

namespace {

// The weight and bias gradients' row tasks: 64 rows each, at most 64 tasks (so their
// partial sums stay within 64 x (W + 1) x C values), summed in T over blocks of 8 rows.
constexpr int64_t kRowsPerTask = 64;
constexpr int64_t kMaxWeightTasks = 64;
constexpr int64_t kRowsPerBlock = 8;

// weight [C, W] -> taps [W, C], so the inner loops run over contiguous channels.
template <class T>
std::vector<T> taps_by_offset(const Tensor& weight) {
  int64_t channels = weight.size(0), width = weight.size(1);
  const T* pw = weight.data<T>();
  std::vector<T> taps(size_t(channels * width));
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t j = 0; j < width; ++j) taps[size_t(j * channels + c)] = pw[c * width + j];
  }
  return taps;
}

// Per row (b, t) of x: how many earlier steps of t's document exist (`past`, t - start)
// and how many steps from t to the end of its document (`ahead`, end - t, t included).
// A document starts at t = 0 and wherever doc_ids changes; without doc_ids the whole
// sequence is one document.
struct DocumentExtent {
  std::vector<int64_t> past, ahead;
};

DocumentExtent document_extent(const Tensor& doc_ids, int64_t batch, int64_t seq) {
  std::vector<int64_t> ids =
      doc_ids.defined() ? doc_ids.to_vector<int64_t>() : std::vector<int64_t>();
  auto starts_here = [&](int64_t b, int64_t t) {
    return t == 0 || (!ids.empty() && ids[size_t(b * seq + t)] != ids[size_t(b * seq + t - 1)]);
  };
  DocumentExtent e{std::vector<int64_t>(size_t(batch * seq)),
                   std::vector<int64_t>(size_t(batch * seq))};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      size_t row = size_t(b * seq + t);
      e.past[row] = starts_here(b, t) ? 0 : e.past[row - 1] + 1;
    }
    for (int64_t t = seq - 1; t >= 0; --t) {
      size_t row = size_t(b * seq + t);
      e.ahead[row] = (t == seq - 1 || starts_here(b, t + 1)) ? 1 : e.ahead[row + 1] + 1;
    }
  }
  return e;
}

}  // namespace

void causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& doc_ids, Conv1dActivation activation, Tensor& y) {
  if (x.numel() == 0) return;
  int64_t seq = x.size(1), channels = x.size(2), width = weight.size(1);
  int64_t rows = x.size(0) * seq;
  DocumentExtent extent = document_extent(doc_ids, x.size(0), seq);
  dispatch_floating("causal_conv1d", x.dtype(), [&]<class T>() {
    std::vector<T> taps = taps_by_offset<T>(weight);
    const T* px = x.data<T>();
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    T* py = y.data<T>();
    parallel_for(rows, channels * width, [&](int64_t row) {
      T* out = py + row * channels;
      for (int64_t c = 0; c < channels; ++c) out[c] = pb ? pb[c] : T(0);
      // tap j reads x at time t - (W-1) + j: kept while that lies in t's document
      int64_t past = extent.past[size_t(row)];
      for (int64_t j = std::max<int64_t>(0, width - 1 - past); j < width; ++j) {
        const T* in = px + (row - (width - 1) + j) * channels;
        const T* w = taps.data() + j * channels;
        for (int64_t c = 0; c < channels; ++c) out[c] += w[c] * in[c];
      }
    });
  });
  if (activation == Conv1dActivation::SiLU) unary(UnaryOp::Silu, y, y);  // in place
}

void causal_conv1d_backward(const Tensor& dy_out, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& doc_ids,
                            Conv1dActivation activation, Tensor& dx, Tensor& dweight,
                            Tensor& dbias) {
  // With SiLU, dy_out is dz: dy = dz silu'(y), y recomputed (the forward kept only x).
  Tensor dy = dy_out;
  if (activation == Conv1dActivation::SiLU) {
    Tensor y = Tensor::empty(x.shape(), x.dtype());
    causal_conv1d(x, weight, bias, doc_ids, Conv1dActivation::None, y);
    dy = Tensor::empty(x.shape(), x.dtype());
    unary_backward(UnaryOp::Silu, dy_out, y, dy);
  }
  int64_t batch = x.size(0), seq = x.size(1), channels = x.size(2), width = weight.size(1);
  int64_t rows = batch * seq;
  DocumentExtent extent = document_extent(doc_ids, batch, seq);
  dispatch_floating("causal_conv1d_backward", x.dtype(), [&]<class T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    if (dx.defined() && dx.numel() > 0) {
      std::vector<T> taps = taps_by_offset<T>(weight);
      T* pdx = dx.data<T>();
      // dx at time s collects dy at t = s + (W-1) - j for each tap j, while t stays in
      // s's document: t < s + ahead(s), i.e. j >= W - ahead(s).
      parallel_for(rows, channels * width, [&](int64_t row) {
        T* out = pdx + row * channels;
        for (int64_t c = 0; c < channels; ++c) out[c] = T(0);
        int64_t ahead = extent.ahead[size_t(row)];
        for (int64_t j = std::max<int64_t>(0, width - ahead); j < width; ++j) {
          const T* g = pdy + (row + (width - 1) - j) * channels;
          const T* w = taps.data() + j * channels;
          for (int64_t c = 0; c < channels; ++c) out[c] += w[c] * g[c];
        }
      });
    }
    if (!dweight.defined() && !dbias.defined()) return;
    // Tasks of consecutive rows sum dy x and dy over every channel: in T over blocks of
    // kRowsPerBlock rows, whose sums are added up in double; the tasks' double partials
    // are then added in task order. Rows stream through whole, and the split depends only
    // on the row count, so the sums do not depend on the thread count. (Summing every term
    // in double was 3-4x slower, one float-to-double conversion per factor; summing a
    // task's 64 rows in T lost up to 3e-5 of a sum of 4500 unit terms.)
    const int64_t tasks =
        std::clamp<int64_t>((rows + kRowsPerTask - 1) / kRowsPerTask, 1, kMaxWeightTasks);
    const int64_t rows_per_task = (rows + tasks - 1) / tasks;
    T* pdw = dweight.defined() ? dweight.data<T>() : nullptr;
    T* pdb = dbias.defined() ? dbias.data<T>() : nullptr;
    const int64_t per_task = (pdw ? width * channels : 0) + (pdb ? channels : 0);
    // Per task: its double partials, then the block's sums in T (as many elements).
    Tensor partials = Tensor::empty({std::max<int64_t>(1, tasks * per_task)}, DType::F64);
    Tensor block_sums = Tensor::empty({std::max<int64_t>(1, tasks * per_task)}, x.dtype());
    double* pp = partials.data<double>();
    T* pbs = block_sums.data<T>();
    parallel_for(tasks, rows_per_task * width * channels, [&](int64_t task) {
      double* partial = pp + task * per_task;
      T* acc_w = pbs + task * per_task;  // [width, channels]
      T* acc_b = acc_w + (pdw ? width * channels : 0);
      std::fill(partial, partial + per_task, 0.0);
      const int64_t end = std::min(rows, (task + 1) * rows_per_task);
      for (int64_t first = task * rows_per_task; first < end; first += kRowsPerBlock) {
        std::fill(acc_w, acc_w + per_task, T(0));
        for (int64_t row = first; row < std::min(end, first + kRowsPerBlock); ++row) {
          const T* g = pdy + row * channels;
          if (pdb) {
            for (int64_t c = 0; c < channels; ++c) acc_b[c] += g[c];
          }
          if (!pdw) continue;
          int64_t past = extent.past[size_t(row)];
          for (int64_t j = std::max<int64_t>(0, width - 1 - past); j < width; ++j) {
            const T* in = px + (row - (width - 1) + j) * channels;
            T* acc = acc_w + j * channels;
            for (int64_t c = 0; c < channels; ++c) acc[c] += g[c] * in[c];
          }
        }
        for (int64_t e = 0; e < per_task; ++e) partial[e] += double(acc_w[e]);
      }
    });
    std::vector<double> sums(size_t(per_task), 0.0);
    for (int64_t t = 0; t < tasks; ++t) {
      const double* partial = pp + t * per_task;
      for (int64_t e = 0; e < per_task; ++e) sums[size_t(e)] += partial[e];
    }
    for (int64_t c = 0; c < channels; ++c) {
      if (pdb) pdb[c] = T(sums[size_t(per_task - channels + c)]);
      if (!pdw) continue;
      for (int64_t j = 0; j < width; ++j) pdw[c * width + j] = T(sums[size_t(j * channels + c)]);
    }
  });
}

}  // namespace ham::cpu

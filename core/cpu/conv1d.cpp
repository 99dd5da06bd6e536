#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/conv1d.h"

namespace ham::cpu {

namespace {

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
                   const Tensor& doc_ids, Tensor& y) {
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
}

void causal_conv1d_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& doc_ids, Tensor& dx, Tensor& dweight, Tensor& dbias) {
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
    // Channel blocks own their dweight/dbias entries and sum (b, t) in order, in double.
    constexpr int64_t kBlock = 64;
    int64_t blocks = (channels + kBlock - 1) / kBlock;
    T* pdw = dweight.defined() ? dweight.data<T>() : nullptr;
    T* pdb = dbias.defined() ? dbias.data<T>() : nullptr;
    parallel_for(blocks, rows * width * kBlock, [&](int64_t block) {
      int64_t c0 = block * kBlock, c1 = std::min(channels, c0 + kBlock), n = c1 - c0;
      std::vector<double> acc_w(size_t(width * n), 0.0), acc_b(size_t(n), 0.0);
      for (int64_t row = 0; row < rows; ++row) {
        const T* g = pdy + row * channels;
        if (pdb) {
          for (int64_t c = 0; c < n; ++c) acc_b[size_t(c)] += double(g[c0 + c]);
        }
        if (!pdw) continue;
        int64_t past = extent.past[size_t(row)];
        for (int64_t j = std::max<int64_t>(0, width - 1 - past); j < width; ++j) {
          const T* in = px + (row - (width - 1) + j) * channels;
          double* acc = acc_w.data() + j * n;
          for (int64_t c = 0; c < n; ++c) acc[c] += double(g[c0 + c]) * double(in[c0 + c]);
        }
      }
      for (int64_t c = 0; c < n; ++c) {
        if (pdb) pdb[c0 + c] = T(acc_b[size_t(c)]);
        if (!pdw) continue;
        for (int64_t j = 0; j < width; ++j) pdw[(c0 + c) * width + j] = T(acc_w[size_t(j * n + c)]);
      }
    });
  });
}

}  // namespace ham::cpu

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops/embedding.h"
#include "core/ops/shape.h"

namespace ham::cpu {

namespace {

void check_ids_in_vocab(const char* op, const Tensor& ids, int64_t vocab_size) {
  check_index_range(op, "id", ids, vocab_size, "vocabulary size V = " + std::to_string(vocab_size));
}

std::vector<int64_t> id_values(const char* op, const Tensor& ids) {
  std::vector<int64_t> values(size_t(ids.numel()));
  dispatch_index(op, ids.dtype(), [&]<class I>() {
    const I* p = ids.data<I>();
    for (size_t i = 0; i < values.size(); ++i) values[i] = int64_t(p[i]);
  });
  return values;
}

}  // namespace

void embedding(const Tensor& weight, const Tensor& ids, Tensor& out) {
  check_ids_in_vocab("embedding", ids, weight.size(0));
  int64_t dim = weight.size(1);
  if (out.numel() == 0) return;
  std::vector<int64_t> id = id_values("embedding", ids);
  size_t row_bytes = size_t(dim) * dtype_size(weight.dtype());  // a copy: any dtype works
  const char* pw = static_cast<const char*>(weight.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  parallel_for(int64_t(id.size()), dim, [&](int64_t p) {
    std::memcpy(po + size_t(p) * row_bytes, pw + size_t(id[size_t(p)]) * row_bytes, row_bytes);
  });
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dweight) {
  int64_t vocab = dweight.size(0), dim = dweight.size(1);
  check_ids_in_vocab("embedding_backward", ids, vocab);
  if (dy.numel() == 0) return;
  std::vector<int64_t> id = id_values("embedding_backward", ids);
  // Bucket positions by id (counting sort, stable), then each vocabulary row sums its
  // positions in order: parallel over rows, deterministic.
  std::vector<int64_t> start(size_t(vocab) + 1, 0);
  for (int64_t v : id) ++start[size_t(v) + 1];
  for (size_t v = 0; v < size_t(vocab); ++v) start[v + 1] += start[v];
  std::vector<int64_t> positions(id.size());
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (size_t p = 0; p < id.size(); ++p) positions[size_t(fill[size_t(id[p])]++)] = int64_t(p);
  dispatch_floating("embedding_backward", dy.dtype(), [&]<class T>() {
    const T* pdy = dy.data<T>();
    T* pdw = dweight.data<T>();
    int64_t per_row = std::max<int64_t>(1, int64_t(id.size()) / std::max<int64_t>(vocab, 1));
    parallel_for(vocab, per_row * dim, [&](int64_t v) {
      T* dst = pdw + v * dim;
      for (int64_t k = start[size_t(v)]; k < start[size_t(v) + 1]; ++k) {
        const T* src = pdy + positions[size_t(k)] * dim;
        for (int64_t c = 0; c < dim; ++c) dst[c] += src[c];
      }
    });
  });
}

}  // namespace ham::cpu

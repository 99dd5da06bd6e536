#pragma once
// Layout ops. All of them copy into a new contiguous tensor.
//   concat(xs, d):      out[.., o_i + j, ..] = xs[i][.., j, ..],  o_i = sum of sizes before i
//   split(x, sizes, d): the inverse of concat (so each is the other's backward)
//   permute(x, dims):   out[i] = x[j] with j[dims[k]] = i[k];  out.shape[k] = x.shape[dims[k]]
//   gather(x, d, idx):  out[i] = x[i with coordinate d replaced by idx[i]]  (torch.gather)
//   index_select(x, d, idx): out[.., j, ..] = x[.., idx[j], ..]  (idx 1-D)
// The backward of gather and index_select is a deterministic scatter-add into zeros.
// concat/split/permute/gather/index_select move bytes, so they take every dtype; the
// scatter-adds take f32/f64. Negative dims count from the end.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ham {

// Dims are already normalised (0 <= dim < rank) when a kernel sees them.
HAM_DECLARE_KERNEL_TABLE(concat, void(const std::vector<Tensor>& xs, int64_t dim, Tensor& out));
HAM_DECLARE_KERNEL_TABLE(split, void(const Tensor& x, int64_t dim, std::vector<Tensor>& outs));
HAM_DECLARE_KERNEL_TABLE(permute,
                         void(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out));
HAM_DECLARE_KERNEL_TABLE(gather,
                         void(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out));
// dx (zeroed by the caller) += scatter of dy at index along dim
HAM_DECLARE_KERNEL_TABLE(gather_backward,
                         void(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx));
HAM_DECLARE_KERNEL_TABLE(index_select,
                         void(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out));
// dx (zeroed by the caller) += dy rows added at index along dim
HAM_DECLARE_KERNEL_TABLE(index_select_backward,
                         void(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx));

namespace ops {

// dim in [-rank, rank) -> [0, rank); else "<op>: dim <d> out of range for shape [..]".
int64_t normalize_dim(const char* op, int64_t dim, const Shape& shape);

Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather_backward(const Tensor& dy, int64_t dim, const Tensor& index, const Shape& x_shape);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_select_backward(const Tensor& dy, int64_t dim, const Tensor& index,
                             const Shape& x_shape);

}  // namespace ops

namespace cpu {
void concat(const std::vector<Tensor>& xs, int64_t dim, Tensor& out);
void split(const Tensor& x, int64_t dim, std::vector<Tensor>& outs);
void permute(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out);
void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);
void gather_backward(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx);
void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);
void index_select_backward(const Tensor& dy, int64_t dim, const Tensor& index, Tensor& dx);

// Host-side bounds check shared by the index kernels (run before any parallel loop, so
// the throw never leaves an OpenMP region). For the first entry v outside [0, limit):
//   "<op>: <what> <v> at position [..] of <what>s [..] is outside [0, <limit>) (<why>)"
void check_index_range(const char* op, const char* what, const Tensor& index, int64_t limit,
                       const std::string& why);
}  // namespace cpu

}  // namespace ham

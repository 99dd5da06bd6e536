#pragma once
// Tuning of the CUDA norm kernels (cuda/norm.cu), for tests that reach every path.
#include <cstdint>

namespace ham::cuda {

// At most this many row groups in the rms_norm forward's row-group kernel (0, the
// default: as many as fit the device at once), so that a group takes several rows even
// with few rows. Returns the previous setting; a negative value is an error.
int64_t set_rms_norm_row_groups(int64_t most);

}  // namespace ham::cuda

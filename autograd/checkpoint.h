#pragma once
// Activation recompute: run a block without keeping its intermediate activations, and
// run it again during backward to get them back. Trades one extra forward for memory.
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace ham {

using BlockFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Returns fn(inputs). The block must be deterministic (same outputs when rerun).
// Parameters the block reads (leaves not passed in `inputs`) receive their gradients
// in grad() when the recomputed block is backpropagated.
std::vector<Tensor> checkpoint(const BlockFn& fn, const std::vector<Tensor>& inputs);

}  // namespace ham

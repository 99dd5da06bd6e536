#pragma once
// Switches of the CUDA causal_conv1d kernels (cuda/conv1d.cu): for the tests, which reach
// every path, and the benchmark, which times the two kinds of kernel against each other.

namespace ham::cuda {

// Rows each thread of the span kernels (widths up to 8) walks down one channel: 0, the
// default, chooses by the shape (16 to 256 rows, enough threads to fill the GPU). A count
// changes the sums' order of the weight gradient, never which terms they take. Returns the
// previous setting; a negative value or one above 4096 is an error.
int set_conv1d_span_rows(int rows);

// Whether widths up to 8 take the span kernels (on, the default) or the per-element kernels
// that wider convolutions take (off: the reference the benchmark times them against).
// Returns the previous setting.
bool set_conv1d_spans(bool on);

}  // namespace ham::cuda

#pragma once
// Tuning of the CUDA routed attention kernels (cuda/routed_attention.cu and
// cuda/routed_attention_decode.cu), for benchmarks that compare variants in one run
// (bench/bench_routed_attention_cuda.cpp, bench/bench_decoding_cuda.cpp).

#include <cstdint>

namespace ham {
class Tensor;
struct CompactSelection;
}  // namespace ham

namespace ham::cuda {

// Query rows per block of the bf16 mma.sync forward for head dims Dk in {64, 128} and
// Dv in {64, 128, 192}: 128 (the default: two 16-row tiles per warp) or 64 (one). Other
// head dims always take 64. Returns the previous setting; any other value is an error.
int set_attention_forward_rows(int rows);

// Keys per tile of the 128-row mma.sync forward with value heads of 128: 64 (the
// default) or 32. Returns the previous setting; any other value is an error.
int set_attention_forward_keys(int keys);

// Which kernels compute each bf16 pass at the head dims the wgmma kernels take (64 and 128
// in each of Dk and Dv, the paper's HAM heads 128 x 192, and 256 x 256; other head dims
// always take mma.sync):
//   kAttentionWgmmaAutomatic (the default): where attention_wgmma_available(), the
//     faster on the H200 (2026-11-27): the backward 1 warpgroup a block at 64 and 128, 2
//     at 128 x 192 and 256 x 256; the forward mma.sync at 128 x 128 and wherever one head
//     dim is 64 and the other 128, 1 warpgroup at 64 x 64, 2 at 128 x 192 and 256 x 256;
//     elsewhere mma.sync;
//   0: the warps' mma.sync kernels;
//   1 or 2: the warpgroup wgmma kernels with that many warpgroups a block (64 rows each;
//     two share the tiles they visit), which need sm_90a code and a GPU of compute
//     capability 9.0 (a pass set to them elsewhere is an error).
// Each returns the previous setting; any other value is an error.
constexpr int kAttentionWgmmaAutomatic = -1;
int set_attention_forward_wgmma(int kernels);
int set_attention_backward_wgmma(int kernels);

// How many forward / backward calls of this process have run on the wgmma kernels (so that
// a test can tell that the kernels it sets are the ones that ran).
int64_t attention_forward_wgmma_launches();
int64_t attention_backward_wgmma_launches();

// Whether the bf16 forward on one wgmma warpgroup a block (head dims 64 and 128, where
// set_attention_forward_wgmma is 1, or automatic at 64 x 64 and 128 x 128) runs as a
// persistent kernel: `blocks` blocks, each taking query tiles in turn and issuing the next
// tile's copies (Q and its first key tile, from the query tiles' records, which one more
// small launch writes) under the current tile's last products and its epilogue, so that a
// tile's prologue overlaps work. 0: off (the default, untimed on a GPU: seventy-second
// session); -1: as many blocks as the SMs hold at once; n > 0: n blocks (at most one a query
// tile; tests take few, so that each block runs many). The outputs are the same to the bit.
// Returns the previous setting; below -1 is an error.
int set_attention_forward_persistent(int blocks);

// How many forward calls of this process ran persistent.
int64_t attention_forward_persistent_launches();

// Keys a tile of the backward's wgmma dQ kernel at head dims of 64 and 128 on one
// warpgroup a block (elsewhere the kernel keeps its own tile): 32 (the default), 64 or 16.
// 32 halves its score registers and key slots so that three blocks may share an SM where
// two do. On the H200 (docs/gpu_results.md, thirty-sixth session) the backward took
// 1.00-1.10x as long with 64 as with 32 in the 12 cases timed (rho 0.25 in one document,
// 20 packed documents at every rho), the most with packed documents, whose blocks see few
// keys. 16 halves them again, with the kernel bound to 128 registers, so that four blocks
// share an SM at 128 x 128 (untimed on a GPU: forty-fifth session). Returns the previous
// setting; any other value is an error.
int set_attention_backward_dq_keys(int keys);

// How many backward calls of this process ran the wgmma dQ kernel in 32-key tiles, and in
// 16-key tiles.
int64_t attention_backward_dq_32_key_launches();
int64_t attention_backward_dq_16_key_launches();

// Whether the backward's first pass runs beside its other kernels where the wgmma dQ kernel
// forms D, so that the pass only zeroes dk, dv and dp at the tokens not selected, rows no
// other kernel of the backward writes: its stores, bound by HBM, then run under the
// tensor-core passes' short blocks. The other kernels go on a second stream of the
// device's greatest priority (cuda::ForkedStream, joined before the backward returns), so
// their blocks take the SMs first and the first pass's fill what they leave. On by
// default: 1.00-1.02x faster in the 12 cases timed on the H200 (thirty-sixth session),
// never slower, with the first pass on the second stream at equal priorities; untimed as
// the priorities have it now. Returns the previous setting.
bool set_attention_backward_overlap(bool overlap);

// How many backward calls of this process ran their first pass beside the others, with
// those on a stream of the device's greatest priority.
int64_t attention_overlapped_prologues();

// Whether the backward's wgmma dQ kernel on one warpgroup a block, in 32-key tiles (the
// default where it runs) or 16, starts its blocks from records of their query tiles (the visible
// keys' bounds and the first key positions), which the query tiles' summary kernel,
// launched before it anyway, then also writes: a block issues its first key tile's copies
// after one load instead of a chain of three (its rows' ranges, two barriers, the
// positions). The outputs are the same bit for bit. Off by default: untimed on a GPU
// (forty-first session). Returns the previous setting.
bool set_attention_backward_dq_records(bool records);

// Whether the backward's wgmma dQ kernel on one warpgroup a block in 32-key tiles (the
// default where it runs: head dims 64 and 128) runs as a persistent kernel: `blocks` blocks,
// each taking query tiles in turn and issuing the next tile's copies (its first key tile
// from the query tiles' records, then Q and dO once the current tile's last S and dP have
// read theirs) under the current tile's last products and its dq stores. 0: off (the
// default, untimed on a GPU: seventy-second session); -1: as many blocks as the SMs hold at
// once; n > 0: n blocks (at most one a query tile). The gradients are the same to the bit.
// Returns the previous setting; below -1 is an error.
int set_attention_backward_dq_persistent(int blocks);

// How many backward calls of this process ran the persistent dQ kernel.
int64_t attention_backward_dq_persistent_launches();

// Whether the backward's wgmma dK/dV kernel on one warpgroup a block (head dims 64 and 128)
// runs as a persistent kernel: `blocks` blocks, each taking key tiles in turn, with the next
// tile's positions loaded under the current tile's K and V copies and its K and V rows
// prefetched into L2 under the current tile's epilogue. 0: off (the default, untimed on a
// GPU: seventy-eighth session); -1: as many blocks as the SMs hold at once; n > 0: n blocks
// (at most one a key tile). The gradients are the same to the bit. Returns the previous
// setting; below -1 is an error.
int set_attention_backward_dkdv_persistent(int blocks);

// How many backward calls of this process ran the persistent dK/dV kernel.
int64_t attention_backward_dkdv_persistent_launches();

// How many backward calls of this process ran the wgmma dQ kernel from those records.
int64_t attention_backward_dq_record_launches();

// How many launches of the backward's wgmma dK/dV kernel ran their prologue (the key tile,
// K and V', the first query tile's rows and copies) before their wait for the kernel just
// ahead, as dependent launches do where set_dependent_launches (cuda/dependent_launch.h):
// those whose kernel just ahead is the dQ pass or the dK half of a split pass, not the key
// tile order's. The wgmma dQ kernel's prologue always runs before its wait (from the query
// tiles' records: after it).
int64_t attention_key_prologues_before_wait();

// Whether the backward's dK/dV blocks take their key tiles by work, heaviest first, rather
// than by rank. A key tile's work is the query tiles that see its keys. By rank, the
// heaviest start first in one document, but with packed documents heavy blocks also start
// in the last wave. A list-scheduling model of the H200's block timelines puts that at
// 1.05-1.09x of the dK/dV kernel's time heaviest first at B1 T16384 H16, 20 documents,
// rho 0.25, and 1.04-1.05x at rho 0.5 (scripts/attention_block_order.py --documents). Each
// dK/dV launch then runs one more kernel first (order_key_tiles_by_work, a block a batch
// row) and each of its blocks one more load. The outputs are the same bit for bit. Off by
// default: untimed on a GPU (forty-third session). Returns the previous setting.
bool set_attention_backward_key_order(bool by_work);

// How many backward calls of this process ran their dK/dV blocks in that order.
int64_t attention_backward_key_order_launches();

// Whether the backward's wgmma dQ kernel, where it forms D, also writes the zero gradients
// of the keys not selected (dk, dv and dp at those tokens), so that no first pass runs.
// That pass writes them on its own (101 MB at B4 T4096 H16 D128 rho 0.25): beside the
// others or not, the H200's timelines of single calls (sixty-eighth session) show the dQ
// kernel starting 25-30 us into the backward, after it, in every case (part of that may be
// the host issuing the call; docs/gpu_results.md, sixty-ninth session). The dQ blocks of
// each kv head's first query head zero the unselected ones of their rows (two dependent
// loads a row under their prologue, then a warp's 16-byte stores a row). The outputs are
// the same bit for bit.
// On by default: on the H200 (seventieth session) 1.00-1.02x the first pass's backward time
// at the median in all 12 cases timed, never slower at the min or max; far less than the
// 25-30 us the timelines suggested. Returns the previous setting.
bool set_attention_backward_zeros_in_dq(bool in_dq);

// How many backward calls of this process wrote those zeros in the dQ kernel.
int64_t attention_backward_zeros_in_dq_launches();

// The order the dK/dV blocks take the key tiles of `rows` compacted keys of `selection`
// (on a GPU) in: [B, ceil(T / rows)] i32, rank by rank, each row's tiles by work falling (in
// 1023 bins of equal width up to the row's greatest), by index within a bin, the tiles past
// the row's keys last. For tests and inspection.
Tensor attention_key_tile_order(const CompactSelection& selection, int rows);

// Whether this build and the current GPU run the wgmma kernels (both passes): the build has
// sm_90a code (90a in CMAKE_CUDA_ARCHITECTURES) and the GPU is of compute capability 9.0;
// always in the SIMT emulator.
bool attention_wgmma_available();

// Whether the wgmma kernels take heads of these dims (both passes).
bool attention_wgmma_takes_head_dims(int64_t key_dim, int64_t value_dim);

// Keys a tile of the decode kernel (routed_attention_decode): 0 (the default) lets the host
// pick the largest of 32, 16 and 8 at which two blocks fit an SM (64 was never the faster
// on the H200); 8, 16, 32 or 64 sets it (a tile too large for the device's shared memory
// is then an error). Returns the previous setting; any other value is an error.
int set_attention_decode_keys(int keys);

}  // namespace ham::cuda

#pragma once
// Tuning of the CUDA gated delta rule kernels (cuda/gated_delta_rule.cu), for benchmarks
// that compare variants in one run (bench/bench_gated_delta_rule_cuda.cpp).

#include <cstdint>
#include <vector>

namespace ham {
class Tensor;
}  // namespace ham

namespace ham::cuda {

// Value columns per block of the bf16 sequential state passes, the forward's (gdr_state_mma)
// and, at K <= 128, the backward's (gdr_bwd_state_mma; 32 at K = 256): 0 (the default)
// picks 32 when the narrower tiles' blocks number no more than the device's SMs, else 64;
// 32 or 64 force that width. Returns the previous setting; any other value is an error.
int set_gated_delta_rule_state_columns(int columns);

// How many bf16 prepare kernels of this process read each chunk's A as the forward kept it
// (GatedDeltaRuleKeep::Inverses) instead of forming it: a backward's recompute each.
int64_t gated_delta_rule_kept_inverse_reads();

// Whether the bf16 backward's sequential pass, where two slots of chunk tiles do not fit a
// block's shared memory (K = 256), copies each chunk's K and dvl a chunk ahead in two slots
// and its Q, W and dO at the step's start, to land during the step's first product
// (kKeysAheadSlots in cuda/gated_delta_rule.cu), instead of all five tiles at the step's
// start, waited for before the first product (one slot). On by default: on the H200 the
// backward took 0.91-0.92x the one slot's time at the paper's heads, 4,096 and 16,384
// tokens (docs/gpu_results.md, sixty-eighth session). The gradients are the same to the bit
// either way. Returns the previous setting.
bool set_gated_delta_rule_backward_keys_ahead(bool ahead);

// How many backward passes of this process copied the keys ahead.
int64_t gated_delta_rule_keys_ahead_passes();

// Partial sums (1, the default, or 2) over K of the first product of each chunk step of
// the bf16 state passes with 8 warps on 32 columns (K >= 128: v_new = U - W S0 forward,
// du = dvl + diag(tau) K dS_end backward). A warp there holds two 8-column accumulator
// blocks, each a chain of K / 16 dependent mma (16 at the paper's K = 256); with 2, every
// other 16-key step goes to a second accumulator, added at the end: chains half as long,
// for a step that ncu found a chain of latencies (thirty-seventh session). Untimed on a GPU;
// the sums' order changes, so the results differ from 1's in the last bits. Returns the
// previous setting; any other count is an error.
int set_gated_delta_rule_state_partial_sums(int parts);

// How many state passes of this process, forward or backward, took two partial sums.
int64_t gated_delta_rule_partial_sum_passes();

// Warps per block of the bf16 prepare kernel (gdr_prepare_mma: each chunk's gates' cumsum,
// A = (I + L)^-1, W and U): 4, the default, or 8, where warps w and w + 4 share 16 rows
// of each product and take half its columns each. ncu found the kernel latency-bound at
// 2-3 blocks of 4 warps an SM, which its shared memory allows (thirty-seventh session);
// 8 warps use the same shared memory. Untimed on a GPU. The results are the same to the
// bit either way. Returns the previous setting; any other count is an error.
int set_gated_delta_rule_prepare_warps(int warps);

// How many forwards and backwards' recomputes of this process ran their prepare kernel (one
// launch, or one a window) in 8 warps.
int64_t gated_delta_rule_eight_warp_prepares();

// Windows of chunks the bf16 forward runs its state pass in (1, the default: one launch
// over every chunk; at most kMaxStatePassWindows). With more, each window's state pass goes
// on a second stream of the device's greatest priority and the output kernel of a window
// runs on the current stream as soon as that window's pass is done, beside the next
// window's pass: the state pass leaves SMs idle where its blocks (one per V tile of 32 or
// 64 columns, head and document) are fewer than the SMs (60 at the paper's heads, one row,
// on 132), and the output kernel's blocks can fill them. The state of a document crossing
// a window's end passes to the next launch in f32, so the results are the same to the bit.
// Untimed on a GPU. Returns the previous setting; any other count is an error.
constexpr int kMaxStatePassWindows = 64;
int set_gated_delta_rule_forward_windows(int windows);

// How many forwards of this process ran their state pass in windows, on a stream of the
// device's greatest priority.
int64_t gated_delta_rule_windowed_forwards();

// Whether a forward whose state pass runs in windows (set_gated_delta_rule_forward_windows)
// runs its prepare kernel (W, U and G) by the same windows, all of them first on the
// current stream, each window's pass waiting only for its own (true, the default), or once
// over every chunk before the first pass (false). By windows, the pass over the first
// window starts after a window's prepare kernel rather than all of it, and the others run
// beside it: at the paper's heads the prepare kernel is about a tenth of the forward, the
// state pass two thirds on 60 of the 132 SMs (H200, thirty-seventh session). Untimed on a
// GPU; the results are the same to the bit. Returns the previous setting.
bool set_gated_delta_rule_forward_prepare_windows(bool in_windows);

// How many forwards of this process ran their prepare kernel in windows.
int64_t gated_delta_rule_windowed_prepares();

// How the bf16 forward's output kernel (gdr_output_mma: o, and the fit error's prediction)
// takes its chunks: 0 (the default), a block a chunk, each starting with all its copies;
// -1, about one wave of blocks, or N > 0, at most N blocks a row (tests), each block taking
// every gridDim.x-th chunk of its row and, where V has two or more 64-column tiles, copying
// its next chunk's first two value tiles (S0, v_new, v) as this chunk's last two tiles free
// their slots, so that they land under this chunk's last products and stores. Two blocks
// share an SM at K <= 128, bound by registers and shared memory alike, and the kernel took
// 0.393 ms of a 1.297 ms forward at B2 T16384 H16 D128 (thirty-seventh session), over twice
// its loads' time at the H200's bandwidth: the next chunk's copies are latency it can hide.
// Untimed on a GPU; the results are the same to the bit. Returns the previous setting; a
// count below -1 is an error.
int set_gated_delta_rule_output_prefetch(int blocks);

// How many output kernel launches of this process (one a forward, or one a window) took
// their chunks so.
int64_t gated_delta_rule_prefetching_output_passes();

// Windows of chunks the bf16 backward's recompute of the forward's state pass runs in (1,
// the default, to kMaxStatePassWindows), where the backward runs its P^T dO kernel beside
// that pass (set_gated_delta_rule_backward_overlap): every window's prepare kernel first
// on the current stream, then the P^T dO kernel there, and each window's pass on the
// high-priority second stream after its own prepare kernel. The pass over the first window
// starts after a window's prepare kernel rather than all of it: at the paper's heads and
// 16,384 tokens that kernel (reading the kept A) took 0.145 ms before a 0.804 ms pass, of a
// 3.2 ms backward (H200, thirty-seventh session). Untimed on a GPU; the gradients are the
// same to the bit. Returns the previous setting; any other count is an error.
int set_gated_delta_rule_recompute_windows(int windows);

// How many backwards of this process ran their recompute in windows, on a stream of the
// device's greatest priority.
int64_t gated_delta_rule_windowed_recomputes();

// The same for the bf16 backward's reverse state pass (1, the default, to
// kMaxStatePassWindows windows, the last first): the values, keys and WY kernels of a
// window, which read its dS_end and du, run beside the pass over the window before. The
// gradients are the same to the bit. Untimed on a GPU. Returns the previous setting.
int set_gated_delta_rule_backward_windows(int windows);

// How many backwards of this process ran their reverse pass in windows, on a stream of the
// device's greatest priority.
int64_t gated_delta_rule_windowed_backwards();

// Whether the bf16 backward, where it recomputes the forward's state pass, runs its P^T dO
// kernel (gdr_bwd_local_mma) beside that pass instead of after it: the state pass on a
// second stream of the device's greatest priority (cuda/stream.h, ForkedStream), so that
// its blocks take their SMs first, and the P^T dO kernel on the current stream. On by
// default: 1.00-1.04x faster at the five shapes timed on the H200 (thirty-sixth session),
// never slower, with the P^T dO kernel on the second stream at equal priorities; untimed
// as the priorities have it now. Returns the previous setting; the gradients are the same
// to the bit either way.
bool set_gated_delta_rule_backward_overlap(bool overlap);

// How many backward calls of this process ran that kernel beside the state pass, with the
// state pass on a stream of the device's greatest priority.
int64_t gated_delta_rule_overlapped_local_passes();

// Whether the bf16 kernels at K = 256 that keep two slots of chunk tiles in shared memory,
// the next chunk's (or value tile's) copies landing in one while the other is read, keep
// one instead: the forward's state pass (gdr_state_mma<.., 1>: the chunk's K rows copied
// during its v_new product, the next chunk's W and U during its state update), the output
// kernel (gdr_output_mma<.., true>: each value tile copied after the last is read, no
// prefetch) and the backward's state pass (gdr_bwd_state_mma, one slot). Off by default;
// those kernels take one slot anyway where two do not fit the device's shared memory a
// block: the forward's state pass needs 171,008 bytes at 32 columns in two slots and
// 98,304 in one, the output kernel with the fit error 178,176 and 122,880, so the paper's
// heads (K = 256) run on an A100's 163 KiB. The results are the same to the bit. Untimed
// on a GPU (run on the SIMT emulator at 163 KiB). Returns the previous setting.
bool set_gated_delta_rule_one_slot(bool one_slot);

// How many launches of those kernels in one slot this process made.
int64_t gated_delta_rule_one_slot_launches();

// The chunk table the tensor-core passes read where there are doc_ids (chunk_table_kernel),
// built from doc_ids ([B, T] i32 or i64 on a GPU) and read back, for tests. (Without doc_ids
// the passes build no table: each row is one document of 64-token chunks.) Per row: each
// chunk's first token, then T; whether each chunk begins a document; each document's first
// chunk, then the row's chunk count.
struct GatedDeltaRuleChunkTableRow {
  std::vector<int32_t> chunk_begin, chunk_doc_start, doc_chunk;
};
std::vector<GatedDeltaRuleChunkTableRow> gated_delta_rule_chunk_table(const Tensor& doc_ids,
                                                                      int64_t batch,
                                                                      int64_t seq_len);

}  // namespace ham::cuda

#pragma once
// Where a kernel's blocks spend their time. While a run records (record_block_timelines),
// thread 0 of each block of an instrumented kernel stores its SM's cycle counter at five
// points (start; its first tile's copies issued; that tile landed, so the prologue is over;
// its tiles done; end), the global nanosecond timer at start and end, its SM and how many
// tiles it visited, in one BlockStamps. summarize_block_timeline turns a launch's stamps
// into what an event time cannot tell apart: the prologue, split where the first copies
// go out (before: the chain of dependent loads that gives their addresses; after: the
// copies landing), the time a tile, the epilogue, the gaps between blocks on an SM and the
// SMs left idle at the end.
//
// Not recording, a kernel's timeline pointer is null and each mark is one untaken branch.
// Each mark reads its thread and block anew and stores its stamp at once, so that little
// stays live across a kernel's tile loop: on sm_90a (nvcc 13.0) the instrumented kernels
// take -2 to +6 registers, and none of the instances the defaults run spills.
//
// Instrumented: the routed attention kernels the bf16 defaults run (forward_mma,
// forward_wgmma, backward_dq_wgmma, backward_dkdv_wgmma, the persistent forward and dQ
// kernels an entry a query tile (mark_entry), and the backward's small kernels
// backward_prologue, summarize_query_tiles and gather_value_scale_grad, which visit no
// tiles; cuda/routed_attention.cu), and the gated delta rule's tensor-core kernels, each
// chunk a tile, with its chunk table where there are document ids (cuda/gated_delta_rule.cu).
// bench_routed_attention_cuda --timeline and bench_gated_delta_rule_cuda --timeline print
// their summaries, each launch's window set against its pass's first block.
#include <cstdint>
#include <string>
#include <vector>

#if defined(__CUDACC__) || defined(HAM_CUDA_EMULATOR)
#include <cuda_runtime.h>
#endif
#ifdef HAM_CUDA_EMULATOR
#include <atomic>
#endif

namespace ham::cuda {

struct BlockStamps {
  // The block's SM's cycle counter (clock64) at each mark; 0 where the block did not reach
  // it (no tile: copies_issued and first_tile may stay 0).
  uint64_t start, copies_issued, first_tile, tiles_done, end;
  uint64_t start_ns, end_ns;  // %globaltimer: comparable across SMs
  uint32_t sm, tiles;
};
static_assert(sizeof(BlockStamps) == 64, "eight 8-byte words a block");

// CopiesIssued: thread 0 has issued its copies of the block's first tile (and of its own
// rows), so the loads their addresses wait for are done.
enum class BlockMark { Start, CopiesIssued, FirstTile, TilesDone, End };

#if defined(__CUDACC__) || defined(HAM_CUDA_EMULATOR)

#ifdef HAM_CUDA_EMULATOR
// The emulator runs one block at a time: one counter, advanced by every read, stands for
// both clocks, so a block's marks come out in program order and blocks one after another.
inline uint64_t emulated_clock() {
  static std::atomic<uint64_t> ticks{0};
  return ++ticks;
}
inline uint64_t block_cycle_clock() { return emulated_clock(); }
inline uint64_t global_timer_ns() { return emulated_clock(); }
inline uint32_t block_sm_id() { return 0; }
inline uint32_t stamping_thread() { return threadIdx.x; }
inline uint32_t stamped_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
#else
__device__ __forceinline__ uint64_t block_cycle_clock() { return uint64_t(clock64()); }
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
__device__ __forceinline__ uint32_t block_sm_id() {
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}
// threadIdx.x and blockIdx.x read anew at each mark (volatile): read as plain built-ins,
// ptxas kept the block's stamp address from the first mark to the last, two registers
// across the tile loop, and the 128 x 128 forward spilled.
__device__ __forceinline__ uint32_t stamping_thread() {
  uint32_t thread;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(thread));
  return thread;
}
// The block's index in its grid, x fastest, then y, then z.
__device__ __forceinline__ uint32_t stamped_block() {
  uint32_t x, y, z, width, height;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(z));
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(width));
  asm volatile("mov.u32 %0, %%nctaid.y;" : "=r"(height));
  return x + width * (y + height * z);
}
#endif

// `mark` into one entry of a timeline, now.
__device__ __forceinline__ void stamp_mark(BlockStamps& stamps, BlockMark mark, int64_t tiles) {
  const uint64_t now = block_cycle_clock();
  switch (mark) {
    case BlockMark::Start:  // the whole entry: the buffer is not zeroed before the launch
      stamps = BlockStamps{now, 0, 0, 0, 0, global_timer_ns(), 0, block_sm_id(), 0};
      break;
    case BlockMark::CopiesIssued:
      stamps.copies_issued = now;
      break;
    case BlockMark::FirstTile:
      stamps.first_tile = now;
      stamps.tiles = uint32_t(tiles);
      break;
    case BlockMark::TilesDone:
      stamps.tiles_done = now;
      break;
    case BlockMark::End:
      stamps.end = now;
      stamps.end_ns = global_timer_ns();
      break;
  }
}

// Thread 0 stamps `mark` into the block's entry of `timeline` (one entry per block of the
// grid, x fastest); `tiles`, the tiles the block will visit, goes with FirstTile (a block
// that visits none keeps 0). Nothing when not recording (null). Every block's first mark
// is Start, which writes its whole entry.
__device__ __forceinline__ void mark_block(BlockStamps* timeline, BlockMark mark,
                                           int64_t tiles = 0) {
  if (timeline == nullptr || stamping_thread() != 0) return;
  stamp_mark(timeline[stamped_block()], mark, tiles);
}

// mark_block into entry *entry rather than the block's own: the persistent kernels, whose
// blocks take many query tiles each, stamp an entry a query tile. A tile starts where its
// block begins it, after the tile before; its copies went out before that, under the tile
// before, so its CopiesIssued is stamped at its start. Only the stamping thread reads
// *entry, and only while recording (the kernels keep it in shared memory, which thread 0
// alone writes): a volatile read, which no compiler moves ahead of the test. (A plain one,
// hoisted by GCC, had every thread read it, a race the emulator's racecheck reported.)
__device__ __forceinline__ void mark_entry(BlockStamps* timeline, const int* entry,
                                           BlockMark mark, int64_t tiles = 0) {
  if (timeline == nullptr || stamping_thread() != 0) return;
  stamp_mark(timeline[*static_cast<const volatile int*>(entry)], mark, tiles);
}

// Start when made, End when the kernel leaves its scope, whichever return it takes (the
// gated delta rule's kernels, with their early returns; every block must stamp both).
// loop_begins and loop_done stamp FirstTile and TilesDone around a block's loop over its
// tiles (there, chunks): the prologue ends where the loop begins, not where its first
// tile's copies land, and a block of no tiles stays out of the tile figures.
class StampedBlock {
 public:
  __device__ __forceinline__ explicit StampedBlock(BlockStamps* timeline) : timeline_(timeline) {
    mark_block(timeline_, BlockMark::Start);
  }
  __device__ __forceinline__ ~StampedBlock() { mark_block(timeline_, BlockMark::End); }
  StampedBlock(const StampedBlock&) = delete;
  StampedBlock& operator=(const StampedBlock&) = delete;
  // count() gives the tiles the loop will visit; called only while recording.
  template <class CountTiles>
  __device__ __forceinline__ void loop_begins(CountTiles count) const {
    if (timeline_ != nullptr) mark_block(timeline_, BlockMark::FirstTile, count());
  }
  __device__ __forceinline__ void loop_done() const { mark_block(timeline_, BlockMark::TilesDone); }

 private:
  BlockStamps* timeline_;
};

#endif

// ---- Host ----------------------------------------------------------------------------

// A kernel's name with up to five template arguments, formatted only when recording:
// {"forward_wgmma", {128, 128, 1}, 3} reads "forward_wgmma<128, 128, 1>".
struct KernelName {
  const char* base;
  int arguments[5];
  int count;
  std::string text() const;
};

// Starts recording (dropping earlier records) or stops it.
void record_block_timelines(bool on);
bool recording_block_timelines();

// A buffer of `blocks` stamps on the current device for a launch of `kernel`, kept until
// taken; null when not recording. Not zeroed: each block's Start mark writes its whole
// entry. A memset on the stream would sit between the launch and the kernel ahead of it,
// and a dependent launch (cuda/dependent_launch.h) overlaps only a kernel just ahead: the
// recording would take away the overlap it is there to show.
BlockStamps* block_timeline_for_launch(const KernelName& kernel, int64_t blocks);

struct KernelTimeline {
  std::string kernel;
  std::vector<BlockStamps> blocks;  // by blockIdx.x
};
// The launches recorded since recording began, in launch order, and forgets them (waits
// for the device).
std::vector<KernelTimeline> take_block_timelines();

// p10, median and p90 of a set of values (0 for an empty set).
struct Quantiles {
  double p10 = 0, median = 0, p90 = 0;
};

struct TimelineSummary {
  int64_t blocks = 0;
  int64_t working_blocks = 0;  // that visited a tile
  int64_t tiles = 0;           // over all blocks
  int sms = 0;                 // that ran a block
  int most_resident = 0;       // blocks at once on one SM, at most
  double cycles_per_ns = 0;    // the SMs' clock against the global timer, over all blocks
  double span_us = 0;          // the first block's start to the last one's end
  // Those two on the global timer, to set launches against each other (timeline_summary_row).
  uint64_t first_start_ns = 0, last_end_ns = 0;
  // Of the working blocks, in us: start to first tile landed, the tiles' time divided by
  // their count, tiles done to end, and start to end; and of those that stamp
  // CopiesIssued, start to their first copies issued (the rest of the prologue is the
  // copies landing).
  Quantiles prologue_us, tile_us, epilogue_us, block_us, issue_us;
  // Least squares over all blocks: a block's time = fixed_us + tile_fit_us * its tiles.
  double fixed_us = 0, tile_fit_us = 0;
  // Per SM, the time inside its own first start .. last end with no block of the launch
  // resident (between blocks), and the time from its last end to the launch's last end
  // (idle at the tail), each as a share of the span, averaged over the SMs that ran.
  double between_blocks_share = 0, tail_share = 0;
};
// Throws on stamps no kernel could have left (an end before its start, a block not
// stamped at all).
TimelineSummary summarize_block_timeline(const std::vector<BlockStamps>& blocks);

// Column heads and one row per summary, for a table of the launches of one pass: each row
// begins with the launch's first block start and last block end in us after pass_start_ns
// (the pass's first block start, on the global timer), so that the gaps between kernels,
// and kernels that overlap (a second stream), show.
std::string timeline_summary_header();
std::string timeline_summary_row(const std::string& label, const TimelineSummary& summary,
                                 uint64_t pass_start_ns);

}  // namespace ham::cuda

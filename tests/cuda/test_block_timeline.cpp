// The summary of a launch's block stamps (cuda/block_timeline.h) on hand-made stamps whose
// answers are worked out below (CPU test); the kernels' own stamps are checked against
// their tiles in tests/nn/test_routed_attention.cpp.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/block_timeline.h"
#include "tests/error_testing.h"

namespace ham::cuda {
namespace {

// Stamps with the SM clock at exactly 2 cycles a ns (start_ns = start / 2).
BlockStamps block(uint32_t sm, uint64_t start, uint64_t copies_issued, uint64_t first_tile,
                  uint64_t tiles_done, uint64_t end, uint32_t tiles) {
  return {start, copies_issued, first_tile, tiles_done, end, start / 2, end / 2, sm, tiles};
}

// Every block takes 400 + 250 tiles cycles (prologue 200, epilogue 200 where it has tiles;
// A issues its first copies 80 cycles after its start, B 100, C 50, D never):
//   SM 0: A [1000, 2400] 4 tiles, D [1100, 1500] no tile (two resident), B [2600, 3500]
//         2 tiles, after 200 cycles (100 ns) with none;
//   SM 1: C [1000, 1400] no tile, then idle to the launch's end.
// The span is 500 .. 1750 ns = 1.25 us.
std::vector<BlockStamps> hand_made_launch() {
  return {block(0, 1000, 1080, 1200, 2200, 2400, 4), block(0, 2600, 2700, 2800, 3300, 3500, 2),
          block(1, 1000, 1050, 0, 1000, 1400, 0), block(0, 1100, 0, 0, 1100, 1500, 0)};
}

TEST(BlockTimeline, SummaryOfHandMadeStamps) {
  const TimelineSummary s = summarize_block_timeline(hand_made_launch());
  EXPECT_EQ(s.blocks, 4);
  EXPECT_EQ(s.working_blocks, 2);
  EXPECT_EQ(s.tiles, 6);
  EXPECT_EQ(s.sms, 2);
  EXPECT_EQ(s.most_resident, 2);
  EXPECT_DOUBLE_EQ(s.cycles_per_ns, 2.0);
  EXPECT_DOUBLE_EQ(s.span_us, 1.25);
  EXPECT_EQ(s.first_start_ns, 500u);
  EXPECT_EQ(s.last_end_ns, 1750u);
  // Working blocks A and B: 200 cycles = 0.1 us before the first tile and after the last,
  // 250 cycles = 0.125 us a tile; blocks of 0.7 and 0.45 us.
  EXPECT_DOUBLE_EQ(s.prologue_us.median, 0.1);
  EXPECT_DOUBLE_EQ(s.epilogue_us.p90, 0.1);
  EXPECT_DOUBLE_EQ(s.tile_us.p10, 0.125);
  EXPECT_DOUBLE_EQ(s.block_us.p10, 0.45);
  EXPECT_DOUBLE_EQ(s.block_us.p90, 0.7);
  // Of the prologue, the working blocks' copies went out after 0.04 and 0.05 us (C's, with
  // no tile, count for nothing).
  EXPECT_DOUBLE_EQ(s.issue_us.p10, 0.04);
  EXPECT_DOUBLE_EQ(s.issue_us.p90, 0.05);
  // The line through all four blocks: 400 cycles fixed, 250 a tile.
  EXPECT_NEAR(s.fixed_us, 0.2, 1e-12);
  EXPECT_NEAR(s.tile_fit_us, 0.125, 1e-12);
  // SM 0: 100 ns between blocks, no tail; SM 1: none between, 1050 ns of tail.
  EXPECT_NEAR(s.between_blocks_share, (0.1 / 1.25 + 0) / 2, 1e-12);
  EXPECT_NEAR(s.tail_share, (0 + 1.05 / 1.25) / 2, 1e-12);
}

// The launch's start and end after the pass's first start: the two numbers after the label.
std::pair<double, double> window_of(const std::string& row, const std::string& label) {
  std::istringstream fields(row.substr(label.size()));
  double from = 0, to = 0;
  fields >> from >> to;
  return {from, to};
}

TEST(BlockTimeline, TableRowNamesTheLaunch) {
  const std::string label = "forward_wgmma<64, 64, 1>";
  const TimelineSummary summary = summarize_block_timeline(hand_made_launch());
  const std::string row = timeline_summary_row(label, summary, 300);
  EXPECT_EQ(row.rfind(label, 0), 0u) << row;
  // Its blocks run from 500 to 1750 ns: 0.2 and 1.45 us after a pass start at 300 ns, and
  // from before a pass start at 700 ns (another launch of the pass began first).
  EXPECT_NEAR(window_of(row, label).first, 0.2, 1e-9) << row;
  EXPECT_NEAR(window_of(row, label).second, 1.4, 1e-9) << row;  // 1.45 at one decimal
  EXPECT_NEAR(window_of(timeline_summary_row(label, summary, 700), label).first, -0.2, 1e-9);
  EXPECT_NE(row.find(" 1.2 "), std::string::npos) << row;  // the span, 0.1 us
  EXPECT_EQ(row.substr(row.size() - 10), "0.04  0.42") << row;  // gaps and tail
  EXPECT_EQ(timeline_summary_header().rfind("launch", 0), 0u);
  const KernelName name{"backward_dq_wgmma", {128, 128, 1, 32}, 4};
  EXPECT_EQ(name.text(), "backward_dq_wgmma<128, 128, 1, 32>");
  const KernelName from_records{"backward_dq_wgmma", {128, 128, 1, 32, 1}, 5};
  EXPECT_EQ(from_records.text(), "backward_dq_wgmma<128, 128, 1, 32, 1>");
  EXPECT_EQ((KernelName{"plain", {}, 0}).text(), "plain");
}

TEST(BlockTimeline, StampsNoKernelLeavesAreErrors) {
  std::vector<BlockStamps> unstamped = hand_made_launch();
  unstamped[2] = BlockStamps{};
  testing::expect_error([&] { summarize_block_timeline(unstamped); },
                        {"block timeline", "block 2", "no start or end"});
  std::vector<BlockStamps> backwards = hand_made_launch();
  backwards[1].end = backwards[1].start - 1;
  testing::expect_error([&] { summarize_block_timeline(backwards); },
                        {"block timeline", "block 1", "ends before it starts"});
  std::vector<BlockStamps> tiles_first = hand_made_launch();
  tiles_first[0].first_tile = tiles_first[0].tiles_done + 1;
  testing::expect_error([&] { summarize_block_timeline(tiles_first); },
                        {"block timeline", "block 0", "out of order"});
  std::vector<BlockStamps> copies_after_tile = hand_made_launch();
  copies_after_tile[1].copies_issued = copies_after_tile[1].first_tile + 1;
  testing::expect_error([&] { summarize_block_timeline(copies_after_tile); },
                        {"block timeline", "block 1", "first copies out of order"});
  std::vector<BlockStamps> copies_before_start = hand_made_launch();
  copies_before_start[2].copies_issued = copies_before_start[2].start - 1;
  testing::expect_error([&] { summarize_block_timeline(copies_before_start); },
                        {"block timeline", "block 2", "first copies out of order"});
  EXPECT_EQ(summarize_block_timeline({}).blocks, 0);
}

}  // namespace
}  // namespace ham::cuda

// The summary of a launch's block stamps (cuda/block_timeline.h): plain C++, built in every
// configuration (ham_cuda_host), so that it is tested on hand-made stamps without a GPU.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda/block_timeline.h"

namespace ham::cuda {

std::string KernelName::text() const {
  std::string name = base;
  for (int i = 0; i < count; ++i) {
    name += (i == 0 ? "<" : ", ") + std::to_string(arguments[i]);
  }
  return count > 0 ? name + ">" : name;
}

namespace {

Quantiles quantiles_of(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  auto at = [&](double q) { return values[size_t(q * double(values.size() - 1) + 0.5)]; };
  return {at(0.1), at(0.5), at(0.9)};
}

}  // namespace

TimelineSummary summarize_block_timeline(const std::vector<BlockStamps>& blocks) {
  TimelineSummary summary;
  summary.blocks = int64_t(blocks.size());
  if (blocks.empty()) return summary;
  uint64_t first_ns = UINT64_MAX, last_ns = 0;
  double cycles = 0, ns = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockStamps& s = blocks[i];
    HAM_CHECK(s.start != 0 && s.end != 0 && s.start_ns != 0 && s.end_ns != 0,
              "block timeline: block ", i, " has no start or end stamp");
    HAM_CHECK(s.end >= s.start && s.end_ns >= s.start_ns, "block timeline: block ", i,
              " ends before it starts");
    HAM_CHECK(s.tiles == 0 || (s.first_tile >= s.start && s.tiles_done >= s.first_tile &&
                               s.end >= s.tiles_done),
              "block timeline: block ", i, " has its tile stamps out of order");
    HAM_CHECK(s.copies_issued == 0 ||
                  (s.copies_issued >= s.start && s.copies_issued <= s.end &&
                   (s.tiles == 0 || s.copies_issued <= s.first_tile)),
              "block timeline: block ", i, " issued its first copies out of order");
    first_ns = std::min(first_ns, s.start_ns);
    last_ns = std::max(last_ns, s.end_ns);
    cycles += double(s.end - s.start);
    ns += double(s.end_ns - s.start_ns);
    summary.tiles += s.tiles;
  }
  // Both clocks over every block; where the global timer is too coarse to time one block,
  // the sums still agree.
  summary.cycles_per_ns = ns > 0 ? cycles / ns : 1.0;
  const double us_per_cycle = 1e-3 / summary.cycles_per_ns;
  summary.span_us = double(last_ns - first_ns) * 1e-3;
  summary.first_start_ns = first_ns;
  summary.last_end_ns = last_ns;

  std::vector<double> prologue, tile, epilogue, block, issue;
  // Least squares of a block's cycles on its tiles, over all blocks.
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  std::map<uint32_t, std::vector<const BlockStamps*>> by_sm;
  for (const BlockStamps& s : blocks) {
    const double x = s.tiles, y = double(s.end - s.start);
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
    by_sm[s.sm].push_back(&s);
    if (s.tiles == 0) continue;
    ++summary.working_blocks;
    prologue.push_back(double(s.first_tile - s.start) * us_per_cycle);
    tile.push_back(double(s.tiles_done - s.first_tile) * us_per_cycle / s.tiles);
    epilogue.push_back(double(s.end - s.tiles_done) * us_per_cycle);
    block.push_back(y * us_per_cycle);
    if (s.copies_issued != 0) issue.push_back(double(s.copies_issued - s.start) * us_per_cycle);
  }
  summary.prologue_us = quantiles_of(prologue);
  summary.tile_us = quantiles_of(tile);
  summary.epilogue_us = quantiles_of(epilogue);
  summary.block_us = quantiles_of(block);
  summary.issue_us = quantiles_of(issue);
  const double denominator = n * sxx - sx * sx;
  if (denominator > 0) {
    const double slope = (n * sxy - sx * sy) / denominator;
    summary.tile_fit_us = slope * us_per_cycle;
    summary.fixed_us = (sy - slope * sx) / n * us_per_cycle;
  } else {
    summary.fixed_us = sy / n * us_per_cycle;  // every block visited as many tiles
  }

  // Per SM (its own cycle counter): blocks resident at once, the time between them, and
  // the tail after its last block (global timer).
  summary.sms = int(by_sm.size());
  const double span_ns = double(last_ns - first_ns);
  double between = 0, tail = 0;
  for (auto& [sm, on_sm] : by_sm) {
    std::vector<std::pair<uint64_t, int>> edges;  // (time, +1 start / -1 end), ends first
    uint64_t sm_last_ns = 0;
    for (const BlockStamps* s : on_sm) {
      edges.push_back({s->start, +1});
      edges.push_back({s->end, -1});
      sm_last_ns = std::max(sm_last_ns, s->end_ns);
    }
    std::sort(edges.begin(), edges.end());
    int resident = 0;
    uint64_t idle_since = 0, idle = 0;
    for (const auto& [time, step] : edges) {
      if (resident == 0 && step > 0 && idle_since != 0) idle += time - idle_since;
      resident += step;
      summary.most_resident = std::max(summary.most_resident, resident);
      if (resident == 0) idle_since = time;
    }
    if (span_ns > 0) {
      between += double(idle) / summary.cycles_per_ns / span_ns;
      tail += double(last_ns - sm_last_ns) / span_ns;
    }
  }
  summary.between_blocks_share = between / double(summary.sms);
  summary.tail_share = tail / double(summary.sms);
  return summary;
}

std::string timeline_summary_header() {
  char text[512];
  std::snprintf(text, sizeof text,
                "%-44s %8s %8s %6s %6s %7s %4s %3s %8s  %-17s %-17s %-17s %-17s %-17s %7s %7s "
                "%5s %5s",
                "launch", "from us", "to us", "blocks", "work", "tiles", "SMs", "res", "span us",
                "prologue us", "of it, issue us", "tile us", "epilogue us", "block us", "fixed",
                "a tile", "gaps", "tail");
  return text;
}

std::string timeline_summary_row(const std::string& label, const TimelineSummary& s,
                                 uint64_t pass_start_ns) {
  auto spread = [](const Quantiles& q) {
    char text[64];
    std::snprintf(text, sizeof text, "%5.2f %5.2f %5.2f", q.p10, q.median, q.p90);
    return std::string(text);
  };
  // Signed: a launch's first block may start before pass_start_ns when that is not the
  // pass's earliest.
  auto after = [&](uint64_t ns) { return double(int64_t(ns - pass_start_ns)) * 1e-3; };
  char text[512];
  std::snprintf(text, sizeof text,
                "%-44s %8.1f %8.1f %6lld %6lld %7lld %4d %3d %8.1f  %-17s %-17s %-17s %-17s "
                "%-17s %7.2f %7.2f %5.2f %5.2f",
                label.c_str(), after(s.first_start_ns), after(s.last_end_ns),
                (long long)s.blocks, (long long)s.working_blocks, (long long)s.tiles, s.sms,
                s.most_resident, s.span_us, spread(s.prologue_us).c_str(),
                spread(s.issue_us).c_str(), spread(s.tile_us).c_str(),
                spread(s.epilogue_us).c_str(), spread(s.block_us).c_str(), s.fixed_us,
                s.tile_fit_us, s.between_blocks_share, s.tail_share);
  return text;
}

}  // namespace ham::cuda

// The SIMT emulator's racecheck (racecheck.h): a history per byte of shared memory, and a
// clock that barriers and __syncwarp advance.
#include "cuda/emulator/racecheck.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace ham::cuda::emulator {

namespace {
constexpr int kWarpSize = 32;
bool turned_on = false;  // set before main, by the instrumented code's constructors
}  // namespace

void turn_racecheck_on() { turned_on = true; }
bool racecheck_on() { return turned_on; }

uint32_t SharedMemoryRacecheck::tick() {
  // Long before the clock wraps, every history is forgotten (all of it is older than any
  // block that runs after this one starts).
  if (clock_ >= std::numeric_limits<uint32_t>::max() - 2) {
    std::fill(dynamic_history_.begin(), dynamic_history_.end(), ByteHistory{});
    for (auto& [variable, history] : static_history_) {
      std::fill(history.begin(), history.end(), ByteHistory{});
    }
    clock_ = 0;
    block_start_ = block_epoch_ = 0;
    std::fill(warp_epoch_.begin(), warp_epoch_.end(), 0u);
  }
  return ++clock_;
}

void SharedMemoryRacecheck::begin_block(const void* dynamic, size_t dynamic_bytes, int threads) {
  block_start_ = block_epoch_ = tick();
  warp_epoch_.assign(size_t((threads + kWarpSize - 1) / kWarpSize), 0u);
  if (dynamic_history_.size() < dynamic_bytes) dynamic_history_.resize(dynamic_bytes);
  regions_.clear();
  if (dynamic_bytes > 0) {
    regions_.push_back(
        {static_cast<const char*>(dynamic), dynamic_bytes, &dynamic_history_, nullptr});
  }
}

void SharedMemoryRacecheck::add_static(const void* variable, size_t bytes, const char* name) {
  auto it = std::find_if(static_history_.begin(), static_history_.end(),
                         [&](const auto& entry) { return entry.first == variable; });
  if (it == static_history_.end()) {
    static_history_.emplace_back(variable, std::vector<ByteHistory>(bytes));
    it = static_history_.end() - 1;
  } else if (it->second.size() < bytes) {
    it->second.resize(bytes);
  }
  regions_.push_back({static_cast<const char*>(variable), bytes, &it->second, name});
}

void SharedMemoryRacecheck::barrier() { block_epoch_ = tick(); }

void SharedMemoryRacecheck::warp_sync(int warp) { warp_epoch_.at(size_t(warp)) = tick(); }

const SharedMemoryRacecheck::Region* SharedMemoryRacecheck::find(const void* address) const {
  const char* at = static_cast<const char*>(address);
  for (const Region& r : regions_) {
    if (at >= r.begin && at < r.begin + r.bytes) return &r;
  }
  return nullptr;
}

bool SharedMemoryRacecheck::ordered(int earlier, uint32_t clock, int thread) const {
  if (clock < block_epoch_ || earlier == thread) return true;
  const int warp = thread / kWarpSize;
  return earlier / kWarpSize == warp && clock < warp_epoch_[size_t(warp)];
}

std::string SharedMemoryRacecheck::race(const char* what_now, int thread, const void* pc,
                                        const char* what_then, int earlier,
                                        const void* earlier_pc, const Region& region,
                                        size_t offset, const char* why) const {
  auto name = [&](int t) {
    return thread_name_ ? thread_name_(t, name_context_) : "thread " + std::to_string(t);
  };
  const std::string byte =
      region.name ? detail::concat("byte ", offset, " of the static shared variable ", region.name)
                  : detail::concat("dynamic shared byte ", offset);
  return detail::concat("shared memory race: ", name(thread), " ", what_now, " ", byte, " at ",
                        describe_code_address(pc), ", which ", name(earlier), " ", what_then,
                        " at ", describe_code_address(earlier_pc), ", ", why);
}

std::string SharedMemoryRacecheck::access(int thread, const void* address, size_t bytes,
                                          SharedAccess kind, const void* pc, bool in_flight) {
  const Region* region = find(address);
  if (!region) return {};
  const size_t first = size_t(static_cast<const char*>(address) - region->begin);
  if (first + bytes > region->bytes) {  // returned, not thrown: the hooks may not throw
    return detail::concat("a shared memory access of ", bytes, " bytes at byte ", first,
                          " runs past the ", region->bytes, " bytes of ",
                          region->name ? region->name : "the dynamic shared memory");
  }
  ByteHistory* history = region->history->data() + first;
  const auto me = uint16_t(thread);
  for (size_t i = 0; i < bytes; ++i) {
    ByteHistory& h = history[i];
    if (h.write_in_flight && h.write_clock >= block_start_) {
      return race(kind == SharedAccess::Read ? "reads" : "writes", thread, pc,
                  "is still copying into with cp.async", h.writer, h.write_pc, *region, first + i,
                  "which no cp.async.wait_group has completed yet");
    }
    if (!ordered(h.writer, h.write_clock, thread)) {
      return race(kind == SharedAccess::Read ? "reads" : "writes", thread, pc, "wrote",
                  h.writer, h.write_pc, *region, first + i);
    }
    if (kind == SharedAccess::Read) {
      // Keep two readers: this one in a slot of its own thread or a stale one; else in the
      // second, where two readers of one warp would hide one of another.
      int slot = -1;
      for (int s = 0; s < 2 && slot < 0; ++s) {
        if (h.reader[s] == me || h.read_clock[s] < block_epoch_) slot = s;
      }
      if (slot < 0 && h.reader[0] / kWarpSize == h.reader[1] / kWarpSize &&
          h.reader[0] / kWarpSize != thread / kWarpSize) {
        slot = 1;
      }
      if (slot >= 0) {
        h.reader[slot] = me;
        h.read_clock[slot] = clock_;
        h.read_pc[slot] = pc;
      }
      continue;
    }
    for (int s = 0; s < 2; ++s) {
      if (!ordered(h.reader[s], h.read_clock[s], thread)) {
        return race("writes", thread, pc, "read", h.reader[s], h.read_pc[s], *region, first + i);
      }
    }
    h.writer = me;
    h.write_clock = clock_;
    h.write_pc = pc;
    h.write_in_flight = in_flight;
    h.read_clock[0] = h.read_clock[1] = 0;
  }
  return {};
}

std::string SharedMemoryRacecheck::async_copy_issued(int thread, const void* destination,
                                                     const void* pc) {
  return access(thread, destination, 16, SharedAccess::Write, pc, /*in_flight=*/true);
}

void SharedMemoryRacecheck::async_copy_completed(int thread, const void* destination) {
  const Region* region = find(destination);
  if (!region) return;
  ByteHistory* history =
      region->history->data() + (static_cast<const char*>(destination) - region->begin);
  for (int i = 0; i < 16; ++i) {
    ByteHistory& h = history[i];
    h.write_in_flight = false;
    h.writer = uint16_t(thread);
    h.write_clock = clock_;
  }
}

std::string describe_code_address(const void* pc) {
  if (!pc) return "an unknown place";
  Dl_info info{};
  if (!dladdr(pc, &info) || !info.dli_fname) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", pc);
    return text;
  }
  // The call's own address is the byte before the return address the hook was given.
  const auto offset = uintptr_t(pc) - uintptr_t(info.dli_fbase) - 1;
  char command[4200];
  std::snprintf(command, sizeof command, "addr2line -C -f -i -e '%s' 0x%zx 2>/dev/null",
                info.dli_fname, size_t(offset));
  std::string lines;
  if (std::strchr(info.dli_fname, '\'') == nullptr) {
    if (FILE* pipe = popen(command, "r")) {
      std::array<char, 512> buffer{};
      while (std::fgets(buffer.data(), int(buffer.size()), pipe)) lines += buffer.data();
      pclose(pipe);
    }
  }
  // addr2line -f -i: function, file:line, then the functions it was inlined into; the
  // first two name the innermost code.
  std::string function, where;
  if (!lines.empty()) {
    const size_t end_of_function = lines.find('\n');
    function = lines.substr(0, end_of_function);
    if (end_of_function != std::string::npos) {
      where = lines.substr(end_of_function + 1, lines.find('\n', end_of_function + 1) -
                                                    end_of_function - 1);
    }
  }
  char fallback[64];
  std::snprintf(fallback, sizeof fallback, "+0x%zx", size_t(offset));
  const std::string binary = std::string(info.dli_fname) + fallback;
  if (function.empty() || function == "??") return binary;
  if (where.empty() || where.rfind("??", 0) == 0) return function + " (" + binary + ")";
  return function + " (" + where + ")";
}

}  // namespace ham::cuda::emulator

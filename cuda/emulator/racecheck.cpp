// The SIMT emulator's racecheck (racecheck.h): a history per byte of shared and device
// memory, and a clock that barriers and __syncwarp advance.
#include "cuda/emulator/racecheck.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

#include "core/error.h"

namespace ham::cuda::emulator {

namespace {
constexpr int kWarpSize = 32;
bool turned_on = false;  // set before main, by the instrumented code's constructors
}  // namespace

void turn_racecheck_on() { turned_on = true; }
bool racecheck_on() { return turned_on; }

uint32_t Racecheck::tick() {
  // Long before the clock wraps, every history is forgotten (all of it is older than any
  // block that runs after this one starts; so are the running launch's device memory
  // histories, whose races with its earlier blocks may then be missed, once in 2^32 ticks).
  if (clock_ >= std::numeric_limits<uint32_t>::max() - 2) {
    std::fill(dynamic_history_.begin(), dynamic_history_.end(), ByteHistory{});
    for (auto& [variable, history] : static_history_) {
      std::fill(history.begin(), history.end(), ByteHistory{});
    }
    forget_device_histories();
    spare_pages_.clear();  // their clocks would be newer than the next launch's
    // The running launch and block go on from clock 1, after every history (all 0 now);
    // the last launch stays kept (the running one, whose race messages read it).
    if (!launches_.empty()) launches_.erase(launches_.begin(), launches_.end() - 1);
    for (EarlierLaunch& running : launches_) running.start = 1;
    clock_ = launch_start_ = block_start_ = block_epoch_ = ordered_below_ = 1;
    std::fill(block_starts_.begin(), block_starts_.end(), 1u);
    std::fill(warp_epoch_.begin(), warp_epoch_.end(), 0u);
  }
  return ++clock_;
}

void Racecheck::forget_device_histories() {
  for (auto& [number, page] : pages_) spare_pages_.push_back(std::move(page));
  pages_.clear();
  last_page_ = nullptr;
}

namespace {
// HAM_EMULATOR_RACECHECK_MEMORY: all (the default) or shared, which leaves device memory
// out. Its histories take 36 bytes for each byte a launch touches: the gated delta rule's
// backward at the paper's 4K tokens reached 23.3 GiB.
bool device_memory_checked() {
  const char* value = std::getenv("HAM_EMULATOR_RACECHECK_MEMORY");
  if (!value || !*value || std::string(value) == "all") return true;
  if (std::string(value) == "shared") return false;
  HAM_FAIL("HAM_EMULATOR_RACECHECK_MEMORY=", value, ": expected all or shared");
}
}  // namespace

void Racecheck::set_stream_work(StreamWork work) {
  next_work_ = std::move(work);
  next_work_set_ = true;
}

void Racecheck::begin_launch(std::vector<std::pair<const char*, size_t>> allocations,
                             const char* kernel, bool dependent) {
  launch_start_ = tick();
  StreamWork work = next_work_set_ ? std::move(next_work_) : StreamWork{};
  next_work_set_ = false;
  // Where every later work is ordered after every launch kept, their histories are
  // forgotten (all at once: the pages hold them together).
  bool after_all = true, all_later_after_all = true;
  for (EarlierLaunch& earlier : launches_) {
    earlier.ordered = work.stream == 0 || work.ordered_after(earlier.work);
    // A dependent launch may start once the work ahead of it on its stream has let it (a
    // kernel's threads do so after their own wait, simt.h), before that work ends.
    earlier.ordered_after_wait = dependent && work.stream != 0 &&
                                 earlier.work.stream == work.stream &&
                                 earlier.work.number + 1 == work.number;
    if (earlier.ordered_after_wait) earlier.ordered = false;
    after_all = after_all && earlier.ordered;
    all_later_after_all = all_later_after_all && !earlier.ordered_after_wait &&
                          (work.stream == 0 || StreamWork::covers(work.all_later_after,
                                                                  earlier.work));
  }
  if (all_later_after_all) {
    forget_device_histories();
    launches_.clear();
  }
  if (after_all) {
    ordered_below_ = launch_start_;
  } else {
    ordered_below_ = std::find_if(launches_.begin(), launches_.end(), [](const auto& e) {
                       return !e.ordered;
                     })->start;
  }
  launches_.push_back({launch_start_, std::move(work), kernel, false, false});
  allocations_.clear();
  if (device_memory_checked()) {
    for (const auto& [begin, bytes] : allocations) {
      allocations_.push_back({begin, bytes, nullptr, nullptr});
    }
  }
  last_allocation_ = nullptr;
  block_starts_.clear();
  block_index_.clear();
}

std::string Racecheck::work_accesses(std::vector<std::pair<const char*, size_t>> allocations,
                                     const char* what, const std::vector<WorkAccess>& accesses) {
  begin_launch(std::move(allocations), what);
  begin_block(nullptr, 0, 1, {0, 0, 0});
  launches_.back().threadless = true;
  const uint32_t code = code_id(what, /*name=*/true);
  for (const WorkAccess& a : accesses) {
    std::string race = access_by_code(0, a.begin, a.bytes, a.kind, code, false);
    if (!race.empty()) return race;
  }
  return {};
}

const Racecheck::EarlierLaunch* Racecheck::earlier_launch(uint32_t clock) const {
  const auto after =
      std::upper_bound(launches_.begin(), launches_.end(), clock,
                       [](uint32_t c, const EarlierLaunch& e) { return c < e.start; });
  return after == launches_.begin() ? nullptr : &*(after - 1);
}

bool Racecheck::earlier_launch_ordered(uint32_t clock, int thread) const {
  if (clock < ordered_below_) return true;
  const EarlierLaunch* earlier = earlier_launch(clock);
  if (earlier && earlier->ordered_after_wait) {
    return thread >= 0 && size_t(thread) < waited_.size() && waited_[size_t(thread)];
  }
  return !earlier || earlier->ordered;
}

void Racecheck::grid_dependency_waited(int thread) {
  if (size_t(thread) < waited_.size()) waited_[size_t(thread)] = true;
}

void Racecheck::begin_block(const void* dynamic, size_t dynamic_bytes, int threads,
                            std::array<unsigned, 3> block_index) {
  block_start_ = block_epoch_ = tick();
  block_starts_.push_back(block_start_);
  block_index_.push_back(block_index);
  warp_epoch_.assign(size_t((threads + kWarpSize - 1) / kWarpSize), 0u);
  waited_.assign(size_t(threads), false);
  if (dynamic_history_.size() < dynamic_bytes) dynamic_history_.resize(dynamic_bytes);
  regions_.clear();
  if (dynamic_bytes > 0) {
    regions_.push_back(
        {static_cast<const char*>(dynamic), dynamic_bytes, &dynamic_history_, nullptr});
  }
}

void Racecheck::add_static(const void* variable, size_t bytes, const char* name) {
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

void Racecheck::barrier() { block_epoch_ = tick(); }

void Racecheck::warp_sync(int warp) { warp_epoch_.at(size_t(warp)) = tick(); }

const Racecheck::Region* Racecheck::find(const void* address) {
  const char* at = static_cast<const char*>(address);
  for (const Region& r : regions_) {
    if (at >= r.begin && at < r.begin + r.bytes) return &r;
  }
  const Region* r = last_allocation_;
  if (r && at >= r->begin && at < r->begin + r->bytes) return r;
  auto after = std::upper_bound(allocations_.begin(), allocations_.end(), at,
                                [](const char* a, const Region& b) { return a < b.begin; });
  if (after == allocations_.begin()) return nullptr;
  r = &*(after - 1);
  if (at >= r->begin + r->bytes) return nullptr;
  return last_allocation_ = r;
}

Racecheck::ByteHistory* Racecheck::device_history(const char* byte) {
  const uintptr_t number = uintptr_t(byte) / kPageBytes;
  if (!last_page_ || number != last_page_number_) {
    std::unique_ptr<ByteHistory[]>& page = pages_[number];
    if (!page) {
      if (spare_pages_.empty()) {
        page = std::make_unique<ByteHistory[]>(kPageBytes);
      } else {
        page = std::move(spare_pages_.back());
        spare_pages_.pop_back();
      }
    }
    last_page_number_ = number;
    last_page_ = page.get();
  }
  return last_page_ + uintptr_t(byte) % kPageBytes;
}

uint32_t Racecheck::code_id(const void* pc, bool name) {
  auto [it, added] = code_ids_.try_emplace(pc, uint32_t(code_.size()));
  if (added) {
    code_.push_back(pc);
    code_is_name_.push_back(name);
  }
  return it->second;
}

std::string Racecheck::describe_code(uint32_t code) const {
  if (code_is_name_[code]) return static_cast<const char*>(code_[code]);
  return describe_code_address(code_[code]);
}

namespace {
// The thread that stands for several: the atomics of more than one, unordered.
constexpr uint16_t kSeveralThreads = std::numeric_limits<uint16_t>::max();
}  // namespace

bool Racecheck::ordered(const Region& region, uint32_t clock, int earlier, int thread,
                        bool several_blocks) const {
  // Shared memory is the block's own; in device memory nothing orders two blocks of a
  // launch, and an earlier launch is ordered before this one as their stream work is.
  if (!region.shared()) {
    if (clock < launch_start_) return earlier_launch_ordered(clock, thread);
    if (clock < block_start_ || several_blocks) return false;
  }
  if (clock < block_epoch_ || earlier == thread) return true;
  const int warp = thread / kWarpSize;
  return earlier / kWarpSize == warp && clock < warp_epoch_[size_t(warp)];
}

std::string Racecheck::thread_name(uint32_t clock, int thread, bool several_blocks,
                                   const Region& region) const {
  if (!region.shared() && clock < launch_start_) {
    const EarlierLaunch* earlier = earlier_launch(clock);
    if (!earlier) return "an earlier launch";
    return detail::concat(earlier->threadless ? "" : "kernel ", earlier->what, " (work ",
                          earlier->work.number, " on ", earlier->work.where, ")");
  }
  if (launches_.back().threadless) return launches_.back().what;
  if (several_blocks) return "threads of several blocks";
  if (thread == kSeveralThreads) return "several threads";
  std::string name =
      thread_name_ ? thread_name_(thread, name_context_) : "thread " + std::to_string(thread);
  if (region.shared()) return name;
  const auto after = std::upper_bound(block_starts_.begin(), block_starts_.end(), clock);
  if (after == block_starts_.begin()) return name;
  const auto& b = block_index_[size_t(after - block_starts_.begin()) - 1];
  return detail::concat(name, " of block (", b[0], ",", b[1], ",", b[2], ")");
}

std::string Racecheck::race(const char* what_now, int thread, uint32_t code,
                            const char* what_then, uint32_t earlier_clock, int earlier,
                            bool several_blocks, uint32_t earlier_code, const Region& region,
                            size_t offset, const std::string& why) const {
  std::string byte;
  if (!region.shared()) {
    byte = detail::concat("byte ", offset, " of a ", region.bytes, "-byte device allocation");
  } else if (region.name) {
    byte = detail::concat("byte ", offset, " of the static shared variable ", region.name);
  } else {
    byte = detail::concat("dynamic shared byte ", offset);
  }
  return detail::concat(region.shared() ? "shared" : "device", " memory race: ",
                        thread_name(clock_, thread, false, region), " ", what_now, " ", byte,
                        " at ", describe_code(code), ", which ",
                        thread_name(earlier_clock, earlier, several_blocks, region), " ",
                        what_then, " at ", describe_code(earlier_code), ", ",
                        why);
}

std::string Racecheck::check_byte(ByteHistory& h, const Region& region, size_t offset,
                                  int thread, MemoryAccess kind, uint32_t code,
                                  bool in_flight) {
  const char* what_now = kind == MemoryAccess::Read    ? "reads"
                         : kind == MemoryAccess::Write ? "writes"
                                                       : "atomically updates";
  // Why an unordered access of `clock` races with this one.
  auto why = [&](uint32_t clock, bool several_blocks) -> std::string {
    if (region.shared() || (clock >= block_start_ && !several_blocks)) {
      return "with no barrier between them";
    }
    if (clock >= launch_start_) return "and nothing orders two blocks of one launch";
    const StreamWork& now = launches_.back().work;
    const EarlierLaunch* earlier = earlier_launch(clock);
    if (earlier && earlier->ordered_after_wait) {
      return detail::concat("before this thread's griddepcontrol.wait: this launch (work ",
                            now.number, " on ", now.where, ") is a dependent one, which "
                            "may start before the work ahead of it ends");
    }
    return detail::concat("and nothing orders that work before this one (work ", now.number,
                          " on ", now.where, "): no wait for an event recorded after it, "
                          "and no synchronization between them");
  };
  if (h.write_in_flight && h.write_clock >= block_start_) {
    return race(what_now, thread, code, "is still copying into with cp.async", h.write_clock,
                h.writer, false, h.write_code, region, offset,
                "which no cp.async.wait_group has completed yet");
  }
  const bool write_ordered =
      ordered(region, h.write_clock, h.writer, thread, h.several_blocks);
  const bool atomics_only = kind == MemoryAccess::Atomic && h.write_atomic;
  if (!write_ordered && !atomics_only) {
    return race(what_now, thread, code, h.write_atomic ? "updated atomically" : "wrote",
                h.write_clock, h.writer, h.several_blocks, h.write_code, region, offset,
                why(h.write_clock, h.several_blocks));
  }
  const auto me = uint16_t(thread);
  if (kind == MemoryAccess::Read) {
    // Keep two readers: this one in a slot of its own thread or a stale one; else in the
    // second, where two readers of one warp would hide one of another. (An earlier block's
    // read is never stale, but one is enough: every later write is another block's.)
    auto stale = [&](int s) {
      if (!region.shared() && h.read_clock[s] < block_start_) {
        return h.read_clock[s] < launch_start_ &&
               earlier_launch_ordered(h.read_clock[s], thread);
      }
      return h.reader[s] == me || h.read_clock[s] < block_epoch_;
    };
    auto this_blocks = [&](int s) { return region.shared() || h.read_clock[s] >= block_start_; };
    int slot = stale(0) ? 0 : stale(1) ? 1 : -1;
    if (slot < 0 && this_blocks(0) && this_blocks(1) &&
        h.reader[0] / kWarpSize == h.reader[1] / kWarpSize &&
        h.reader[0] / kWarpSize != thread / kWarpSize) {
      slot = 1;
    }
    if (slot >= 0) {
      h.reader[slot] = me;
      h.read_clock[slot] = clock_;
      h.read_code[slot] = code;
    }
    return {};
  }
  for (int s = 0; s < 2; ++s) {
    if (!ordered(region, h.read_clock[s], h.reader[s], thread)) {
      return race(what_now, thread, code, "read", h.read_clock[s], h.reader[s], false,
                  h.read_code[s], region, offset, why(h.read_clock[s], false));
    }
  }
  if (atomics_only && !write_ordered) {
    // Atomics of threads no barrier orders: a later plain access must be ordered after
    // all of them, which it is only after a barrier, within one block.
    h.several_blocks = h.several_blocks || (!region.shared() && h.write_clock < block_start_);
    h.writer = kSeveralThreads;
  } else {
    h.several_blocks = false;
    h.writer = me;
  }
  h.write_clock = clock_;
  h.write_code = code;
  h.write_in_flight = in_flight;
  h.write_atomic = kind == MemoryAccess::Atomic;
  h.read_clock[0] = h.read_clock[1] = 0;
  return {};
}

std::string Racecheck::access(int thread, const void* address, size_t bytes, MemoryAccess kind,
                              const void* pc, bool in_flight) {
  return access_by_code(thread, address, bytes, kind, code_id(pc), in_flight);
}

std::string Racecheck::access_by_code(int thread, const void* address, size_t bytes,
                                      MemoryAccess kind, uint32_t code, bool in_flight) {
  const Region* region = find(address);
  if (!region) return {};
  const size_t first = size_t(static_cast<const char*>(address) - region->begin);
  if (first + bytes > region->bytes) {  // returned, not thrown: the hooks may not throw
    return detail::concat(
        region->shared() ? "a shared" : "a device", " memory access of ", bytes,
        " bytes at byte ", first, " runs past the ", region->bytes, " bytes of ",
        !region->shared() ? "its allocation"
        : region->name    ? region->name
                          : "the dynamic shared memory");
  }
  for (size_t i = 0; i < bytes; ++i) {
    ByteHistory& h = region->shared() ? (*region->history)[first + i]
                                      : *device_history(region->begin + first + i);
    std::string race = check_byte(h, *region, first + i, thread, kind, code, in_flight);
    if (!race.empty()) return race;
  }
  return {};
}

std::string Racecheck::async_copy_issued(int thread, const void* destination,
                                         const void* source, const void* pc) {
  if (source) {  // null: zeros land, nothing is read (ignore-src)
    std::string race = access(thread, source, 16, MemoryAccess::Read, pc);
    if (!race.empty()) return race;
  }
  return access(thread, destination, 16, MemoryAccess::Write, pc, /*in_flight=*/true);
}

void Racecheck::async_copy_completed(int thread, const void* destination) {
  const Region* region = find(destination);
  if (!region || !region->shared()) return;
  ByteHistory* history =
      region->history->data() + (static_cast<const char*>(destination) - region->begin);
  for (int i = 0; i < 16; ++i) {
    ByteHistory& h = history[i];
    h.write_in_flight = false;
    h.writer = uint16_t(thread);
    h.write_clock = clock_;
  }
}

namespace {

// What `addr2line -C -f [-i]` prints for byte `offset` of `binary` ("" where it cannot run).
std::string addr2line(const char* binary, size_t offset, bool inlined) {
  if (std::strchr(binary, '\'') != nullptr) return "";
  char command[4200];
  std::snprintf(command, sizeof command, "addr2line -C -f %s -e '%s' 0x%zx 2>/dev/null",
                inlined ? "-i" : "", binary, offset);
  std::string lines;
  if (FILE* pipe = popen(command, "r")) {
    std::array<char, 512> buffer{};
    while (std::fgets(buffer.data(), int(buffer.size()), pipe)) lines += buffer.data();
    pclose(pipe);
  }
  return lines;
}

}  // namespace

std::string function_name_at(const void* function) {
  Dl_info info{};
  if (!function || !dladdr(function, &info) || !info.dli_fname) return "";
  const std::string lines =
      addr2line(info.dli_fname, uintptr_t(function) - uintptr_t(info.dli_fbase), false);
  std::string name = lines.substr(0, lines.find('\n'));
  if (name.empty() || name == "??") return "";
  // "void ns::(anonymous namespace)::kernel<128, 128>(Args<...>)": cut the parameters (the
  // last parenthesis at depth 0), then keep what follows the last "::" outside <> and ().
  int depth = 0;
  for (size_t i = name.size(); i-- > 0;) {
    if (name[i] == ')' || name[i] == '>') ++depth;
    if (name[i] == '(' || name[i] == '<') --depth;
    if (depth == 0 && name[i] == '(') {
      name.resize(i);
      break;
    }
  }
  size_t start = 0;
  depth = 0;
  for (size_t i = 0; i + 1 < name.size(); ++i) {
    if (name[i] == '(' || name[i] == '<') ++depth;
    if (name[i] == ')' || name[i] == '>') --depth;
    if (depth == 0 && name[i] == ':' && name[i + 1] == ':') start = i + 2;
    if (depth == 0 && name[i] == ' ' && start <= i) start = i + 1;  // the return type
  }
  return name.substr(start);
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
  const std::string lines = addr2line(info.dli_fname, size_t(offset), true);
  // addr2line -f -i: function, file:line, then each function it was inlined into with the
  // line of the call. The innermost frame outside the emulator's own headers names the
  // code (an atomic's is the kernel line that calls atomicAdd, not atomicAdd).
  std::vector<std::pair<std::string, std::string>> frames;  // (function, file:line)
  for (size_t at = 0; at < lines.size();) {
    const size_t function_end = std::min(lines.find('\n', at), lines.size());
    const size_t where_end = std::min(lines.find('\n', function_end + 1), lines.size());
    if (function_end >= lines.size()) break;
    frames.emplace_back(lines.substr(at, function_end - at),
                        lines.substr(function_end + 1, where_end - function_end - 1));
    at = where_end + 1;
  }
  auto chosen = std::find_if(frames.begin(), frames.end(), [](const auto& frame) {
    return frame.second.find("/cuda/emulator/") == std::string::npos;
  });
  if (chosen == frames.end()) chosen = frames.begin();
  std::string function, where;
  if (chosen != frames.end()) std::tie(function, where) = *chosen;
  char fallback[64];
  std::snprintf(fallback, sizeof fallback, "+0x%zx", size_t(offset));
  const std::string binary = std::string(info.dli_fname) + fallback;
  if (function.empty() || function == "??") return binary;
  if (where.empty() || where.rfind("??", 0) == 0) return function + " (" + binary + ")";
  return function + " (" + where + ")";
}

}  // namespace ham::cuda::emulator

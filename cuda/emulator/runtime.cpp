// The CUDA runtime API of the SIMT emulator. "Device" memory is host memory filled with 0xff
// bytes when allocated (NaN as floats, -1 as integers), so reading what no kernel or copy
// wrote shows up in a test. Work runs on the calling thread. In the default stream order
// (HAM_EMULATOR_STREAMS=in_order) it runs when issued: every stream is always idle and
// events complete when recorded. The other orders hold one side's work in a queue until
// something must see it (created streams' in `late`, the default stream's in
// `default_late`; StreamOrder in cuda_runtime.h), so a missing wait between streams leaves
// a reader with what was there before, or lets a held writer overwrite what was read.
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda/emulator/racecheck.h"

// A stream's held work (a created stream's, or a device's default stream's), oldest first;
// `issued` numbers each item. Where the racecheck runs, `order` numbers the stream and
// `clock` says how many works of each stream its next work is ordered after (its own so
// far included: StreamWork in racecheck.h).
struct CUstream_st {
  struct Held {
    uint64_t number;
    std::function<void()> work;
  };
  int device = 0;
  unsigned flags = 0;
  int priority = 0;  // cudaStreamCreateWithPriority's, clamped
  bool is_default = false;
  std::deque<Held> held;
  uint64_t issued = 0;
  uint32_t order = 0;
  std::vector<uint64_t> clock;
};

// What one record of an event marks: done once the work before it on its stream is.
struct EventMark {
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point when;
};

struct CUevent_st {
  int device = 0;
  unsigned flags = 0;
  std::shared_ptr<EventMark> mark;  // the latest record's; null before the first
  CUstream_st* stream = nullptr;    // the queue where that record is held, and its number
  uint64_t number = 0;
  std::vector<uint64_t> clock;      // the record's stream's clock at the record (racecheck)
};

namespace ham::cuda::emulator {

namespace {

// What the emulated GPUs report: an H100/H200-like part (132 SMs, 227 KiB of shared memory a
// block can opt into, 48 KiB without), with 16 GiB of emulated memory each.
constexpr int kMultiprocessors = 132;
constexpr int kSharedPerBlock = 48 * 1024;
constexpr int kHopperSharedPerBlockOptin = 227 * 1024;
constexpr int kSharedPerMultiprocessor = 228 * 1024;  // a Hopper SM's, 1 KB reserved per block
constexpr int kThreadsPerMultiprocessor = 2048;
constexpr size_t kMemoryBytes = size_t(16) << 30;
constexpr int kLeastStreamPriority = 0, kGreatestStreamPriority = -5;  // the H100's range

int device_count_from_environment() {
  const char* value = std::getenv("HAM_EMULATED_GPUS");
  if (!value || !*value) return 1;
  char* end = nullptr;
  long n = std::strtol(value, &end, 10);
  HAM_CHECK(end && *end == '\0' && n >= 0 && n <= 64, "HAM_EMULATED_GPUS=", value,
            ": expected a GPU count from 0 to 64");
  return int(n);
}

// The shared memory a block may opt into: the H200's, or HAM_EMULATOR_SHARED_OPTIN_KIB (48 to
// 227) for a smaller part's (an A100's 163, an RTX 4090's 99), so that the fallbacks kernels
// take where their preferred tiles do not fit run in a test.
int shared_per_block_optin() {
  static const int bytes = [] {
    const char* value = std::getenv("HAM_EMULATOR_SHARED_OPTIN_KIB");
    if (!value || !*value) return kHopperSharedPerBlockOptin;
    char* end = nullptr;
    const long kib = std::strtol(value, &end, 10);
    HAM_CHECK(end && *end == '\0' && kib >= 48 && kib <= 227, "HAM_EMULATOR_SHARED_OPTIN_KIB=",
              value, ": expected KiB from 48 to 227");
    return int(kib * 1024);
  }();
  return bytes;
}

int device_count() {
  static const int count = device_count_from_environment();
  return count;
}

// What the runtime knows of one kernel: its shared memory, and the largest launches made of
// it (for HAM_EMULATOR_LAUNCH_LOG). On a GPU the static size is the compiler's; here it is
// the sum of the static shared variables the kernel's blocks have reached so far (one nvcc
// drops as unused counts here too; scripts/kernel_resources.py checks nvcc's numbers).
struct KernelRecord {
  std::map<int, int> max_dynamic;  // by device: its MaxDynamicSharedMemorySize, where set
  std::vector<const void*> statics;
  size_t static_bytes = 0;
  uint64_t most_threads = 0;      // a block, over its launches
  size_t most_dynamic_bytes = 0;  // over its launches
  // How it was launched, a bit for each of kLaunchKinds: on the default stream or a created
  // one, each plain or as a programmatic dependent launch (scripts/schedule_cover.py).
  unsigned launch_kinds = 0;
  LaunchSite first_site{nullptr, nullptr, 0};  // where it was first launched
  // The binary holding the kernel (as dladdr finds it at the first launch), when that
  // binary was last modified (ns since the epoch: a rebuild since makes the offset stale),
  // and the kernel's offset in it.
  std::string binary = "?";
  int64_t binary_modified_ns = 0;
  uintptr_t offset = 0;

  // The attribute on `device`; -1 where never set.
  int attribute(int device) const {
    const auto it = max_dynamic.find(device);
    return it == max_dynamic.end() ? -1 : it->second;
  }

  // The dynamic bytes a launch on `device` may ask for: the attribute, or else what the
  // 48 KiB a block gets without opting in leaves beside the static variables.
  size_t dynamic_limit(int device) const {
    if (attribute(device) >= 0) return size_t(attribute(device));
    return static_bytes < size_t(kSharedPerBlock) ? size_t(kSharedPerBlock) - static_bytes : 0;
  }

  // Why a GPU would refuse a launch on `device` with `dynamic` bytes of dynamic shared
  // memory, or "".
  std::string refusal(size_t dynamic, int device) const {
    using ::ham::detail::concat;
    const int opted_in = attribute(device);
    if (static_bytes > size_t(kSharedPerBlock)) {
      return concat(static_bytes, " bytes of static shared memory, past the ", kSharedPerBlock,
                    " nvcc allows a kernel");
    }
    if (opted_in >= 0 && size_t(opted_in) + static_bytes > size_t(shared_per_block_optin())) {
      return concat("its MaxDynamicSharedMemorySize of ", opted_in, " bytes and its ",
                    static_bytes, " of static shared memory exceed the ",
                    shared_per_block_optin(),
                    " a block may opt into, so cudaFuncSetAttribute fails on a GPU");
    }
    if (dynamic > dynamic_limit(device)) {
      const std::string limit =
          opted_in >= 0
              ? std::string("its MaxDynamicSharedMemorySize")
              : concat("48 KiB less its ", static_bytes, " bytes of static shared memory; past "
                       "that a launch must opt in with cudaFuncSetAttribute");
      return concat(dynamic, " bytes of dynamic shared memory exceed the kernel's limit of ",
                    dynamic_limit(device), " (", limit, "), so a GPU refuses the launch");
    }
    return "";
  }
};

struct State {
  std::mutex mutex;
  std::map<const void*, std::pair<size_t, int>> allocations;  // pointer -> bytes, device
  size_t used[64] = {};
  std::set<cudaStream_t> streams;  // created and not destroyed
  std::map<const void*, KernelRecord> kernels;  // by the kernel's address
};

State& state() {
  static auto* s = new State;
  return *s;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

bool is_default_stream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

bool valid_stream(cudaStream_t stream) {
  if (is_default_stream(stream)) return true;
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().streams.count(stream) > 0;
}

StreamOrder stream_order_from_environment() {
  const char* value = std::getenv("HAM_EMULATOR_STREAMS");
  if (!value || !*value || std::string(value) == "in_order") return StreamOrder::InOrder;
  if (std::string(value) == "late") return StreamOrder::Late;
  if (std::string(value) == "default_late") return StreamOrder::DefaultLate;
  HAM_FAIL("HAM_EMULATOR_STREAMS=", value, ": expected in_order, late or default_late");
}

std::atomic<StreamOrder>& stream_order_setting() {
  static std::atomic<StreamOrder> order{stream_order_from_environment()};
  return order;
}

// The legacy and per-thread default streams (one queue a device: they are one stream here).
bool default_stream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

bool blocking(cudaStream_t created) { return !(created->flags & cudaStreamNonBlocking); }

CUstream_st* default_queue(int device) {
  static auto* queues = [] {
    auto* made = new std::array<CUstream_st, 64>;
    for (size_t i = 0; i < made->size(); ++i) {
      (*made)[i].device = int(i);
      (*made)[i].is_default = true;
    }
    return made;
  }();
  return &(*queues)[size_t(device)];
}

// Where work issued to `stream` waits when it is held.
CUstream_st* queue_of(cudaStream_t stream) {
  return default_stream(stream) ? default_queue(current_device) : stream;
}

// Whether work issued to `stream` is held in the current order.
bool holds(cudaStream_t stream) {
  switch (stream_order_setting().load()) {
    case StreamOrder::InOrder: return false;
    case StreamOrder::Late: return !default_stream(stream);
    case StreamOrder::DefaultLate: return default_stream(stream);
  }
  return false;
}

std::mutex& held_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

// Holds `work` in `queue`; returns its number there.
uint64_t hold(CUstream_st* queue, std::function<void()> work) {
  std::lock_guard<std::mutex> lock(held_mutex());
  queue->held.push_back({++queue->issued, std::move(work)});
  return queue->issued;
}

// Runs `queue`'s held work through item `through`, oldest first, outside the lock (an item
// may run other streams' work it waits for). A failure is reported here, as a GPU reports
// an asynchronous one at the next call that waits for it.
cudaError_t run_held(CUstream_st* queue, uint64_t through) {
  for (;;) {
    std::function<void()> work;
    {
      std::lock_guard<std::mutex> lock(held_mutex());
      if (queue->held.empty() || queue->held.front().number > through) return cudaSuccess;
      work = std::move(queue->held.front().work);
      queue->held.pop_front();
    }
    try {
      work();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "SIMT emulator: work held on a stream failed when it ran: %s\n",
                   e.what());
      return fail(cudaErrorLaunchFailure);
    }
  }
}

cudaError_t run_all_held(CUstream_st* queue) {
  return run_held(queue, std::numeric_limits<uint64_t>::max());
}

// Runs the held work of `device`'s default stream and created streams (all of them, or the
// blocking ones only: those the legacy stream waits for before its own work).
cudaError_t run_device_held(int device, bool blocking_only) {
  std::vector<CUstream_st*> queues;
  if (!blocking_only) queues.push_back(default_queue(device));
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    for (cudaStream_t stream : state().streams) {
      if (stream->device == device && (blocking(stream) || !blocking_only)) {
        queues.push_back(stream);
      }
    }
  }
  cudaError_t status = cudaSuccess;
  for (CUstream_st* queue : queues) {
    const cudaError_t ran = run_all_held(queue);
    if (ran != cudaSuccess) status = ran;
  }
  return status;
}

cudaError_t run_everything_held() {
  cudaError_t status = cudaSuccess;
  for (int device = 0; device < device_count(); ++device) {
    const cudaError_t ran = run_device_held(device, /*blocking_only=*/false);
    if (ran != cudaSuccess) status = ran;
  }
  return status;
}

// Before work that runs now on `stream`, what it waits for that may be held: a blocking
// stream and the legacy stream wait for each other's earlier work.
cudaError_t before_work(cudaStream_t stream) {
  const StreamOrder order = stream_order_setting().load();
  if (order == StreamOrder::Late && default_stream(stream)) {
    return run_device_held(current_device, /*blocking_only=*/true);
  }
  if (order == StreamOrder::DefaultLate && !default_stream(stream) && blocking(stream)) {
    return run_all_held(default_queue(stream->device));
  }
  return cudaSuccess;
}

// The order a GPU gives the streams' work, kept where the racecheck runs (racecheck.h,
// StreamWork): each stream's clock, and each host thread's, which every work the thread
// issues later is ordered after (what the thread has synchronized with; a watchdog that
// sees an event complete orders nothing for the thread that issues the work).
struct WorkOrder {
  std::mutex mutex;
  uint32_t streams = 0;
  std::vector<CUstream_st*> numbered;  // the live queues with an order number
  // The clocks of destroyed streams by device, all and the blocking ones: their work still
  // runs on the GPU, so a synchronization with the device, and the legacy stream (after
  // blocking streams' work), are ordered after it.
  std::map<int, std::vector<uint64_t>> retired, retired_blocking;
};
thread_local std::vector<uint64_t> host_clock;

WorkOrder& work_order() {
  static auto* order = new WorkOrder;
  return *order;
}

void merge(std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size());
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

// With the order locked: numbers `queue`, and orders what it does next after what the host
// has synchronized with and, between the legacy default stream and the blocking streams of
// its device, after each other's work so far.
void order_implicitly(CUstream_st* queue) {
  WorkOrder& order = work_order();
  if (queue->order == 0) {
    queue->order = ++order.streams;
    order.numbered.push_back(queue);
  }
  if (queue->clock.size() <= queue->order) queue->clock.resize(queue->order + 1);
  merge(queue->clock, host_clock);
  if (queue->is_default) merge(queue->clock, order.retired_blocking[queue->device]);
  for (CUstream_st* other : order.numbered) {
    if (other == queue || other->device != queue->device) continue;
    if ((queue->is_default && !other->is_default && blocking(other)) ||
        (other->is_default && !queue->is_default && blocking(queue))) {
      merge(queue->clock, other->clock);
    }
  }
}

// The order of the next work issued to `stream` (racecheck on).
StreamWork next_stream_work(cudaStream_t stream) {
  CUstream_st* queue = queue_of(stream);
  WorkOrder& order = work_order();
  std::lock_guard<std::mutex> lock(order.mutex);
  order_implicitly(queue);
  StreamWork work;
  work.stream = queue->order;
  work.number = ++queue->clock[queue->order];
  work.after = queue->clock;
  // What the next work of every numbered stream is ordered after: at least its clock and
  // the host's (this thread's, taken for every thread's).
  for (size_t i = 0; i < order.numbered.size(); ++i) {
    std::vector<uint64_t> next = order.numbered[i]->clock;
    merge(next, host_clock);
    if (i == 0) {
      work.all_later_after = std::move(next);
      continue;
    }
    next.resize(std::max(next.size(), work.all_later_after.size()));
    work.all_later_after.resize(next.size());
    for (size_t s = 0; s < next.size(); ++s) {
      work.all_later_after[s] = std::min(work.all_later_after[s], next[s]);
    }
  }
  work.where = queue->is_default
                   ? ::ham::detail::concat("the default stream of device ", queue->device)
                   : ::ham::detail::concat("stream ", queue->order, " of device ", queue->device);
  return work;
}

// `work`, to run as the next work of `stream`: the racecheck learns its order first.
std::function<void()> as_stream_work(cudaStream_t stream, std::function<void()> work) {
  if (!racecheck_on()) return work;
  return [order = next_stream_work(stream), work = std::move(work)] {
    racecheck_stream_work(order);
    struct Done {
      ~Done() { racecheck_stream_work_done(); }
    } done;
    work();
  };
}

void order_event_record(cudaEvent_t event, cudaStream_t stream) {
  if (!racecheck_on()) return;
  std::lock_guard<std::mutex> lock(work_order().mutex);
  CUstream_st* queue = queue_of(stream);
  order_implicitly(queue);
  event->clock = queue->clock;
}

void order_event_wait(cudaStream_t stream, cudaEvent_t event) {
  if (!racecheck_on()) return;
  std::lock_guard<std::mutex> lock(work_order().mutex);
  CUstream_st* queue = queue_of(stream);
  order_implicitly(queue);
  merge(queue->clock, event->clock);
}

// The calling host thread has seen the work so far of `queue` complete (null: of every
// stream of `device`; device -1: of every stream).
void host_waits_for(CUstream_st* queue, int device = -1) {
  if (!racecheck_on()) return;
  WorkOrder& order = work_order();
  std::lock_guard<std::mutex> lock(order.mutex);
  if (queue) {
    merge(host_clock, queue->clock);
    return;
  }
  for (CUstream_st* numbered : order.numbered) {
    if (device < 0 || numbered->device == device) merge(host_clock, numbered->clock);
  }
  for (const auto& [retired_on, clock] : order.retired) {
    if (device < 0 || retired_on == device) merge(host_clock, clock);
  }
}

void host_waits_for_event(cudaEvent_t event) {
  if (!racecheck_on()) return;
  std::lock_guard<std::mutex> lock(work_order().mutex);
  merge(host_clock, event->clock);
}

// The racecheck's view of a copy or memset: the ranges it reads and writes.
void check_copy(const char* what, void* dst, const void* src, size_t bytes) {
  if (!racecheck_on()) return;
  racecheck_work_accesses(what, {{src, bytes, MemoryAccess::Read},
                                 {dst, bytes, MemoryAccess::Write}});
}

bool device_memory(const void* p) {
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().allocations.upper_bound(p);
  if (it == state().allocations.begin()) return false;
  --it;
  return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second.first;
}

// A copy on `stream`: held with the stream's other work where both sides are device memory;
// where either is host memory it runs now, after the stream's held work, as a copy from or
// to pageable host memory does not return before its bytes are taken or delivered.
// A copy into host memory has completed when it returns: the host is ordered after it.
cudaError_t issue_copy(cudaStream_t stream, const void* dst, const void* src,
                       std::function<void()> copy) {
  const bool from_device = device_memory(src), to_device = device_memory(dst);
  cudaError_t status = cudaSuccess;
  if (holds(stream) && !(from_device && to_device)) {
    status = run_all_held(queue_of(stream));
    as_stream_work(stream, std::move(copy))();
  } else {
    status = issue(stream, std::move(copy));
  }
  if (from_device && !to_device) host_waits_for(queue_of(stream));
  return status;
}

}  // namespace

std::vector<std::pair<const char*, size_t>> device_allocations() {
  std::lock_guard<std::mutex> lock(state().mutex);
  std::vector<std::pair<const char*, size_t>> all;
  all.reserve(state().allocations.size());
  for (const auto& [p, size_and_device] : state().allocations) {
    all.emplace_back(static_cast<const char*>(p), size_and_device.first);
  }
  return all;
}

cudaError_t set_function_attribute(const void* function, cudaFuncAttribute attribute, int value) {
  if (!function) return fail(cudaErrorInvalidValue);
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    std::lock_guard<std::mutex> lock(state().mutex);
    KernelRecord& kernel = state().kernels[function];
    if (value < 0 || size_t(value) + kernel.static_bytes > size_t(shared_per_block_optin())) {
      return fail(cudaErrorInvalidValue);
    }
    kernel.max_dynamic[current_device] = value;
  }
  return cudaSuccess;
}

cudaError_t get_function_attributes(cudaFuncAttributes* attributes, const void* function) {
  if (!attributes || !function) return fail(cudaErrorInvalidValue);
  *attributes = cudaFuncAttributes{};
  attributes->maxThreadsPerBlock = 1024;
  attributes->ptxVersion = 90;
  attributes->binaryVersion = 90;
  std::lock_guard<std::mutex> lock(state().mutex);
  const KernelRecord& kernel = state().kernels[function];
  attributes->maxDynamicSharedSizeBytes = int(kernel.dynamic_limit(current_device));
  // What its blocks have reached so far: 0 before the kernel's first launch.
  attributes->sharedSizeBytes = kernel.static_bytes;
  return cudaSuccess;
}

cudaError_t max_active_blocks(int* blocks, const void* function, int block_threads,
                              size_t dynamic_shared_bytes) {
  if (!blocks || !function || block_threads <= 0 || block_threads > 1024) {
    return fail(cudaErrorInvalidValue);
  }
  // Threads and shared memory only: the emulator does not know a kernel's registers.
  size_t static_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    static_bytes = state().kernels[function].static_bytes;
  }
  const int by_threads = kThreadsPerMultiprocessor / block_threads;
  const int by_shared =
      int(kSharedPerMultiprocessor / (dynamic_shared_bytes + static_bytes + 1024));
  *blocks = std::min({32, by_threads, by_shared});
  return cudaSuccess;
}

namespace {

std::string to_hex(uintptr_t value) {
  char text[2 + 2 * sizeof(value) + 1];
  std::snprintf(text, sizeof(text), "0x%jx", uintmax_t(value));
  return text;
}

// Fills in where `function` lies: its binary, that binary's modification time and the
// offset of `function` in it.
void locate(const void* function, KernelRecord& kernel) {
  Dl_info where{};
  if (dladdr(function, &where) == 0 || !where.dli_fname) return;
  // dladdr names the main program as it was run, which may be relative to the directory it
  // was run from.
  char absolute[PATH_MAX];
  kernel.binary = ::realpath(where.dli_fname, absolute) ? absolute : where.dli_fname;
  kernel.offset = reinterpret_cast<uintptr_t>(function) -
                  reinterpret_cast<uintptr_t>(where.dli_fbase);
  struct stat status{};
  if (::stat(kernel.binary.c_str(), &status) == 0) {
    kernel.binary_modified_ns = int64_t(status.st_mtim.tv_sec) * 1000000000 +
                                status.st_mtim.tv_nsec;
  }
}

// The launch log's names of KernelRecord::launch_kinds' bits.
constexpr const char* kLaunchKinds[] = {"default_stream", "created_stream",
                                        "default_stream+dependent", "created_stream+dependent"};

// `kinds`' names, comma-separated.
std::string launch_kind_names(unsigned kinds) {
  std::string names;
  for (unsigned bit = 0; bit < std::size(kLaunchKinds); ++bit) {
    if (!(kinds >> bit & 1u)) continue;
    if (!names.empty()) names += ',';
    names += kLaunchKinds[bit];
  }
  return names;
}

int launch_log_descriptor = -1;

// Appends launch_log_text() to HAM_EMULATOR_LAUNCH_LOG at exit, in one write() to a file
// opened O_APPEND, so processes run side by side (ctest -j) do not interleave their lines.
void write_launch_log() {
  const std::string text = launch_log_text();
  if (::write(launch_log_descriptor, text.data(), text.size()) != ssize_t(text.size())) {
    std::fprintf(stderr, "cuda emulator: HAM_EMULATOR_LAUNCH_LOG: writing %zu bytes failed\n",
                 text.size());
  }
  ::close(launch_log_descriptor);
}

// Opens HAM_EMULATOR_LAUNCH_LOG, where set, on the first accepted launch, so a path that
// cannot be written fails the process there, in one line, rather than silently at exit.
// Called with the state locked.
void open_launch_log_once() {
  static const bool opened = [] {
    const char* path = std::getenv("HAM_EMULATOR_LAUNCH_LOG");
    if (!path || !*path) return false;
    launch_log_descriptor = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    HAM_CHECK(launch_log_descriptor >= 0, "HAM_EMULATOR_LAUNCH_LOG=", path,
              ": cannot open for appending: ", std::strerror(errno));
    std::atexit(write_launch_log);
    return true;
  }();
  (void)opened;
}

}  // namespace

std::string launch_log_text() {
  std::string text;
  std::lock_guard<std::mutex> lock(state().mutex);
  for (const auto& [function, kernel] : state().kernels) {
    if (!kernel.first_site.kernel) continue;
    text += ::ham::detail::concat(
        kernel.binary, '\t', kernel.binary_modified_ns, '\t', to_hex(kernel.offset), '\t',
        to_hex(reinterpret_cast<uintptr_t>(function)), '\t', kernel.most_threads, '\t',
        kernel.most_dynamic_bytes, '\t', kernel.static_bytes, '\t', kernel.first_site.kernel,
        '\t', kernel.first_site.file, ':', kernel.first_site.line, '\t',
        launch_kind_names(kernel.launch_kinds), '\n');
  }
  return text;
}

bool accept_launch(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   cudaStream_t stream) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  const bool ok = threads >= 1 && threads <= 1024 && block.z <= 64 && grid.x >= 1 &&
                  grid.y >= 1 && grid.z >= 1 && grid.x <= 2147483647u && grid.y <= 65535 &&
                  grid.z <= 65535 && dynamic_shared_bytes <= size_t(shared_per_block_optin());
  if (!ok) {
    fail(cudaErrorInvalidConfiguration);
    return false;
  }
  if (!valid_stream(stream)) {
    fail(cudaErrorInvalidResourceHandle);
    return false;
  }
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    KernelRecord& kernel = state().kernels[site.function];
    refused = kernel.refusal(dynamic_shared_bytes, site.device);
    if (refused.empty()) {
      if (!kernel.first_site.kernel) {
        kernel.first_site = site;
        locate(site.function, kernel);
      }
      kernel.most_threads = std::max(kernel.most_threads, threads);
      kernel.most_dynamic_bytes = std::max(kernel.most_dynamic_bytes, dynamic_shared_bytes);
      const unsigned kind = (is_default_stream(stream) ? 0u : 1u) + (site.dependent ? 2u : 0u);
      kernel.launch_kinds |= 1u << kind;
      open_launch_log_once();
    }
  }
  HAM_CHECK(refused.empty(), "cuda emulator: kernel ", kernel_name(site), " launched at ",
            site.file, ":", site.line, ": ", refused);
  return true;
}

std::string static_shared_reached(const LaunchSite& site, size_t dynamic_shared_bytes,
                                  const void* variable, size_t bytes) {
  std::lock_guard<std::mutex> lock(state().mutex);
  KernelRecord& kernel = state().kernels[site.function];
  if (std::find(kernel.statics.begin(), kernel.statics.end(), variable) != kernel.statics.end()) {
    return "";
  }
  kernel.statics.push_back(variable);
  kernel.static_bytes += bytes;
  return kernel.refusal(dynamic_shared_bytes, site.device);
}

StreamOrder stream_order() { return stream_order_setting().load(); }

void set_stream_order(StreamOrder order) {
  run_everything_held();
  stream_order_setting().store(order);
}

cudaError_t run_held_work(cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  return run_all_held(queue_of(stream));
}

cudaError_t issue(cudaStream_t stream, std::function<void()> work) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  work = as_stream_work(stream, std::move(work));
  if (holds(stream)) {
    hold(queue_of(stream), std::move(work));
    return cudaSuccess;
  }
  const cudaError_t waited = before_work(stream);
  work();
  return waited;
}

}  // namespace ham::cuda::emulator

using namespace ham::cuda::emulator;

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = device_count();
  if (*count == 0) return fail(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = kSharedPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = kMultiprocessors; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = shared_per_block_optin(); break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "ham SIMT emulator (sm_90)");
  prop->totalGlobalMem = kMemoryBytes;
  prop->sharedMemPerBlock = kSharedPerBlock;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = kMultiprocessors;
  prop->major = 9;
  prop->minor = 0;
  prop->sharedMemPerBlockOptin = shared_per_block_optin();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  const cudaError_t ran = run_device_held(current_device, false);
  host_waits_for(nullptr, current_device);
  return ran;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(state().mutex);
  *total = kMemoryBytes;
  *free = kMemoryBytes - state().used[current_device];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    if (bytes > kMemoryBytes - state().used[current_device]) return fail(cudaErrorMemoryAllocation);
  }
  void* p = ::operator new(bytes, std::align_val_t(256), std::nothrow);
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xff, bytes);
  std::lock_guard<std::mutex> lock(state().mutex);
  state().allocations[p] = {bytes, current_device};
  state().used[current_device] += bytes;
  *ptr = p;
  return cudaSuccess;
}

// As on a GPU, cudaFree waits for all work first: held work may still use the memory.
cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  run_everything_held();
  host_waits_for(nullptr);
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().allocations.find(ptr);
  if (it == state().allocations.end()) return fail(cudaErrorInvalidValue);
  state().used[it->second.second] -= it->second.first;
  state().allocations.erase(it);
  ::operator delete(ptr, std::align_val_t(256));
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src || kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return fail(cudaErrorInvalidValue);
  }
  return issue_copy(nullptr, dst, src, [=] {
    check_copy("cudaMemcpy", dst, src, bytes);
    std::memmove(dst, src, bytes);
  });
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src || kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return fail(cudaErrorInvalidValue);
  }
  return issue_copy(stream, dst, src, [=] {
    check_copy("cudaMemcpyAsync", dst, src, bytes);
    std::memmove(dst, src, bytes);
  });
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (width == 0 || height == 0) return cudaSuccess;
  if (!dst || !src || width > dst_pitch || width > src_pitch || kind < cudaMemcpyHostToHost ||
      kind > cudaMemcpyDefault) {
    return fail(cudaErrorInvalidValue);
  }
  return issue_copy(stream, dst, src, [=] {
    if (racecheck_on()) {
      std::vector<WorkAccess> rows;
      for (size_t row = 0; row < height; ++row) {
        rows.push_back({static_cast<const char*>(src) + row * src_pitch, width,
                        MemoryAccess::Read});
        rows.push_back({static_cast<char*>(dst) + row * dst_pitch, width, MemoryAccess::Write});
      }
      racecheck_work_accesses("cudaMemcpy2DAsync", rows);
    }
    for (size_t row = 0; row < height; ++row) {
      std::memmove(static_cast<char*>(dst) + row * dst_pitch,
                   static_cast<const char*>(src) + row * src_pitch, width);
    }
  });
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!dst) return fail(cudaErrorInvalidValue);
  return issue(nullptr, [=] {
    if (racecheck_on()) racecheck_work_accesses("cudaMemset", {{dst, bytes, MemoryAccess::Write}});
    std::memset(dst, value, bytes);
  });
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!dst) return fail(cudaErrorInvalidValue);
  return issue(stream, [=] {
    if (racecheck_on()) {
      racecheck_work_accesses("cudaMemsetAsync", {{dst, bytes, MemoryAccess::Write}});
    }
    std::memset(dst, value, bytes);
  });
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  return cudaStreamCreateWithPriority(stream, flags, kLeastStreamPriority);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int priority) {
  if (!stream) return fail(cudaErrorInvalidValue);
  *stream = new CUstream_st;
  (*stream)->device = current_device;
  (*stream)->flags = flags;
  (*stream)->priority = std::clamp(priority, kGreatestStreamPriority, kLeastStreamPriority);
  std::lock_guard<std::mutex> lock(state().mutex);
  state().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (!priority) return fail(cudaErrorInvalidValue);
  *priority = default_stream(stream) ? kLeastStreamPriority : stream->priority;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = kLeastStreamPriority;
  if (greatest) *greatest = kGreatestStreamPriority;
  return cudaSuccess;
}

// A stream destroyed with work held on it runs that work first (a GPU finishes it).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (default_stream(stream) || !valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  const cudaError_t ran = run_all_held(stream);
  if (racecheck_on()) {
    WorkOrder& order = work_order();
    std::lock_guard<std::mutex> lock(order.mutex);
    std::erase(order.numbered, stream);
    merge(order.retired[stream->device], stream->clock);
    if (blocking(stream)) merge(order.retired_blocking[stream->device], stream->clock);
  }
  std::lock_guard<std::mutex> lock(state().mutex);
  state().streams.erase(stream);
  delete stream;
  return ran;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  const cudaError_t ran = run_all_held(queue_of(stream));
  host_waits_for(queue_of(stream));
  return ran;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st* queue = queue_of(stream);
  {
    std::lock_guard<std::mutex> lock(held_mutex());
    if (!queue->held.empty()) return cudaErrorNotReady;
  }
  host_waits_for(queue);
  return cudaSuccess;
}

// Later work on `stream` waits for the event's latest record: where `stream`'s work runs
// when issued, the held work before that record runs now; where it is held, when the
// stream gets there.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (!valid_stream(stream) || !event) return fail(cudaErrorInvalidResourceHandle);
  order_event_wait(stream, event);
  const std::shared_ptr<EventMark> mark = event->mark;
  if (!mark || mark->done) return cudaSuccess;
  CUstream_st* source = event->stream;
  const uint64_t through = event->number;
  if (!holds(stream)) return run_held(source, through);
  hold(queue_of(stream), [mark, source, through] {
    // The source's held work through `through` has run where the mark is done (a destroyed
    // stream runs all of its work first).
    if (!mark->done && run_held(source, through) != cudaSuccess) {
      HAM_FAIL("a stream this stream waited for failed");
    }
  });
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (!event) return fail(cudaErrorInvalidValue);
  *event = new CUevent_st;
  (*event)->device = current_device;
  (*event)->flags = flags;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

// Each record makes a new mark (an event re-recorded while an earlier record is held
// leaves that record's waiters waiting for the earlier work only, as on a GPU).
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event || !valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  auto mark = std::make_shared<EventMark>();
  auto complete = [mark] {
    mark->when = std::chrono::steady_clock::now();
    mark->done = true;
  };
  event->mark = mark;
  event->stream = nullptr;
  event->number = 0;
  order_event_record(event, stream);
  if (!holds(stream)) {  // not issue(): a record is no work of its own for the racecheck
    const cudaError_t waited = before_work(stream);
    complete();
    return waited;
  }
  event->stream = queue_of(stream);
  event->number = hold(event->stream, complete);
  return cudaSuccess;
}

// cudaErrorNotReady is an answer, not an error: it is not left for cudaGetLastError.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  if (event->mark && !event->mark->done) return cudaErrorNotReady;
  host_waits_for_event(event);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  const cudaError_t ran = !event->mark || event->mark->done
                              ? cudaSuccess
                              : run_held(event->stream, event->number);
  host_waits_for_event(event);
  return ran;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (!start->mark || !end->mark) return fail(cudaErrorInvalidResourceHandle);
  if (!start->mark->done || !end->mark->done) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->mark->when - start->mark->when).count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

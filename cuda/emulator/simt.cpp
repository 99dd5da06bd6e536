// The SIMT emulator's scheduler: a fiber per CUDA thread, barriers and warp collectives
// (cuda/emulator/simt.h says what is and is not emulated).
#include "cuda/emulator/simt.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/address_sanitizer.h"
#include "cuda/emulator/racecheck.h"

#if !defined(__x86_64__)
#error "the SIMT emulator switches fibers with x86-64 code; port ham_emulator_switch first"
#endif

// switch(save, load): saves the callee-saved registers on the current stack and its
// pointer in *save, then continues on the stack `load` (where an earlier switch saved, or
// a fresh stack made by new_fiber_stack). The System V ABI leaves every other register to
// the caller, so these six and the stack pointer are the whole context.
extern "C" void ham_emulator_switch(void** save, void* load);
// First code a fresh fiber runs: calls r13(r12) and never returns.
extern "C" void ham_emulator_fiber_start();
asm(R"(
  .text
  .globl ham_emulator_switch
  .type ham_emulator_switch, @function
ham_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ham_emulator_switch, .-ham_emulator_switch

  .globl ham_emulator_fiber_start
  .type ham_emulator_fiber_start, @function
ham_emulator_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size ham_emulator_fiber_start, .-ham_emulator_fiber_start
)");

namespace ham::cuda::emulator {

namespace {

constexpr size_t kStackBytes = 256 * 1024;  // per CUDA thread; only touched pages are backed
constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kWarpSize = 32;

// A stack's lowest address and size (what AddressSanitizer is told at each switch).
struct StackBounds {
  const void* bottom = nullptr;
  size_t size = 0;
};

// The launching OS thread's own stack, read once a thread (for the main thread glibc reads
// /proc/self/maps), where AddressSanitizer is to be told; empty elsewhere.
StackBounds launching_thread_stack() {
#if HAM_ADDRESS_SANITIZER
  thread_local const StackBounds bounds = [] {
    pthread_attr_t attr;
    HAM_CHECK(pthread_getattr_np(pthread_self(), &attr) == 0,
              "cuda emulator: cannot read the launching thread's stack");
    void* bottom = nullptr;
    size_t size = 0;
    pthread_attr_getstack(&attr, &bottom, &size);
    pthread_attr_destroy(&attr);
    return StackBounds{bottom, size};
  }();
  return bounds;
#else
  return {};
#endif
}

// One mapping per fiber: a guard page at the bottom, so an overflow faults.
struct FiberStack {
  char* base = nullptr;
  StackBounds usable;  // above the guard page
  FiberStack() {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    HAM_CHECK(p != MAP_FAILED, "cuda emulator: cannot map a ", kStackBytes, "-byte fiber stack");
    base = static_cast<char*>(p);
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    mprotect(base, page, PROT_NONE);
    usable = {base + page, kStackBytes - page};
  }
  ~FiberStack() { munmap(base, kStackBytes); }
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
};

enum class FiberState { Ready, Running, AtBlockBarrier, InWarpCollective, Exited };

struct Fiber {
  void* sp = nullptr;
  StackBounds stack;
  FiberState state = FiberState::Ready;
  ThreadPlace place{};
  int linear = 0;  // thread index within the block
  // What the fiber brought to a barrier or collective, and what it gets back.
  int predicate = 0;
  BarrierCount barrier_count{0, 0};
  WarpCollective kind = WarpCollective::Sync;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int lane_operand = 0, width = kWarpSize;
  WarpCombine combine = nullptr;  // Exchange
  const char* name = nullptr;     // Exchange: the instruction
  // cp.async copies issued and not yet completed, each with its group (the number of
  // groups committed before it was issued).
  struct AsyncCopy {
    void* destination;
    const void* source;  // null: 16 zero bytes land (cp.async's ignore-src)
    int group;
    bool landed;  // at issue (the reverse schedule); else at the wait
  };
  std::vector<AsyncCopy> async_copies;
  int async_groups = 0;
  // wgmmas issued and not yet completed (lane 0 of the issuing warp), with their group.
  struct WgmmaInFlight {
    WgmmaOperandCheck check;
    int group;
  };
  std::vector<WgmmaInFlight> wgmmas_in_flight;
  int wgmma_groups = 0;
  bool waited_for_earlier_grids = false;  // griddepcontrol.wait
};

// Lanes of one warp gathered in one collective that has not completed yet.
struct PendingCollective {
  WarpCollective kind;
  unsigned mask;
  int width;
  unsigned arrived;
  WarpCombine combine;
  const char* name;
};

Schedule schedule_from_environment() {
  const char* value = std::getenv("HAM_EMULATOR_SCHEDULE");
  if (!value || !*value || std::string(value) == "forward") return Schedule::Forward;
  if (std::string(value) == "reverse") return Schedule::Reverse;
  if (std::string(value) == "shuffle") return Schedule::Shuffle;
  HAM_FAIL("HAM_EMULATOR_SCHEDULE=", value, ": expected forward, reverse or shuffle");
}

const char* collective_name(WarpCollective kind) {
  switch (kind) {
    case WarpCollective::Sync: return "__syncwarp";
    case WarpCollective::ShuffleIndex: return "__shfl_sync";
    case WarpCollective::ShuffleUp: return "__shfl_up_sync";
    case WarpCollective::ShuffleDown: return "__shfl_down_sync";
    case WarpCollective::ShuffleXor: return "__shfl_xor_sync";
    case WarpCollective::Ballot: return "__ballot_sync";
    case WarpCollective::Any: return "__any_sync";
    case WarpCollective::All: return "__all_sync";
    case WarpCollective::MatchAny: return "__match_any_sync";
    case WarpCollective::Exchange: return "a warp-wide instruction";
  }
  return "?";
}

const char* collective_name(WarpCollective kind, const char* name) {
  return kind == WarpCollective::Exchange && name ? name : collective_name(kind);
}

// The shared and device memory accesses of this OS thread's kernels (racecheck.h); its clock
// runs on from launch to launch, so what an earlier launch did is older than any later block.
// Null where the racecheck is off (racecheck_on).
Racecheck* racecheck() {
  thread_local Racecheck check;
  return racecheck_on() ? &check : nullptr;
}

std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

// The fibers of one block and their scheduling, on the launching OS thread.
class BlockRunner {
 public:
  BlockRunner(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& body)
      : site_(site), grid_(grid), block_(block), body_(body),
        threads_(int(block.x * block.y * block.z)),
        schedule_(schedule()),
        fibers_(size_t(threads_)),
        shared_(dynamic_shared_bytes),
        async_proxy_view_(dynamic_shared_bytes),
        scheduler_stack_(launching_thread_stack()) {
    while (stacks().size() < size_t(threads_)) stacks().push_back(std::make_unique<FiberStack>());
    pending_.resize(size_t((threads_ + kWarpSize - 1) / kWarpSize));
    exited_.resize(pending_.size());
  }

  void run_block(uint3 block_idx) {
    block_idx_ = block_idx;
    if (!shared_.empty()) std::memset(shared_.data(), 0xff, shared_.size());  // null if empty
    if (Racecheck* check = racecheck()) {
      check->begin_block(shared_.data(), shared_.size(), threads_,
                         {block_idx.x, block_idx.y, block_idx.z});
      check->set_thread_name(&thread_name, this);
    }
    static_shared_filled_.clear();
    async_proxy_view_ = shared_;
    async_proxy_fenced_ = false;
    ready_.clear();
    at_barrier_.clear();
    for (auto& p : pending_) p.clear();
    std::fill(exited_.begin(), exited_.end(), 0u);
    live_ = threads_;
    for (int i = 0; i < threads_; ++i) {
      Fiber& f = fibers_[size_t(i)];
      f = Fiber{};
      f.linear = i;
      f.place.thread_idx = {unsigned(i) % block_.x, (unsigned(i) / block_.x) % block_.y,
                            unsigned(i) / (block_.x * block_.y)};
      f.place.block_idx = block_idx;
      f.place.block_dim = block_;
      f.place.grid_dim = grid_;
      f.sp = fresh_stack(*stacks()[size_t(i)], &f);
      f.stack = stacks()[size_t(i)]->usable;
    }
    std::vector<int> all(static_cast<size_t>(threads_));
    for (int i = 0; i < threads_; ++i) all[size_t(i)] = i;
    make_ready(all);
    try {
      while (live_ > 0) {
        if (ready_.empty()) fail_deadlock();
        Fiber& f = fibers_[size_t(ready_.front())];
        ready_.pop_front();
        run(&f);
        switch_stacks(&scheduler_sp_, f.sp, f.stack);
        run(nullptr);
        if (error_) std::rethrow_exception(error_);
      }
    } catch (...) {
      forget_abandoned_frames();
      throw;
    }
  }

  Fiber& current() { return *current_; }
  // `f` runs next (null: the scheduler does).
  void run(Fiber* f) {
    current_ = f;
    if (f != nullptr) f->state = FiberState::Running;
    running_place = f != nullptr ? &f->place : nullptr;
  }
  const Fiber* current_or_null() const { return current_; }
  const LaunchSite& site() const { return site_; }
  void* shared() { return shared_.data(); }
  const void* async_proxy_view() const { return async_proxy_view_.data(); }
  void async_proxy_fence() { async_proxy_fenced_ = true; }
  size_t shared_size() const { return shared_.size(); }

  // The first thread of the block to reach a static shared variable's declaration fills it
  // with 0xff; the block's other threads, and later calls, find it filled.
  void static_shared(void* variable, size_t bytes, const char* name) {
    if (std::find(static_shared_filled_.begin(), static_shared_filled_.end(), variable) !=
        static_shared_filled_.end()) {
      return;
    }
    static_shared_filled_.push_back(variable);
    std::memset(variable, 0xff, bytes);
    if (Racecheck* check = racecheck()) check->add_static(variable, bytes, name);
    const std::string refused = static_shared_reached(site_, shared_.size(), variable, bytes);
    if (!refused.empty()) fail_in(current(), refused);
  }

  BarrierCount block_barrier(int predicate) {
    Fiber& f = current();
    f.predicate = predicate;
    f.state = FiberState::AtBlockBarrier;
    at_barrier_.push_back(f.linear);
    if (int(at_barrier_.size()) == live_) release_block_barrier();
    yield(f);
    return f.barrier_count;
  }

  uint64_t warp_collective(WarpCollective kind, unsigned mask, uint64_t value, int lane_operand,
                           int width, WarpCombine combine = nullptr, const char* name = nullptr) {
    Fiber& f = current();
    const int lane = f.linear % kWarpSize, warp = f.linear / kWarpSize;
    const int warp_lanes = std::min(kWarpSize, threads_ - warp * kWarpSize);
    const unsigned existing = warp_lanes == kWarpSize ? ~0u : (1u << warp_lanes) - 1u;
    // The checks cost little; their messages are built only on failure.
    auto call = [&] { return std::string(collective_name(kind, name)) + " with mask " + hex(mask); };
    if (!(mask >> lane & 1u)) {
      fail_in(f, call() + " that leaves out the calling lane " + std::to_string(lane));
    }
    if (mask & ~existing) {
      fail_in(f, call() + " naming lanes beyond the " + std::to_string(warp_lanes) +
                     " this warp has");
    }
    if (width <= 0 || width > kWarpSize || (width & (width - 1))) {
      fail_in(f, call() + " and width " + std::to_string(width) + " (a power of two up to 32)");
    }
    if (const unsigned gone = mask & exited_[size_t(warp)]) {
      fail_in(f, call() + " naming lane " + std::to_string(__builtin_ctz(gone)) +
                     ", which has exited");
    }
    f.kind = kind;
    f.mask = mask;
    f.value = value;
    f.lane_operand = lane_operand;
    f.width = width;
    f.combine = combine;
    f.name = name;
    f.state = FiberState::InWarpCollective;
    std::vector<PendingCollective>& pending = pending_[size_t(warp)];
    auto it = std::find_if(pending.begin(), pending.end(),
                           [&](const PendingCollective& p) { return (p.mask & mask) != 0; });
    if (it == pending.end()) {
      pending.push_back({kind, mask, width, 0u, combine, name});
      it = pending.end() - 1;
    } else if (it->kind != kind || it->mask != mask || it->width != width ||
               it->combine != combine) {
      fail_in(f, call() + " while lanes " + hex(it->arrived) + " of its warp wait in " +
                     collective_name(it->kind, it->name) + " with mask " + hex(it->mask) +
                     ": the lanes diverged");
    }
    it->arrived |= 1u << lane;
    if (it->arrived == mask) {
      complete_collective(warp, *it);
      pending.erase(it);
    }
    yield(f);
    return f.result;
  }

  // A fiber's body returned (or threw).
  void exit_fiber(Fiber& f) {
    f.state = FiberState::Exited;
    --live_;
    const int lane = f.linear % kWarpSize, warp = f.linear / kWarpSize;
    exited_[size_t(warp)] |= 1u << lane;
    for (const PendingCollective& p : pending_[size_t(warp)]) {
      if (p.mask >> lane & 1u) {
        fail_in(f, std::string("lane ") + std::to_string(lane) + " exited while lanes " +
                       hex(p.arrived) + " wait for it in " + collective_name(p.kind, p.name) +
                       " with mask " + hex(p.mask));
      }
    }
    if (!at_barrier_.empty() && int(at_barrier_.size()) == live_) release_block_barrier();
    // A copy no wait covered has no point at which it has landed: a kernel waits for all
    // of its own before it ends.
    if (!f.async_copies.empty()) {
      fail_in(f, "ended with " + std::to_string(f.async_copies.size()) +
                     " cp.async copies that no cp.async.wait_group covered");
    }
    if (!f.wgmmas_in_flight.empty()) {
      fail_in(f, "ended with " + std::to_string(f.wgmmas_in_flight.size()) +
                     " wgmma.mma_async that no wgmma.wait_group covered");
    }
    // A grid that ends before the one it depends on would let a launch that depends on it
    // in turn start before that one ends.
    if (site_.dependent && !f.waited_for_earlier_grids) {
      fail_in(f, "ended without griddepcontrol.wait in a dependent launch "
                 "(HAM_LAUNCH_DEPENDENT), which may start before the work ahead of it ends");
    }
  }

  void grid_dependency_wait() {
    Fiber& f = current();
    f.waited_for_earlier_grids = true;
    if (Racecheck* check = racecheck()) check->grid_dependency_waited(f.linear);
  }

  void grid_dependents_may_launch() {
    Fiber& f = current();
    if (site_.dependent && !f.waited_for_earlier_grids) {
      fail_in(f, "griddepcontrol.launch_dependents before griddepcontrol.wait in a dependent "
                 "launch: a launch that depends on this one could start before the work "
                 "ahead of this one ends");
    }
  }

  // copy false: the source is not read, and 16 zero bytes land instead (ignore-src).
  void async_copy_16(void* destination, const void* source, bool copy, const void* pc) {
    Fiber& f = current();
    const auto at = reinterpret_cast<uintptr_t>(destination);
    const auto base = reinterpret_cast<uintptr_t>(shared_.data());
    if (at < base || at + 16 > base + shared_.size()) {
      fail_in(f, "cp.async to an address outside the block's dynamic shared memory");
    }
    if (at % 16 != 0 || reinterpret_cast<uintptr_t>(source) % 16 != 0) {
      fail_in(f, "cp.async of 16 bytes between addresses not 16-byte aligned");
    }
    if (Racecheck* check = racecheck()) {
      const std::string race =
          check->async_copy_issued(f.linear, destination, copy ? source : nullptr, pc);
      if (!race.empty()) fail_in(f, race);
    }
    // In the reverse schedule a copy lands at once, the earliest the hardware may land it:
    // a thread that issues copies into a buffer other threads still read (no barrier in
    // between) then overwrites it under them. The other schedules land it as late as the
    // hardware may, at the issuing thread's wait, so an early read sees the old bytes.
    const bool land_now = schedule_ == Schedule::Reverse;
    const void* from = copy ? source : nullptr;
    if (land_now) land_async_copy(destination, from);
    f.async_copies.push_back({destination, from, f.async_groups, land_now});
  }

  static void land_async_copy(void* destination, const void* source) {
    if (source) {
      std::memcpy(destination, source, 16);
    } else {
      std::memset(destination, 0, 16);
    }
  }

  void async_copy_commit() { ++current().async_groups; }

  // A wait_group: completes, in issue order, the operations of every committed group but
  // the `pending` most recent (of `groups` committed), and drops them.
  template <class Operation, class Complete>
  static void complete_groups(std::vector<Operation>& in_flight, int groups, int pending,
                              Complete complete) {
    const int complete_below = groups - pending;
    for (const Operation& op : in_flight) {
      if (op.group < complete_below) complete(op);
    }
    std::erase_if(in_flight, [&](const Operation& op) { return op.group < complete_below; });
  }

  void async_copy_wait(int pending) {
    Fiber& f = current();
    complete_groups(f.async_copies, f.async_groups, pending, [&](const Fiber::AsyncCopy& c) {
      if (!c.landed) land_async_copy(c.destination, c.source);
      if (Racecheck* check = racecheck()) {
        check->async_copy_completed(f.linear, c.destination);
      }
    });
  }

  // From a combine, which runs on the warp's last lane to arrive: the check is lane 0's.
  void wgmma_issued(WgmmaOperandCheck check) {
    Fiber& lane0 = fibers_[size_t(current().linear / kWarpSize * kWarpSize)];
    lane0.wgmmas_in_flight.push_back({std::move(check), lane0.wgmma_groups});
  }

  void wgmma_commit() { ++current().wgmma_groups; }

  void wgmma_wait(int pending) {
    Fiber& f = current();
    complete_groups(f.wgmmas_in_flight, f.wgmma_groups, pending,
                    [&](const Fiber::WgmmaInFlight& w) {
                      const std::string changed = w.check();
                      if (!changed.empty()) fail_in(f, changed);
                    });
  }

  // An access of the running thread's kernel code (instrumented_access), or one that a
  // warp-wide instruction makes for lane `lane` of the running thread's warp.
  void memory_access(const void* address, size_t bytes, MemoryAccess kind, const void* pc,
                     int lane = -1) {
    Racecheck* check = racecheck();
    if (!check) return;
    Fiber& f = current();
    const int thread = lane < 0 ? f.linear : f.linear / kWarpSize * kWarpSize + lane;
    const std::string race = check->access(thread, address, bytes, kind, pc);
    if (race.empty()) return;
    if (lane >= 0) HAM_FAIL(race);  // from a combine, which names the kernel and thread
    // GCC declares its instrumentation's hooks nothrow, so no exception may leave them: the
    // fiber stops here, as a failed block's other fibers stop wherever they are.
    record_error(std::make_exception_ptr(
        Error(detail::concat("cuda emulator: ", where(f), ": ", race))));
    switch_stacks(&f.sp, scheduler_sp_, scheduler_stack_);
    std::abort();  // a block that failed never runs its fibers again
  }

  static std::string thread_name(int thread, const void* runner) {
    const dim3 b = static_cast<const BlockRunner*>(runner)->block_;
    const auto t = unsigned(thread);
    return detail::concat("thread (", t % b.x, ",", t / b.x % b.y, ",", t / (b.x * b.y), ")");
  }

  [[noreturn]] void fail_in(Fiber& f, const std::string& what) {
    HAM_FAIL("cuda emulator: ", where(f), ": ", what);
  }

  std::string where(const Fiber& f) const {
    const uint3 b = f.place.block_idx, t = f.place.thread_idx;
    return detail::concat("kernel ", kernel_name(site_), " launched at ", site_.file, ":",
                          site_.line, ", block (", b.x, ",", b.y, ",", b.z, ") thread (", t.x,
                          ",", t.y, ",", t.z, ")");
  }

  void record_error(std::exception_ptr e) {
    if (!error_) error_ = e;
  }

  // Gives the thread to the next ready fiber directly (half the switches of a round trip
  // through the scheduler), or to the scheduler when none is ready or a fiber has failed;
  // returns when this fiber runs again.
  // `leaving`: f has exited and never runs again.
  void yield(Fiber& f, bool leaving = false) {
    const StackBounds* left = leaving ? &f.stack : nullptr;
    if (!error_ && !ready_.empty()) {
      Fiber& next = fibers_[size_t(ready_.front())];
      ready_.pop_front();
      run(&next);
      if (&next != &f) switch_stacks(&f.sp, next.sp, next.stack, left);
      return;
    }
    switch_stacks(&f.sp, scheduler_sp_, scheduler_stack_, left);
  }
  // The last switch of a fiber.
  [[noreturn]] void leave(Fiber& f) {
    yield(f, true);
    std::abort();  // an exited fiber is never scheduled again
  }

  // ham_emulator_switch, told to AddressSanitizer where it runs: the stack being switched
  // to (`to`), and, once this context runs again, that it is back. Without that, ASan
  // takes a fiber's stack for the thread's, and a throw there (which makes it unpoison
  // the stack it thinks is current) would leave false reports behind. `leaving`: the stack
  // of an exited fiber, which never runs again; the redzones of the frames it ends in
  // (from fiber_main down to here) are cleared first, since the next block's fibers reuse
  // the stack and only an instrumented frame's own prologue re-marks its redzones.
  static void switch_stacks(void** save, void* load, const StackBounds& to,
                            const StackBounds* leaving = nullptr) {
#if HAM_ADDRESS_SANITIZER
    void* fake_stack = nullptr;
    if (leaving) {  // no local here: the end of its scope would poison it again
      const auto top = reinterpret_cast<uintptr_t>(leaving->bottom) + leaving->size;
      // This frame's locals lie below its frame pointer; 1 KiB covers them.
      const uintptr_t from = reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) - 1024;
      ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(from), top - from);
    }
    __sanitizer_start_switch_fiber(leaving ? nullptr : &fake_stack, to.bottom, to.size);
    ham_emulator_switch(save, load);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
    (void)to;
    (void)leaving;
    ham_emulator_switch(save, load);
#endif
  }
  // After a failed block, whose fibers stopped anywhere: the redzones ASan poisoned for
  // their frames would stay on stacks the next block's fibers reuse. (A block that ends
  // normally clears its fibers' last frames in their final switch: switch_stacks.)
  void forget_abandoned_frames() {
#if HAM_ADDRESS_SANITIZER
    for (const Fiber& f : fibers_) ASAN_UNPOISON_MEMORY_REGION(f.stack.bottom, f.stack.size);
#endif
  }

 private:
  static std::vector<std::unique_ptr<FiberStack>>& stacks() {
    thread_local std::vector<std::unique_ptr<FiberStack>> pool;
    return pool;
  }

  static void fiber_main(Fiber* f);

  // The stack as ham_emulator_switch leaves it, so that the first switch "returns" into
  // ham_emulator_fiber_start with r12 = the fiber and r13 = fiber_main. After that `ret`
  // the stack pointer is 16-byte aligned, as a call needs.
  // Each fiber's top starts at another cache line and page offset: stacks of one size
  // mapped one after another would otherwise put every fiber's saved registers in the same
  // cache set, and switching among a block's fibers would evict them from each other.
  static void* fresh_stack(FiberStack& stack, Fiber* f) {
    const size_t stagger = size_t(f->linear % 64) * 64 + size_t(f->linear / 64 % 16) * 4096;
    auto top = reinterpret_cast<uintptr_t>(stack.base + kStackBytes - stagger) & ~uintptr_t(15);
    auto* slots = reinterpret_cast<uintptr_t*>(top - 24 - 6 * 8);
    slots[0] = 0;                                            // r15
    slots[1] = 0;                                            // r14
    slots[2] = reinterpret_cast<uintptr_t>(&fiber_main);     // r13
    slots[3] = reinterpret_cast<uintptr_t>(f);               // r12
    slots[4] = 0;                                            // rbx
    slots[5] = 0;                                            // rbp
    slots[6] = reinterpret_cast<uintptr_t>(&ham_emulator_fiber_start);  // return address
    return slots;
  }

  // Queues fibers in the schedule's order, behind the ready ones, or ahead of them with
  // `first` (they run next, in that order). Reorders `ids` to that order.
  void make_ready(std::vector<int>& ids, bool first = false) {
    if (schedule_ == Schedule::Reverse) std::reverse(ids.begin(), ids.end());
    if (schedule_ == Schedule::Shuffle) std::shuffle(ids.begin(), ids.end(), rng_);
    for (int id : ids) fibers_[size_t(id)].state = FiberState::Ready;
    if (first) ready_.insert(ready_.begin(), ids.begin(), ids.end());
    else ready_.insert(ready_.end(), ids.begin(), ids.end());
  }

  void release_block_barrier() {
    int count = 0;
    for (int id : at_barrier_) count += fibers_[size_t(id)].predicate != 0;
    const int total = int(at_barrier_.size());
    for (int id : at_barrier_) fibers_[size_t(id)].barrier_count = {count, total};
    std::sort(at_barrier_.begin(), at_barrier_.end());
    make_ready(at_barrier_);
    at_barrier_.clear();  // keeps its capacity for the next barrier
    if (Racecheck* check = racecheck()) check->barrier();
    // What the fences before this barrier handed to the async proxy is now what it sees.
    if (async_proxy_fenced_ && !shared_.empty()) {
      std::memcpy(async_proxy_view_.data(), shared_.data(), shared_.size());
    }
    async_proxy_fenced_ = false;
  }

  void complete_collective(int warp, const PendingCollective& p) {
    Fiber* lanes = &fibers_[size_t(warp * kWarpSize)];
    // Of the collectives only __syncwarp orders the lanes' memory accesses (PTX's
    // bar.warp.sync; a shuffle or an mma.sync does not).
    if (p.kind == WarpCollective::Sync) {
      if (Racecheck* check = racecheck()) check->warp_sync(warp);
    }
    if (p.kind == WarpCollective::Exchange) {
      void* data[kWarpSize] = {};
      for (int lane = 0; lane < kWarpSize; ++lane) {
        if (p.mask >> lane & 1u) data[lane] = reinterpret_cast<void*>(lanes[lane].value);
      }
      try {
        p.combine(data, p.mask);
      } catch (const Error& e) {
        fail_in(current(), e.what());
      }
    }
    std::vector<int>& released = released_lanes_;  // reused, not grown anew each collective
    released.clear();
    for (int lane = 0; lane < kWarpSize; ++lane) {
      if (!(p.mask >> lane & 1u)) continue;
      Fiber& f = lanes[lane];
      released.push_back(f.linear);
      const int segment = lane & ~(p.width - 1);
      auto source = [&](int src) -> uint64_t {
        if (!(p.mask >> src & 1u)) {
          fail_in(f, std::string(collective_name(p.kind, p.name)) + " reads lane " +
                         std::to_string(src) + ", outside the mask " + hex(p.mask));
        }
        return lanes[src].value;
      };
      switch (p.kind) {
        case WarpCollective::Sync:
        case WarpCollective::Exchange: f.result = 0; break;
        case WarpCollective::ShuffleIndex:
          f.result = source(segment + (f.lane_operand & (p.width - 1)));
          break;
        case WarpCollective::ShuffleUp: {
          const int src = lane - f.lane_operand;
          f.result = src >= segment ? source(src) : f.value;
          break;
        }
        case WarpCollective::ShuffleDown: {
          const int src = lane + f.lane_operand;
          f.result = src < segment + p.width ? source(src) : f.value;
          break;
        }
        case WarpCollective::ShuffleXor: {
          const int src = lane ^ f.lane_operand;
          f.result = (src & ~(p.width - 1)) == segment ? source(src) : f.value;
          break;
        }
        case WarpCollective::Ballot:
        case WarpCollective::Any:
        case WarpCollective::All: {
          unsigned ballot = 0;
          for (int l = 0; l < kWarpSize; ++l) {
            if ((p.mask >> l & 1u) && lanes[l].value != 0) ballot |= 1u << l;
          }
          f.result = p.kind == WarpCollective::Ballot ? ballot
                     : p.kind == WarpCollective::Any  ? uint64_t(ballot != 0)
                                                      : uint64_t(ballot == p.mask);
          break;
        }
        case WarpCollective::MatchAny: {
          unsigned same = 0;
          for (int l = 0; l < kWarpSize; ++l) {
            if ((p.mask >> l & 1u) && lanes[l].value == f.value) same |= 1u << l;
          }
          f.result = same;
          break;
        }
      }
    }
    // In the reverse schedule a warp runs on from a collective before the other warps do,
    // so it reaches the next barrier (or its copies into a buffer they still read) first;
    // the other schedules move the warps through their collectives together.
    make_ready(released, schedule_ == Schedule::Reverse);
  }

  [[noreturn]] void fail_deadlock() {
    int at_barrier = 0, in_warp = 0, exited = 0;
    const Fiber* example = nullptr;
    for (const Fiber& f : fibers_) {
      if (f.state == FiberState::AtBlockBarrier) ++at_barrier;
      if (f.state == FiberState::InWarpCollective) {
        ++in_warp;
        if (!example) example = &f;
      }
      if (f.state == FiberState::Exited) ++exited;
    }
    std::string detail = detail::concat(at_barrier, " thread(s) wait in __syncthreads, ", in_warp,
                                        " in warp collectives, ", exited, " exited");
    if (example) {
      detail += detail::concat("; thread ", example->linear, " waits in ",
                               collective_name(example->kind, example->name), " with mask ",
                               hex(example->mask));
    }
    HAM_FAIL("cuda emulator: kernel ", kernel_name(site_), " launched at ", site_.file, ":",
             site_.line, ", block (", block_idx_.x, ",", block_idx_.y, ",", block_idx_.z,
             ") deadlocks: ", detail);
  }

  LaunchSite site_;
  dim3 grid_, block_;
  const std::function<void()>& body_;
  int threads_;
  Schedule schedule_;
  std::mt19937 rng_{12345};
  std::vector<Fiber> fibers_;
  std::vector<unsigned char> shared_;
  std::vector<const void*> static_shared_filled_;  // this block's, filled (static_shared)
  // Dynamic shared memory as the async proxy (the wgmma tensor cores) may see it: taken at
  // each barrier that some fence.proxy.async preceded (simt.h, async_proxy_fence).
  std::vector<unsigned char> async_proxy_view_;
  bool async_proxy_fenced_ = false;
  std::vector<std::vector<PendingCollective>> pending_;  // per warp
  std::vector<unsigned> exited_;                         // per warp: lanes that have exited
  std::deque<int> ready_;
  std::vector<int> at_barrier_;
  std::vector<int> released_lanes_;  // complete_collective's, kept for its capacity
  int live_ = 0;
  uint3 block_idx_{};
  Fiber* current_ = nullptr;
  void* scheduler_sp_ = nullptr;
  StackBounds scheduler_stack_;
  std::exception_ptr error_;

  friend void run_kernel(const LaunchSite&, dim3, dim3, size_t, const std::function<void()>&);
};

thread_local BlockRunner* running = nullptr;

Schedule& schedule_setting() {
  static Schedule setting = schedule_from_environment();
  return setting;
}

// A fault inside a kernel (a read of null, freed or unmapped memory; a fiber's stack
// running into its guard page) ends the process, as an illegal memory access ends a CUDA
// context, but first says which kernel, block and thread faulted. Installed per launching
// thread, with an alternate signal stack (the fault may be a full fiber stack); a fault
// outside a kernel goes to the previous handler.
struct sigaction previous_segv, previous_bus;

void on_fault(int signal, siginfo_t* info, void*) {
  const BlockRunner* r = running;
  const Fiber* f = r ? r->current_or_null() : nullptr;
  if (f) {
    char text[640];
    const uint3 b = f->place.block_idx, t = f->place.thread_idx;
    const int n = std::snprintf(
        text, sizeof text,
        "cuda emulator: kernel %s launched at %s:%d, block (%u,%u,%u) thread (%u,%u,%u): "
        "illegal memory access at address %p (%s)\n",
        r->site().kernel, r->site().file, r->site().line, b.x, b.y, b.z, t.x, t.y, t.z,
        info->si_addr, signal == SIGSEGV ? "SIGSEGV" : "SIGBUS");
    if (n > 0) (void)!write(STDERR_FILENO, text, size_t(std::min<int>(n, sizeof text - 1)));
  }
  sigaction(signal, signal == SIGSEGV ? &previous_segv : &previous_bus, nullptr);
  raise(signal);
}

void install_fault_handler() {
  thread_local bool installed = false;
  if (installed) return;
  installed = true;
  static constexpr size_t kAltStackBytes = 64 * 1024;
  thread_local std::vector<char> alt_stack(kAltStackBytes);
  stack_t ss{};
  ss.ss_sp = alt_stack.data();
  ss.ss_size = alt_stack.size();
  sigaltstack(&ss, nullptr);
  static const bool process_handler = [] {
    struct sigaction action {};
    action.sa_sigaction = &on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_segv);
    sigaction(SIGBUS, &action, &previous_bus);
    return true;
  }();
  (void)process_handler;
}

// Inlined, with its error out of line: every device function of every thread comes here.
inline BlockRunner& runner() {
  if (!running) [[unlikely]] fail_outside_kernel();
  return *running;
}

void BlockRunner::fiber_main(Fiber* f) {
#if HAM_ADDRESS_SANITIZER
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);  // the first switch to f
#endif
  BlockRunner& r = runner();
  try {
    r.body_();
  } catch (...) {
    r.record_error(std::current_exception());
  }
  try {
    r.exit_fiber(*f);
  } catch (...) {
    r.record_error(std::current_exception());
  }
  r.leave(*f);
}

}  // namespace

thread_local constinit const ThreadPlace* running_place = nullptr;

std::string kernel_name(const LaunchSite& site) {
  const std::string text = site.kernel != nullptr ? site.kernel : "?";
  const bool plain_name = std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  if (!plain_name || site.function == nullptr) return text;
  const std::string name = function_name_at(site.function);
  if (name.empty() || name.compare(0, text.size(), text) == 0) return text;  // its own
  return name;
}

[[noreturn]] __attribute__((cold, noinline)) void fail_outside_kernel() {
  HAM_FAIL("cuda emulator: a device function was called outside a kernel");
}

void static_shared_variable(void* variable, size_t bytes, const char* name) {
  runner().static_shared(variable, bytes, name);
}

void* dynamic_shared_memory() { return runner().shared(); }
const void* async_proxy_view() { return runner().async_proxy_view(); }
void async_proxy_fence() { runner().async_proxy_fence(); }
size_t dynamic_shared_size() { return runner().shared_size(); }

BarrierCount block_barrier(int predicate) { return runner().block_barrier(predicate); }

uint64_t warp_collective(WarpCollective kind, unsigned mask, uint64_t value, int lane_operand,
                         int width) {
  HAM_CHECK(kind != WarpCollective::Exchange, "cuda emulator: exchanges go through warp_exchange");
  return runner().warp_collective(kind, mask, value, lane_operand, width);
}

void warp_exchange(unsigned mask, void* lane_data, WarpCombine combine, const char* name) {
  runner().warp_collective(WarpCollective::Exchange, mask, reinterpret_cast<uint64_t>(lane_data), 0,
                           kWarpSize, combine, name);
}

void async_copy_16(void* shared_destination, const void* global_source) {
  runner().async_copy_16(shared_destination, global_source, true, __builtin_return_address(0));
}
void async_copy_16_or_zeros(void* shared_destination, const void* global_source, bool copy) {
  runner().async_copy_16(shared_destination, global_source, copy, __builtin_return_address(0));
}
void grid_dependency_wait() { runner().grid_dependency_wait(); }
void grid_dependents_may_launch() { runner().grid_dependents_may_launch(); }
void async_copy_commit() { runner().async_copy_commit(); }
void async_copy_wait(int pending) { runner().async_copy_wait(pending); }

void wgmma_issued(WgmmaOperandCheck check) { runner().wgmma_issued(std::move(check)); }
void wgmma_commit() { runner().wgmma_commit(); }
void wgmma_wait(int pending) { runner().wgmma_wait(pending); }

void trap(const char* why) {
  BlockRunner& r = runner();
  r.fail_in(r.current(), why);
}

bool in_kernel() { return running != nullptr; }

void instrumented_access(const void* address, size_t bytes, bool write, const void* pc) {
  BlockRunner* r = running;
  if (!r || !r->current_or_null()) return;  // host code, or the scheduler between fibers
  r->memory_access(address, bytes, write ? MemoryAccess::Write : MemoryAccess::Read, pc);
}

void instrumented_atomic(const void* address, size_t bytes, const void* pc) {
  BlockRunner* r = running;
  if (!r || !r->current_or_null()) return;
  r->memory_access(address, bytes, MemoryAccess::Atomic, pc);
}

void shared_read_for_lane(int lane, const void* address, size_t bytes, const void* pc) {
  runner().memory_access(address, bytes, MemoryAccess::Read, pc, lane);
}

const void* code_address_here() { return __builtin_return_address(0); }

void racecheck_stream_work(StreamWork work) {
  if (Racecheck* check = racecheck()) check->set_stream_work(std::move(work));
}

void racecheck_stream_work_done() {
  if (Racecheck* check = racecheck()) check->clear_stream_work();
}

void racecheck_work_accesses(const char* what, const std::vector<WorkAccess>& accesses) {
  Racecheck* check = racecheck();
  if (!check) return;
  const std::string race = check->work_accesses(device_allocations(), what, accesses);
  HAM_CHECK(race.empty(), "cuda emulator: ", what, ": ", race);
}

Schedule schedule() { return schedule_setting(); }

void set_schedule(Schedule s) { schedule_setting() = s; }

void run_kernel(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                const std::function<void()>& body) {
  HAM_CHECK(!running, "cuda emulator: kernel ", kernel_name(site),
            " launched from inside a kernel");
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  if (threads == 0 || blocks == 0) return;  // the runtime already rejected it
  HAM_CHECK(threads <= uint64_t(kMaxThreadsPerBlock), "cuda emulator: kernel ",
            kernel_name(site), " with ", threads, " threads per block");
  install_fault_handler();
  BlockRunner block_runner(site, grid, block, dynamic_shared_bytes, body);
  if (Racecheck* check = racecheck()) {
    check->begin_launch(device_allocations(), site.kernel, site.dependent);
  }
  running = &block_runner;
  struct Reset {
    ~Reset() { running = nullptr; }
  } reset;
  // The blocks run one after another, in grid order, or last first in the reverse schedule:
  // the hardware runs them in any order, so a result that depends on which of two blocks
  // writes last fails in one of the two.
  const bool last_first = schedule() == Schedule::Reverse;
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint64_t at = last_first ? blocks - 1 - i : i;
    block_runner.run_block({unsigned(at % grid.x), unsigned(at / grid.x % grid.y),
                            unsigned(at / (uint64_t(grid.x) * grid.y))});
  }
}

}  // namespace ham::cuda::emulator

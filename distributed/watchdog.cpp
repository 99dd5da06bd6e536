#include "distributed/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ham::dist {

CollectiveWatchdog::CollectiveWatchdog(int world_rank, double timeout_s)
    : world_rank_(world_rank), timeout_s_(timeout_s) {
  HAM_CHECK(timeout_s > 0, "collective watchdog: timeout must be > 0 s, got ", timeout_s);
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

CollectiveWatchdog::Scope::Scope(CollectiveWatchdog& watchdog, std::string what)
    : watchdog_(watchdog) {
  std::lock_guard<std::mutex> lock(watchdog_.mutex_);
  if (watchdog_.depth_++ == 0) {
    watchdog_.what_ = std::move(what);
    watchdog_.armed_at_ = std::chrono::steady_clock::now();
  }
}

CollectiveWatchdog::Scope::~Scope() {
  std::lock_guard<std::mutex> lock(watchdog_.mutex_);
  --watchdog_.depth_;
}

void CollectiveWatchdog::run() {
  // Poll often enough that the exit comes at most ~5% after the deadline.
  auto poll = std::chrono::duration<double>(std::clamp(timeout_s_ / 20, 0.01, 1.0));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, poll);
    if (stopping_ || depth_ == 0) continue;
    std::chrono::duration<double> blocked = std::chrono::steady_clock::now() - armed_at_;
    if (blocked.count() > timeout_s_) fire(what_);
  }
}

void CollectiveWatchdog::fire(const std::string& what) {
  std::fprintf(stderr,
               "rank %d: %s did not complete within %g s; a peer rank has probably died or "
               "hung (HAM_COLLECTIVE_TIMEOUT_S sets the limit)\n",
               world_rank_, what.c_str(), timeout_s_);
  std::fflush(stderr);
  std::_Exit(kWatchdogExitCode);
}

}  // namespace ham::dist

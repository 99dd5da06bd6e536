#pragma once
// Bounded failure: a rank whose peer died or hung would otherwise wait in a collective
// forever. The watchdog is armed while the host blocks in a collective; if one call stays
// blocked past the timeout, a background thread prints
//   "rank R: <collective> on <communicator> did not complete within T s; ..."
// and ends the process with kWatchdogExitCode. It calls no MPI function (MPI may not be
// thread-safe here): the launcher sees a rank exit non-zero and tears the job down.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace ham::dist {

constexpr int kWatchdogExitCode = 3;

class CollectiveWatchdog {
 public:
  CollectiveWatchdog(int world_rank, double timeout_s);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  double timeout_s() const { return timeout_s_; }

  // Armed from construction to destruction; nested scopes keep the outermost deadline.
  class Scope {
   public:
    Scope(CollectiveWatchdog& watchdog, std::string what);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CollectiveWatchdog& watchdog_;
  };

 private:
  void run();
  [[noreturn]] void fire(const std::string& what);

  const int world_rank_;
  const double timeout_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int depth_ = 0;  // nested armed scopes
  std::string what_;
  std::chrono::steady_clock::time_point armed_at_;
  std::thread thread_;
};

}  // namespace ham::dist

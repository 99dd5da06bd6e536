#include "train/stop_signals.h"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ham {

namespace {

std::atomic<int> requested_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

struct sigaction previous_interrupt, previous_terminate;
bool installed = false;  // one StopSignals at a time: it keeps the handlers it replaced

// Async-signal-safe: an atomic store, or, for the second signal, the default action
// restored and the signal raised again.
extern "C" void record_stop_signal(int signal_number) {
  int none = 0;
  if (!requested_signal.compare_exchange_strong(none, signal_number)) {
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
  }
}

void install(int signal_number, struct sigaction* previous) {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and writes resume after the handler
  HAM_CHECK(::sigaction(signal_number, &action, previous) == 0, "StopSignals: sigaction(",
            stop_signal_name(signal_number), ") failed: ", std::strerror(errno));
}

}  // namespace

StopSignals::StopSignals() {
  HAM_CHECK(!installed, "StopSignals: another one is live (one at a time)");
  clear_stop_request();
  install(SIGINT, &previous_interrupt);
  install(SIGTERM, &previous_terminate);
  installed = true;
}

StopSignals::~StopSignals() {
  // Restoring what sigaction returned cannot fail; a destructor could not report it.
  ::sigaction(SIGINT, &previous_interrupt, nullptr);
  ::sigaction(SIGTERM, &previous_terminate, nullptr);
  installed = false;
}

int stop_requested() { return requested_signal.load(); }

void request_stop(int signal_number) { requested_signal.store(signal_number); }

void clear_stop_request() { requested_signal.store(0); }

const char* stop_signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace ham

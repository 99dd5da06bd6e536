#pragma once
// Stopping a training run early without losing it. While a StopSignals object lives,
// SIGINT and SIGTERM (Ctrl-C; a scheduler's preemption notice) only record a stop
// request: train() sees it at the next step boundary, writes a checkpoint and returns, so
// `ham train --resume` continues the run exactly. A second signal ends the process at
// once, as it would without the handlers.
namespace ham {

class StopSignals {
 public:
  StopSignals();   // installs the handlers and clears any earlier request
  ~StopSignals();  // restores the handlers that were there before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// The signal that asked to stop (SIGINT, SIGTERM), or 0 when none did.
int stop_requested();
// What a handler records; tests call it to stop a run at a chosen point.
void request_stop(int signal_number);
void clear_stop_request();
// "SIGINT", "SIGTERM", or "a signal".
const char* stop_signal_name(int signal_number);

}  // namespace ham

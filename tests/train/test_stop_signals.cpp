#include "train/stop_signals.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>

#include "core/error.h"

namespace ham {
namespace {

TEST(StopSignals, ASignalIsRecordedNotFatal) {
  StopSignals handlers;
  EXPECT_EQ(stop_requested(), 0);
  ASSERT_EQ(::raise(SIGTERM), 0);
  EXPECT_EQ(stop_requested(), SIGTERM);
  EXPECT_STREQ(stop_signal_name(stop_requested()), "SIGTERM");
  clear_stop_request();
}

TEST(StopSignals, OnlyOneAtATime) {
  StopSignals handlers;
  EXPECT_THROW(StopSignals(), Error);
}

TEST(StopSignals, ASecondSignalEndsTheProcessAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopSignals handlers;
        ::raise(SIGINT);
        if (stop_requested() != SIGINT) std::_Exit(3);
        ::raise(SIGINT);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
}

std::atomic<int> earlier_handler_calls{0};
extern "C" void count_earlier_handler_call(int) { ++earlier_handler_calls; }

TEST(StopSignals, LeavingScopeRestoresTheEarlierHandler) {
  struct sigaction counting {}, previous {};
  counting.sa_handler = count_earlier_handler_call;
  sigemptyset(&counting.sa_mask);
  ASSERT_EQ(::sigaction(SIGTERM, &counting, &previous), 0);
  {
    StopSignals handlers;
    ::raise(SIGTERM);
    EXPECT_EQ(earlier_handler_calls.load(), 0);
  }
  clear_stop_request();
  ::raise(SIGTERM);
  EXPECT_EQ(earlier_handler_calls.load(), 1);
  ASSERT_EQ(::sigaction(SIGTERM, &previous, nullptr), 0);
}

}  // namespace
}  // namespace ham

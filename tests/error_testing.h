#pragma once
// The bad-input check every test file uses: the error is a one-line ham::Error naming
// what is wrong. Depends on core only, so core's tests can use it.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ham::testing {

// The message of the ham::Error that `fn` throws; a test failure (and "") when none is.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ham::Error was thrown";
  return "";
}

// Expects `message` to be one line holding every one of `parts` (the op or file, the
// argument, the shapes...).
inline void expect_one_line_naming(const std::string& message,
                                   const std::vector<std::string>& parts) {
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

// Expects `fn` to throw a one-line ham::Error naming every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  expect_one_line_naming(error_of(fn), parts);
}

}  // namespace ham::testing

#pragma once
// The bad-input check every test file uses: the error is a one-line ham::Error naming
// what is wrong. Depends on core only, so core's tests can use it.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ham::testing {

// Expects `fn` to throw a one-line ham::Error whose message holds every one of `parts`
// (the op or file, the argument, the shapes...).
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' in: " << message;
    }
  }
}

}  // namespace ham::testing

#pragma once
// Errors are exceptions whose one-line message names the op, shape, file or key at fault.
// HAM_CHECK builds the message by streaming its arguments, so this header stays usable
// from .cu files (no fmt here).
#include <sstream>
#include <stdexcept>
#include <string>

namespace ham {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace ham

#define HAM_CHECK(cond, ...)                                   \
  do {                                                         \
    if (!(cond)) throw ::ham::Error(::ham::detail::concat(__VA_ARGS__)); \
  } while (0)

#define HAM_FAIL(...) throw ::ham::Error(::ham::detail::concat(__VA_ARGS__))

#pragma once
// Errors carry their context (file, tensor, request id) in the message so a
// user can act on them without a debugger.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mlaserve {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mlaserve

// Checks an invariant or input; throws mlaserve::Error with the formatted message.
#define MLA_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::mlaserve::fail(__VA_ARGS__); \
  } while (0)

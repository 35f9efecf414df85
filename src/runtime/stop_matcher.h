#pragma once
// Stop strings on the streamed text: text that could still turn into a stop
// string is held back until it is decided, so a stop string split across
// tokens is never emitted, and nothing after it either.
#include <string>
#include <string_view>
#include <vector>

namespace mlaserve::runtime {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string was completed; `text` ends right before it
    std::string matched;   // which one
  };
  Result push(std::string_view text);
  // The held-back tail, at the end of generation (no stop string completed).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace mlaserve::runtime

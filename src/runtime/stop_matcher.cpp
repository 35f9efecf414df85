#include "runtime/stop_matcher.h"

#include <algorithm>

namespace mlaserve::runtime {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  Result r;
  if (stopped_) return r;
  pending_.append(text);
  // Earliest completed stop string wins.
  size_t best = std::string::npos;
  for (auto& s : stops_) {
    size_t at = pending_.find(s);
    if (at < best) {
      best = at;
      r.matched = s;
    }
  }
  if (best != std::string::npos) {
    r.text = pending_.substr(0, best);
    r.stopped = stopped_ = true;
    pending_.clear();
    return r;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (std::string_view(pending_).substr(pending_.size() - n) == std::string_view(s).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace mlaserve::runtime

#include "chat/marker_scan.h"

#include <algorithm>

namespace mlaserve::chat {

std::optional<MarkerHit> find_first_marker(std::string_view text, std::initializer_list<std::string_view> markers) {
  std::optional<MarkerHit> best;
  for (std::string_view m : markers) {
    size_t pos = text.find(m);
    if (pos != std::string_view::npos && (!best || pos < best->pos)) best = MarkerHit{pos, m};
  }
  return best;
}

size_t partial_marker_suffix(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    for (size_t len = std::min(text.size(), m.size() - 1); len > best; --len) {
      if (text.substr(text.size() - len) == m.substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

bool is_marker_prefix(std::string_view text, std::initializer_list<std::string_view> markers) {
  return std::any_of(markers.begin(), markers.end(),
                     [&](std::string_view m) { return text.size() < m.size() && m.substr(0, text.size()) == text; });
}

}  // namespace mlaserve::chat

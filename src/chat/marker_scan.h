#pragma once
// Finding special markers in streamed text: the earliest complete marker,
// and how much of the text's end might be the start of one (to hold back
// until the next chunk decides).
#include <initializer_list>
#include <optional>
#include <string_view>

namespace mlaserve::chat {

struct MarkerHit {
  size_t pos = 0;            // where the marker starts
  std::string_view marker;   // which one
};

// The marker that starts first (ties: the one listed first).
std::optional<MarkerHit> find_first_marker(std::string_view text, std::initializer_list<std::string_view> markers);

// Length of the longest suffix of `text` that is a proper prefix of one of
// the markers (0 if none).
size_t partial_marker_suffix(std::string_view text, std::initializer_list<std::string_view> markers);

// True when `text` is a proper prefix of one of the markers (more text may
// still complete it).
bool is_marker_prefix(std::string_view text, std::initializer_list<std::string_view> markers);

}  // namespace mlaserve::chat

#include "tokenizer/added_token_matcher.h"

namespace mlaserve::tokenizer {

AddedTokenMatcher::AddedTokenMatcher() : node_token_{-1} {}

void AddedTokenMatcher::add(std::string_view content, int32_t id) {
  if (content.empty()) return;  // Hugging Face ignores empty added tokens
  int32_t node = 0;
  for (const char c : content) {
    const auto [it, inserted] = edges_.try_emplace(edge_key(node, static_cast<uint8_t>(c)),
                                                   static_cast<int32_t>(node_token_.size()));
    if (inserted) node_token_.push_back(-1);
    node = it->second;
  }
  // A repeated content keeps its first id, as the first-added token wins in Hugging Face.
  if (node_token_[node] < 0) {
    node_token_[node] = id;
    ++num_tokens_;
  }
  is_first_byte_[static_cast<uint8_t>(content[0])] = true;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::find(std::string_view text, size_t from) const {
  if (num_tokens_ == 0) return std::nullopt;
  for (size_t begin = from; begin < text.size(); ++begin) {
    if (!is_first_byte_[static_cast<uint8_t>(text[begin])]) continue;
    int32_t node = 0;
    std::optional<Match> longest;
    for (size_t pos = begin; pos < text.size(); ++pos) {
      const auto it = edges_.find(edge_key(node, static_cast<uint8_t>(text[pos])));
      if (it == edges_.end()) break;
      node = it->second;
      if (node_token_[node] >= 0) longest = Match{begin, pos + 1, node_token_[node]};
    }
    if (longest) return longest;
  }
  return std::nullopt;
}

}  // namespace mlaserve::tokenizer

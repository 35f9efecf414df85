#pragma once
// Finds added tokens (special tokens such as "<｜User｜>") in text the way
// Hugging Face's AddedVocabulary does: leftmost match first, and among the
// tokens that match there the longest (Aho-Corasick's LeftmostLongest).
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mlaserve::tokenizer {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher();

  void add(std::string_view content, int32_t id);
  bool empty() const { return num_tokens_ == 0; }

  struct Match {
    size_t begin;
    size_t end;
    int32_t id;
  };
  // The leftmost-longest token occurrence in text[from..], if any.
  std::optional<Match> find(std::string_view text, size_t from) const;

 private:
  // A byte trie; edges live in one hash map keyed by (node, byte) since
  // tokens share long prefixes ("<｜place▁holder▁no▁") and the trie is small.
  static uint64_t edge_key(int32_t node, uint8_t byte) { return (static_cast<uint64_t>(node) << 8) | byte; }
  std::vector<int32_t> node_token_;  // token id ending at each node, -1 if none
  std::unordered_map<uint64_t, int32_t> edges_;
  std::array<bool, 256> is_first_byte_{};
  size_t num_tokens_ = 0;
};

}  // namespace mlaserve::tokenizer

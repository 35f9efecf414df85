#pragma once
// Byte-level BPE as tokenizer.json's "BPE" model defines it: a piece's bytes
// start as one token each (the byte-level alphabet), then the adjacent pair
// with the lowest merge rank is merged, leftmost first, until no pair of the
// piece has a merge. Same result as Hugging Face's Word::merge_all.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/bpe_cache.h"

namespace mlaserve::tokenizer {

class BpeModel {
 public:
  // `spec` is tokenizer.json's "model" object.
  static BpeModel from_json(const nlohmann::json& spec);

  // Appends the ids of one pre-tokenized piece (raw bytes). Thread-safe.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // The two merge loops behind encode_piece (exposed for tests): a linear
  // scan for short pieces and a heap over a linked list for long ones. Both
  // skip the cache.
  void merge_by_scan(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_by_heap(std::string_view piece, std::vector<int32_t>& out) const;

  // Vocabulary strings are in the byte-level alphabet ("Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  // Open-addressing table from (left id, right id) to its merge: the hot
  // lookup of the merge loop.
  class MergeTable {
   public:
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(int32_t left, int32_t right) const {
      const uint64_t key = pair_key(left, right);
      for (size_t slot = slot_of(key);; slot = (slot + 1) & mask_) {
        const Slot& s = slots_[slot];
        if (s.key == key) return &s.merge;
        if (s.key == kEmpty) return nullptr;
      }
    }
    static uint64_t pair_key(int32_t left, int32_t right) {
      return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
      uint64_t key = kEmpty;
      Merge merge{};
    };
    size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    int shift_ = 64;
  };

  // Pieces longer than this go through the heap loop; shorter ones scan.
  static constexpr size_t kScanLimit = 64;
  // Longer pieces are rare enough that caching them only costs memory.
  static constexpr size_t kCachedPieceLimit = 256;

  std::array<int32_t, 256> byte_ids_{};
  MergeTable merges_;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::unique_ptr<BpeCache> cache_;
};

}  // namespace mlaserve::tokenizer

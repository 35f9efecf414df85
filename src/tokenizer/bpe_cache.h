#pragma once
// A bounded, thread-safe map from a pre-tokenized piece (its raw bytes) to its
// BPE token ids. Words repeat (Zipf), so most pieces skip the merge loop.
// Sharded so that threads encoding at once rarely touch the same lock; once
// a shard is full it stops growing (no eviction), as Hugging Face's cache does.
#include <array>
#include <cstdint>
#include <functional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mlaserve::tokenizer {

class BpeCache {
 public:
  explicit BpeCache(size_t capacity) : shard_capacity_(capacity / kShards + 1) {}

  // Appends the cached ids of `piece` to `out`; false if not cached.
  bool lookup(std::string_view piece, std::vector<int32_t>& out) const;
  void insert(std::string_view piece, std::span<const int32_t> ids);

 private:
  static constexpr size_t kShards = 32;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    mutable std::shared_mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  Shard& shard_of(size_t hash) const { return shards_[(hash >> 7) % kShards]; }

  size_t shard_capacity_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace mlaserve::tokenizer

#include "tokenizer/bpe_cache.h"

#include <mutex>

namespace mlaserve::tokenizer {

bool BpeCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t hash = Hash{}(piece);
  const Shard& shard = shard_of(hash);
  std::shared_lock lock(shard.mutex);
  const auto it = shard.map.find(piece);
  if (it == shard.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeCache::insert(std::string_view piece, std::span<const int32_t> ids) {
  const size_t hash = Hash{}(piece);
  Shard& shard = shard_of(hash);
  std::unique_lock lock(shard.mutex);
  if (shard.map.size() >= shard_capacity_) return;
  shard.map.try_emplace(std::string(piece), ids.begin(), ids.end());
}

}  // namespace mlaserve::tokenizer

#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace mlaserve::tokenizer {
namespace {

// Sized for a working set of a few hundred thousand distinct words.
constexpr size_t kCacheCapacity = 1 << 18;

bool is_null_or_empty(const nlohmann::json& spec, const char* key) {
  if (!spec.contains(key) || spec[key].is_null()) return true;
  return spec[key].is_string() && spec[key].get<std::string>().empty();
}

// Splits a merges entry: "left right" (older files) or ["left", "right"].
std::pair<std::string, std::string> merge_parts(const nlohmann::json& entry, size_t rank) {
  if (entry.is_array() && entry.size() == 2) return {entry[0].get<std::string>(), entry[1].get<std::string>()};
  MLA_CHECK(entry.is_string(), "tokenizer.json: merge {} is neither a string nor a pair", rank);
  const std::string text = entry.get<std::string>();
  // Byte-level tokens never contain a space (it is spelled "Ġ").
  const size_t space = text.find(' ');
  MLA_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos,
            "tokenizer.json: merge {} '{}' is not two tokens separated by one space", rank, text);
  return {text.substr(0, space), text.substr(space + 1)};
}

// Per-thread buffers for the merge loops, so encoding allocates nothing once warm.
struct MergeScratch {
  std::vector<int32_t> symbols;
  std::vector<int32_t> pair_ranks;
  std::vector<int32_t> pair_merged;
  struct Node {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Node> nodes;
  struct Candidate {
    int32_t rank;
    int32_t pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> heap;
};

MergeScratch& merge_scratch() {
  thread_local MergeScratch scratch;
  return scratch;
}

}  // namespace

void BpeModel::MergeTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, entries.size() * 2));
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  for (const auto& [key, merge] : entries) {
    size_t slot = slot_of(key);
    while (slots_[slot].key != kEmpty && slots_[slot].key != key) slot = (slot + 1) & mask_;
    // A pair listed twice keeps its last rank, as in Hugging Face's merge map.
    slots_[slot] = Slot{key, merge};
  }
}

BpeModel BpeModel::from_json(const nlohmann::json& spec) {
  MLA_CHECK(spec.is_object() && spec.value("type", "") == "BPE", "tokenizer.json: model.type must be BPE");
  MLA_CHECK(spec.value("dropout", nlohmann::json()).is_null(), "tokenizer.json: BPE dropout is not supported");
  MLA_CHECK(!spec.value("byte_fallback", false), "tokenizer.json: BPE byte_fallback is not supported");
  MLA_CHECK(!spec.value("ignore_merges", false), "tokenizer.json: BPE ignore_merges is not supported");
  MLA_CHECK(is_null_or_empty(spec, "continuing_subword_prefix") && is_null_or_empty(spec, "end_of_word_suffix"),
            "tokenizer.json: BPE subword prefixes/suffixes are not supported");

  BpeModel model;
  const auto& vocab = spec.at("vocab");
  MLA_CHECK(vocab.is_object() && !vocab.empty(), "tokenizer.json: model.vocab must be a non-empty object");
  model.token_to_id_.reserve(vocab.size());
  int32_t max_id = -1;
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int64_t>();
    MLA_CHECK(id >= 0 && id < INT32_MAX, "tokenizer.json: vocab id {} of '{}' is out of range", id, token);
    model.token_to_id_.emplace(token, static_cast<int32_t>(id));
    max_id = std::max(max_id, static_cast<int32_t>(id));
  }
  model.id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : model.token_to_id_) model.id_to_token_[id] = token;

  for (int b = 0; b < 256; ++b) {
    const auto id = model.token_to_id(byte_level_spelling(static_cast<uint8_t>(b)));
    MLA_CHECK(id.has_value(), "tokenizer.json: byte 0x{:02X} has no token in the vocabulary", b);
    model.byte_ids_[b] = *id;
  }

  const auto& merges = spec.at("merges");
  MLA_CHECK(merges.is_array(), "tokenizer.json: model.merges must be an array");
  std::vector<std::pair<uint64_t, Merge>> entries;
  entries.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left, right] = merge_parts(merges[rank], rank);
    const auto left_id = model.token_to_id(left);
    const auto right_id = model.token_to_id(right);
    const auto merged_id = model.token_to_id(left + right);
    MLA_CHECK(left_id && right_id && merged_id, "tokenizer.json: merge {} '{} {}' uses a token not in the vocabulary",
              rank, left, right);
    entries.push_back({MergeTable::pair_key(*left_id, *right_id), Merge{static_cast<int32_t>(rank), *merged_id}});
  }
  model.merges_.build(entries);
  model.cache_ = std::make_unique<BpeCache>(kCacheCapacity);
  return model;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kCachedPieceLimit;
  if (cacheable && cache_->lookup(piece, out)) return;
  const size_t first = out.size();
  if (piece.size() <= kScanLimit) {
    merge_by_scan(piece, out);
  } else {
    merge_by_heap(piece, out);
  }
  if (cacheable) cache_->insert(piece, std::span<const int32_t>(out.data() + first, out.size() - first));
}

void BpeModel::merge_by_scan(std::string_view piece, std::vector<int32_t>& out) const {
  MergeScratch& s = merge_scratch();
  auto& symbols = s.symbols;
  auto& ranks = s.pair_ranks;
  auto& merged = s.pair_merged;
  symbols.clear();
  for (const char c : piece) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  ranks.resize(symbols.size() - 1);
  merged.resize(symbols.size() - 1);
  // ranks[i] / merged[i] describe the pair (symbols[i], symbols[i + 1]).
  auto refresh_pair = [&](size_t i) {
    const Merge* m = merges_.find(symbols[i], symbols[i + 1]);
    ranks[i] = m ? m->rank : INT32_MAX;
    merged[i] = m ? m->merged_id : -1;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) refresh_pair(i);

  while (!ranks.empty()) {
    const size_t best = std::min_element(ranks.begin(), ranks.end()) - ranks.begin();  // leftmost minimum
    if (ranks[best] == INT32_MAX) break;
    symbols[best] = merged[best];
    symbols.erase(symbols.begin() + best + 1);
    ranks.erase(ranks.begin() + best);
    merged.erase(merged.begin() + best);
    if (best > 0) refresh_pair(best - 1);
    if (best + 1 < symbols.size()) refresh_pair(best);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeModel::merge_by_heap(std::string_view piece, std::vector<int32_t>& out) const {
  MergeScratch& s = merge_scratch();
  auto& nodes = s.nodes;
  auto& heap = s.heap;
  const auto n = static_cast<int32_t>(piece.size());
  nodes.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    nodes[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  // Min-heap on (rank, position): the lowest rank first, the leftmost among equals.
  heap.clear();
  const auto cmp = std::greater<MergeScratch::Candidate>();
  auto push_pair = [&](int32_t pos) {
    const int32_t next = nodes[pos].next;
    if (next < 0) return;
    if (const Merge* m = merges_.find(nodes[pos].id, nodes[next].id)) {
      heap.push_back({m->rank, pos});
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const MergeScratch::Candidate top = heap.back();
    heap.pop_back();
    auto& left = nodes[top.pos];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or now last
    const int32_t right_pos = left.next;
    const Merge* m = merges_.find(left.id, nodes[right_pos].id);
    if (m == nullptr || m->rank != top.rank) continue;  // stale: a neighbour changed
    left.id = m->merged_id;
    left.next = nodes[right_pos].next;
    if (left.next >= 0) nodes[left.next].prev = top.pos;
    nodes[right_pos].id = -1;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t pos = 0; pos >= 0; pos = nodes[pos].next) out.push_back(nodes[pos].id);
}

}  // namespace mlaserve::tokenizer

#pragma once
// Bookkeeping of the paged latent KV pool: which pages are free. A page holds
// page_size consecutive token rows of every layer's cache tensor; slot
// (page * page_size + offset) is the row index the model reads and writes.
// The tensors themselves belong to the model runner; this only hands out ids.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace mlaserve::runtime {

class PageAllocator {
 public:
  PageAllocator(int num_pages, int page_size);

  int page_size() const { return page_size_; }
  int num_pages() const { return int(in_use_.size()); }
  int num_free() const { return int(free_.size()); }
  int64_t capacity_tokens() const { return int64_t(num_pages()) * page_size_; }
  bool in_use(int32_t page) const { return in_use_.at(size_t(page)) != 0; }

  // n pages, or nothing when fewer than n are free (no partial allocation).
  std::optional<std::vector<int32_t>> alloc(int n);
  // Throws mlaserve::Error on a double free or a page id out of range: either
  // is a bookkeeping bug that would otherwise corrupt another request's cache.
  void free(std::span<const int32_t> pages);

  int32_t slot(int32_t page, int offset) const { return page * page_size_ + offset; }

 private:
  int page_size_;
  std::vector<int32_t> free_;    // used as a stack: recently freed pages are reused first
  std::vector<uint8_t> in_use_;
};

// Pages needed to hold `tokens` rows.
inline int pages_for_tokens(int64_t tokens, int page_size) {
  return int((tokens + page_size - 1) / page_size);
}

}  // namespace mlaserve::runtime

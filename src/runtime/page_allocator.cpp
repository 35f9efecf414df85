#include "runtime/page_allocator.h"

#include "core/error.h"

namespace mlaserve::runtime {

PageAllocator::PageAllocator(int num_pages, int page_size) : page_size_(page_size) {
  MLA_CHECK(page_size >= 1, "page size must be >= 1, got {}", page_size);
  MLA_CHECK(num_pages >= 1, "the KV pool needs at least one page, got {}", num_pages);
  in_use_.assign(size_t(num_pages), 0);
  free_.reserve(size_t(num_pages));
  // Highest id at the bottom of the stack so pages come out in order 0, 1, 2...
  for (int p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

std::optional<std::vector<int32_t>> PageAllocator::alloc(int n) {
  MLA_CHECK(n >= 0, "cannot allocate {} pages", n);
  if (n > num_free()) return std::nullopt;
  std::vector<int32_t> pages;
  pages.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    pages.push_back(free_.back());
    free_.pop_back();
    in_use_[size_t(pages.back())] = 1;
  }
  return pages;
}

void PageAllocator::free(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    MLA_CHECK(p >= 0 && p < num_pages(), "freeing page {} outside the pool of {} pages", p, num_pages());
    MLA_CHECK(in_use_[size_t(p)], "double free of KV page {}", p);
    in_use_[size_t(p)] = 0;
    free_.push_back(p);
  }
}

}  // namespace mlaserve::runtime

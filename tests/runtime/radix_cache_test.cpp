#include "runtime/radix_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"

using namespace mlaserve::runtime;

namespace {

std::vector<int32_t> seq(std::initializer_list<int32_t> v) { return v; }

// What a request does with the cache: match, allocate the rest, "write" the
// tokens into its pages, insert, free the duplicate and the partial pages.
struct Simulated {
  PageAllocator alloc;
  RadixCache cache;
  std::map<int32_t, std::vector<int32_t>> page_contents;  // the "KV" each page holds

  Simulated(int pages, int page_size) : alloc(pages, page_size), cache(alloc) {}

  // Returns the cached prefix length the request saw.
  int run_request(const std::vector<int32_t>& tokens) {
    const int ps = alloc.page_size();
    auto m = cache.match_prefix(tokens);
    cache.lock(m.node);
    // The matched pages must hold exactly the tokens they claim.
    for (size_t i = 0; i < m.pages.size(); ++i) {
      std::vector<int32_t> want(tokens.begin() + i * ps, tokens.begin() + (i + 1) * ps);
      EXPECT_EQ(page_contents.at(m.pages[i]), want) << "page " << m.pages[i];
    }
    int total_pages = pages_for_tokens(tokens.size(), ps);
    int need = total_pages - int(m.pages.size());
    auto fresh = alloc.alloc(need);
    if (!fresh) {
      cache.evict(need - alloc.num_free());
      fresh = alloc.alloc(need);
    }
    EXPECT_TRUE(fresh.has_value());
    std::vector<int32_t> pages = m.pages;
    pages.insert(pages.end(), fresh->begin(), fresh->end());
    for (int p = int(m.pages.size()); p < total_pages; ++p) {
      auto end = std::min(tokens.size(), size_t(p + 1) * ps);
      page_contents[pages[p]] = std::vector<int32_t>(tokens.begin() + p * ps, tokens.begin() + end);
    }
    int full = int(tokens.size()) / ps;
    int existed = cache.insert(tokens, std::span(pages).first(full));
    for (int p = int(m.pages.size()); p < existed / ps; ++p) alloc.free(std::span(&pages[p], 1));
    if (full < total_pages) alloc.free(std::span(&pages[full], 1));
    cache.unlock(m.node);
    cache.check_invariants();
    return m.num_tokens();
  }
};

}  // namespace

TEST(PageAllocator, AllocatesAllOrNothingAndDetectsDoubleFree) {
  PageAllocator a(4, 16);
  EXPECT_EQ(a.capacity_tokens(), 64);
  auto p = a.alloc(3);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, seq({0, 1, 2}));
  EXPECT_FALSE(a.alloc(2));
  EXPECT_EQ(a.num_free(), 1);
  a.free(*p);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_THROW(a.free(std::span(p->data(), 1)), mlaserve::Error);
  int32_t bad = 7;
  EXPECT_THROW(a.free(std::span(&bad, 1)), mlaserve::Error);
  EXPECT_THROW(PageAllocator(0, 1), mlaserve::Error);
}

TEST(RadixCache, MatchesWholePagesOnly) {
  PageAllocator a(16, 2);
  RadixCache c(a);
  auto pages = *a.alloc(3);
  auto toks = seq({1, 2, 3, 4, 5, 6});
  EXPECT_EQ(c.insert(toks, pages), 0);
  EXPECT_EQ(c.evictable_pages(), 3);
  // 5 tokens agree, but only 2 whole pages do.
  auto m = c.match_prefix(seq({1, 2, 3, 4, 5, 9}));
  EXPECT_EQ(m.num_tokens(), 4);
  EXPECT_EQ(m.pages, seq({pages[0], pages[1]}));
  EXPECT_EQ(c.prefix_length(seq({1, 2, 3, 4, 5, 9})), 4);
  EXPECT_EQ(c.prefix_length(seq({1, 3})), 0);
  EXPECT_EQ(c.match_prefix(seq({1})).num_tokens(), 0);
  c.check_invariants();
}

TEST(RadixCache, InsertReportsExistingPrefixAndSplits) {
  PageAllocator a(16, 1);
  RadixCache c(a);
  auto p1 = *a.alloc(4);
  EXPECT_EQ(c.insert(seq({1, 2, 3, 4}), p1), 0);
  auto p2 = *a.alloc(4);
  // Shares [1, 2] with the first insert: the tree keeps its own pages there.
  EXPECT_EQ(c.insert(seq({1, 2, 7, 8}), p2), 2);
  a.free(std::span(p2).first(2));
  EXPECT_EQ(c.total_pages(), 6);
  auto m = c.match_prefix(seq({1, 2, 7, 8, 9}));
  EXPECT_EQ(m.pages, seq({p1[0], p1[1], p2[2], p2[3]}));
  c.check_invariants();
}

TEST(RadixCache, LockedNodesSurviveEvictionLruOrder) {
  PageAllocator a(8, 1);
  RadixCache c(a);
  c.insert(seq({1, 2}), *a.alloc(2));
  c.insert(seq({3, 4}), *a.alloc(2));
  c.insert(seq({5, 6}), *a.alloc(2));
  c.match_prefix(seq({1, 2}));  // make [1, 2] recently used
  auto locked = c.match_prefix(seq({5, 6}));
  c.lock(locked.node);
  EXPECT_EQ(c.protected_pages(), 2);
  EXPECT_EQ(c.evictable_pages(), 4);
  // Least recently used unlocked leaf is [3, 4].
  EXPECT_EQ(c.evict(1), 2);
  EXPECT_EQ(c.prefix_length(seq({3, 4})), 0);
  EXPECT_EQ(c.prefix_length(seq({1, 2})), 2);
  EXPECT_FALSE(c.reset());
  EXPECT_EQ(c.evict(100), 2);
  EXPECT_EQ(c.prefix_length(seq({5, 6})), 2);
  c.unlock(locked.node);
  EXPECT_TRUE(c.reset());
  EXPECT_EQ(a.num_free(), 8);
  c.check_invariants();
}

TEST(RadixCache, EvictionCascadesToParents) {
  PageAllocator a(8, 1);
  RadixCache c(a);
  c.insert(seq({1, 2, 3}), *a.alloc(3));
  auto p = *a.alloc(3);
  c.insert(seq({1, 2, 4}), p);
  a.free(std::span(p).first(2));
  EXPECT_EQ(c.evict(4), 4);
  EXPECT_EQ(a.num_free(), 8);
  c.check_invariants();
}

TEST(RadixCache, RandomWorkloadKeepsInvariantsAndContents) {
  for (int page_size : {1, 4}) {
    Simulated sim(64, page_size);
    std::mt19937 rng(7);
    std::vector<std::vector<int32_t>> prefixes = {{}, {5, 5, 5, 5, 5, 5, 5, 5}, {9, 8, 7, 6, 5, 4, 3, 2, 1}};
    int hits = 0;
    for (int i = 0; i < 400; ++i) {
      auto toks = prefixes[rng() % prefixes.size()];
      int extra = 1 + int(rng() % 12);
      for (int k = 0; k < extra; ++k) toks.push_back(int32_t(rng() % 3));
      hits += sim.run_request(toks) > 0;
    }
    EXPECT_GT(hits, 100);
    // Idle: everything the tree holds is evictable and the pool returns to full.
    EXPECT_EQ(sim.cache.protected_pages(), 0);
    EXPECT_EQ(sim.alloc.num_free() + sim.cache.total_pages(), 64);
    EXPECT_TRUE(sim.cache.reset());
    EXPECT_EQ(sim.alloc.num_free(), 64);
  }
}

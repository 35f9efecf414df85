#pragma once
// Prefix cache over token ids, page-granular: every node holds a run of whole
// pages (its key is a multiple of page_size tokens), so a shared system
// prompt or a multi-turn history is computed once and its pages are reused.
//
// Ownership: pages inside the tree belong to the tree. A request that reuses
// a prefix locks the node where its match ends (lock counts go up the path
// to the root, so every ancestor of a locked node is locked too); only
// unlocked leaves are evicted, least recently used first, and their pages go
// back to the allocator.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "runtime/page_allocator.h"

namespace mlaserve::runtime {

class RadixCache {
 public:
  struct Node {
    std::vector<int32_t> key;    // tokens, key.size() == pages.size() * page_size
    std::vector<int32_t> pages;
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;  // by first page of key
    int lock_ref = 0;
    uint64_t last_access = 0;
  };

  struct Match {
    std::vector<int32_t> pages;  // the cached prefix's pages, in order
    Node* node = nullptr;        // where the match ends (root when nothing matched)
    int num_tokens() const { return int(pages.size()) * page_size; }
    int page_size = 1;
  };

  RadixCache(PageAllocator& allocator);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // Longest cached prefix of `tokens` in whole pages. Splits a node when the
  // match ends inside it, so the returned node covers exactly the match.
  Match match_prefix(std::span<const int32_t> tokens);
  // Same length as match_prefix would give, without touching the tree
  // (for ordering the queue by longest prefix).
  int prefix_length(std::span<const int32_t> tokens) const;

  void lock(Node* node);
  void unlock(Node* node);

  // Adds tokens[0 : pages.size() * page_size] backed by `pages`. Returns how
  // many leading tokens were already cached: the tree keeps its own pages
  // for those, and the caller still owns (and must free or keep) its pages
  // for that range; the pages past it now belong to the tree.
  int insert(std::span<const int32_t> tokens, std::span<const int32_t> pages);

  // Frees up to `num_pages` pages from unlocked leaves, LRU first; returns
  // how many pages were freed.
  int evict(int num_pages);
  // Drops every unlocked node (POST /flush_cache). False when something is
  // locked (requests are running), in which case nothing changes.
  bool reset();

  int evictable_pages() const { return evictable_pages_; }
  int protected_pages() const { return protected_pages_; }
  int total_pages() const { return evictable_pages_ + protected_pages_; }
  int page_size() const { return allocator_.page_size(); }

  // Appends every page the tree owns (for whole-pool invariant checks).
  void collect_pages(std::vector<int32_t>& out) const;
  // Throws mlaserve::Error describing the first broken invariant: counters
  // match a recount, lock counts are monotone towards the root, keys are
  // whole pages, children are keyed by their first page, tree pages are
  // allocated and appear once.
  void check_invariants() const;

 private:
  std::vector<int32_t> first_page(std::span<const int32_t> tokens) const;
  // Number of whole pages on which `node->key` and `tokens` agree.
  int matching_pages(const Node& node, std::span<const int32_t> tokens) const;
  Node* split(Node* node, int keep_pages);
  void remove_leaf(Node* leaf);
  void touch(Node* node);

  PageAllocator& allocator_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  int evictable_pages_ = 0;
  int protected_pages_ = 0;
};

}  // namespace mlaserve::runtime

#include "runtime/radix_cache.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_set>

#include "core/error.h"

namespace mlaserve::runtime {

RadixCache::RadixCache(PageAllocator& allocator) : allocator_(allocator), root_(std::make_unique<Node>()) {
  // The root is never evicted: it holds no pages and stays locked.
  root_->lock_ref = 1;
}

RadixCache::~RadixCache() = default;

std::vector<int32_t> RadixCache::first_page(std::span<const int32_t> tokens) const {
  return {tokens.begin(), tokens.begin() + page_size()};
}

int RadixCache::matching_pages(const Node& node, std::span<const int32_t> tokens) const {
  const int ps = page_size();
  int n = std::min(int(node.pages.size()), int(tokens.size()) / ps);
  for (int p = 0; p < n; ++p) {
    if (!std::equal(node.key.begin() + p * ps, node.key.begin() + (p + 1) * ps, tokens.begin() + p * ps))
      return p;
  }
  return n;
}

void RadixCache::touch(Node* node) {
  ++clock_;
  for (Node* n = node; n; n = n->parent) n->last_access = clock_;
}

RadixCache::Match RadixCache::match_prefix(std::span<const int32_t> tokens) {
  Match m;
  m.page_size = page_size();
  Node* node = root_.get();
  const int ps = page_size();
  while (int(tokens.size()) >= ps) {
    auto it = node->children.find(first_page(tokens));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    int k = matching_pages(*child, tokens);
    if (k < int(child->pages.size())) child = split(child, k);
    m.pages.insert(m.pages.end(), child->pages.begin(), child->pages.end());
    tokens = tokens.subspan(size_t(k) * ps);
    node = child;
  }
  m.node = node;
  touch(node);
  return m;
}

int RadixCache::prefix_length(std::span<const int32_t> tokens) const {
  const Node* node = root_.get();
  const int ps = page_size();
  int matched = 0;
  while (int(tokens.size()) >= ps) {
    auto it = node->children.find(first_page(tokens));
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    int k = matching_pages(*child, tokens);
    matched += k * ps;
    if (k < int(child->pages.size())) break;
    tokens = tokens.subspan(size_t(k) * ps);
    node = child;
  }
  return matched;
}

RadixCache::Node* RadixCache::split(Node* node, int keep_pages) {
  // node (pages [0, n)) becomes mid (pages [0, keep)) -> node (pages [keep, n)).
  MLA_CHECK(keep_pages > 0 && keep_pages < int(node->pages.size()), "radix split at page {} of {}",
            keep_pages, node->pages.size());
  const int ps = page_size();
  Node* parent = node->parent;
  auto mid = std::make_unique<Node>();
  mid->key.assign(node->key.begin(), node->key.begin() + keep_pages * ps);
  mid->pages.assign(node->pages.begin(), node->pages.begin() + keep_pages);
  mid->parent = parent;
  mid->lock_ref = node->lock_ref;
  mid->last_access = node->last_access;
  auto self = std::move(parent->children.at(first_page(node->key)));
  node->key.erase(node->key.begin(), node->key.begin() + keep_pages * ps);
  node->pages.erase(node->pages.begin(), node->pages.begin() + keep_pages);
  node->parent = mid.get();
  Node* mid_raw = mid.get();
  mid->children.emplace(first_page(node->key), std::move(self));
  parent->children[first_page(mid_raw->key)] = std::move(mid);
  return mid_raw;
}

void RadixCache::lock(Node* node) {
  for (Node* n = node; n != root_.get(); n = n->parent) {
    if (n->lock_ref++ == 0) {
      evictable_pages_ -= int(n->pages.size());
      protected_pages_ += int(n->pages.size());
    }
  }
}

void RadixCache::unlock(Node* node) {
  for (Node* n = node; n != root_.get(); n = n->parent) {
    MLA_CHECK(n->lock_ref > 0, "radix cache: unlock of an unlocked node");
    if (--n->lock_ref == 0) {
      evictable_pages_ += int(n->pages.size());
      protected_pages_ -= int(n->pages.size());
    }
  }
}

int RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> pages) {
  const int ps = page_size();
  MLA_CHECK(tokens.size() >= pages.size() * size_t(ps), "radix insert: {} pages but only {} tokens",
            pages.size(), tokens.size());
  tokens = tokens.first(pages.size() * size_t(ps));
  Node* node = root_.get();
  int matched = 0;
  while (!tokens.empty()) {
    auto it = node->children.find(first_page(tokens));
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->key.assign(tokens.begin(), tokens.end());
      leaf->pages.assign(pages.begin() + matched / ps, pages.end());
      leaf->parent = node;
      evictable_pages_ += int(leaf->pages.size());
      Node* raw = leaf.get();
      node->children.emplace(first_page(tokens), std::move(leaf));
      touch(raw);
      return matched;
    }
    Node* child = it->second.get();
    int k = matching_pages(*child, tokens);
    if (k < int(child->pages.size())) child = split(child, k);
    matched += k * ps;
    tokens = tokens.subspan(size_t(k) * ps);
    node = child;
  }
  touch(node);
  return matched;
}

void RadixCache::remove_leaf(Node* leaf) {
  evictable_pages_ -= int(leaf->pages.size());
  allocator_.free(leaf->pages);
  Node* parent = leaf->parent;
  parent->children.erase(first_page(leaf->key));
}

int RadixCache::evict(int num_pages) {
  auto older = [](const Node* a, const Node* b) { return a->last_access > b->last_access; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(older)> leaves(older);
  std::function<void(Node*)> collect = [&](Node* n) {
    if (n->children.empty()) {
      if (n->lock_ref == 0) leaves.push(n);
      return;
    }
    for (auto& [_, c] : n->children) collect(c.get());
  };
  collect(root_.get());
  int freed = 0;
  while (freed < num_pages && !leaves.empty()) {
    Node* leaf = leaves.top();
    leaves.pop();
    Node* parent = leaf->parent;
    freed += int(leaf->pages.size());
    remove_leaf(leaf);
    if (parent != root_.get() && parent->children.empty() && parent->lock_ref == 0) leaves.push(parent);
  }
  return freed;
}

bool RadixCache::reset() {
  if (protected_pages_ > 0) return false;
  evict(total_pages());
  return true;
}

void RadixCache::collect_pages(std::vector<int32_t>& out) const {
  std::function<void(const Node*)> walk = [&](const Node* n) {
    out.insert(out.end(), n->pages.begin(), n->pages.end());
    for (auto& [_, c] : n->children) walk(c.get());
  };
  walk(root_.get());
}

void RadixCache::check_invariants() const {
  int evictable = 0, protected_ = 0;
  std::unordered_set<int32_t> seen;
  const int ps = page_size();
  std::function<void(const Node*)> walk = [&](const Node* n) {
    if (n != root_.get()) {
      MLA_CHECK(!n->pages.empty(), "radix invariant: empty non-root node");
      MLA_CHECK(n->key.size() == n->pages.size() * size_t(ps), "radix invariant: key of {} tokens for {} pages",
                n->key.size(), n->pages.size());
      MLA_CHECK(n->lock_ref >= 0, "radix invariant: negative lock count");
      MLA_CHECK(n->lock_ref <= n->parent->lock_ref || n->parent == root_.get(),
                "radix invariant: child locked more than its parent");
      (n->lock_ref > 0 ? protected_ : evictable) += int(n->pages.size());
      for (int32_t p : n->pages) {
        MLA_CHECK(allocator_.in_use(p), "radix invariant: tree page {} is free in the allocator", p);
        MLA_CHECK(seen.insert(p).second, "radix invariant: page {} appears twice in the tree", p);
      }
    }
    for (auto& [k, c] : n->children) {
      MLA_CHECK(c->parent == n, "radix invariant: broken parent link");
      MLA_CHECK(k == first_page(c->key), "radix invariant: child keyed by the wrong first page");
      walk(c.get());
    }
  };
  walk(root_.get());
  MLA_CHECK(evictable == evictable_pages_ && protected_ == protected_pages_,
            "radix invariant: counters say {} evictable / {} protected, recount {} / {}", evictable_pages_,
            protected_pages_, evictable, protected_);
}

}  // namespace mlaserve::runtime

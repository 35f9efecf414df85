#pragma once
// A caching device allocator: freed blocks go back to a free list of their
// size class and are reused, so after the first step of each shape no
// cudaMalloc happens on the step path (same-stream reuse is safe: the
// stream orders the old use before the new one). Graph capture uses a
// private pool per graph, whose blocks stay reserved for the graph's replays.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace mlaserve::cuda {

class DeviceAllocator : public std::enable_shared_from_this<DeviceAllocator> {
 public:
  struct Pool {
    std::map<size_t, std::vector<void*>> free_blocks;
  };

  ~DeviceAllocator();

  // A block of at least `bytes`, returned to the current pool when the last
  // owner drops the shared_ptr.
  std::shared_ptr<void> allocate(size_t bytes);

  // Allocations between these calls come from (and return to) `pool`.
  void use_pool(std::shared_ptr<Pool> pool);
  void use_default_pool();

  // cudaMalloc calls so far (tests check it stays constant in steady state).
  int64_t device_mallocs() const { return mallocs_; }
  size_t reserved_bytes() const { return reserved_; }

 private:
  static size_t size_class(size_t bytes);

  std::mutex mu_;
  std::shared_ptr<Pool> default_pool_ = std::make_shared<Pool>();
  std::shared_ptr<Pool> pool_ = default_pool_;
  std::vector<std::shared_ptr<Pool>> all_pools_{default_pool_};
  int64_t mallocs_ = 0;
  size_t reserved_ = 0;
};

}  // namespace mlaserve::cuda

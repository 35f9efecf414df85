#include "kernels/cuda/device_allocator.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {

DeviceAllocator::~DeviceAllocator() {
  for (auto& pool : all_pools_)
    for (auto& [size, blocks] : pool->free_blocks)
      for (void* p : blocks) cudaFree(p);
}

size_t DeviceAllocator::size_class(size_t bytes) {
  // 512 B granules up to 1 MiB, 2 MiB granules above: few classes, <0.2% waste for big tensors.
  if (bytes <= (size_t(1) << 20)) return (bytes + 511) / 512 * 512;
  return (bytes + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);
}

std::shared_ptr<void> DeviceAllocator::allocate(size_t bytes) {
  const size_t cls = size_class(bytes ? bytes : 1);
  void* p = nullptr;
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool = pool_;
    auto& list = pool->free_blocks[cls];
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
    }
  }
  if (!p) {
    const cudaError_t err = cudaMalloc(&p, cls);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      raise_error("CUDA out of memory allocating " + std::to_string(cls) + " bytes (" +
                  std::to_string(reserved_ >> 20) + " MiB already reserved by the allocator): " +
                  cudaGetErrorString(err));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++mallocs_;
    reserved_ += cls;
  }
  std::weak_ptr<DeviceAllocator> self = weak_from_this();
  return std::shared_ptr<void>(p, [self, pool, cls](void* q) {
    if (auto alloc = self.lock()) {
      std::lock_guard<std::mutex> lock(alloc->mu_);
      pool->free_blocks[cls].push_back(q);
    } else {
      cudaFree(q);
    }
  });
}

void DeviceAllocator::use_pool(std::shared_ptr<Pool> pool) {
  std::lock_guard<std::mutex> lock(mu_);
  bool known = false;
  for (auto& p : all_pools_) known |= p == pool;
  if (!known) all_pools_.push_back(pool);
  pool_ = std::move(pool);
}

void DeviceAllocator::use_default_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  pool_ = default_pool_;
}

}  // namespace mlaserve::cuda

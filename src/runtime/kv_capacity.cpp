#include "runtime/kv_capacity.h"

#include <unistd.h>

#include <algorithm>

#include "core/error.h"

#ifdef MLASERVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mlaserve::runtime {

namespace {

// NOTES: on CPU the "device" is host RAM shared with everything else, and a
// CPU step over millions of cached tokens would take minutes anyway, so the
// fraction-derived pool is capped; pass --max-total-tokens for more.
constexpr int64_t kCpuMaxDefaultTokens = int64_t(1) << 20;

size_t device_memory_bytes(Device d) {
#ifdef MLASERVE_WITH_CUDA
  if (d == Device::CUDA) {
    size_t free_b = 0, total_b = 0;
    MLA_CHECK(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess, "cudaMemGetInfo failed");
    return total_b;
  }
#endif
  MLA_CHECK(d == Device::CPU, "no memory query for this device");
  return size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
}

}  // namespace

size_t kv_bytes_per_token(const ModelConfig& c, DType act_dtype, KvCacheDtype d) {
  return size_t(c.num_hidden_layers) * kv_cache_format(c, act_dtype, d).slot_bytes();
}

KvCapacity plan_kv_capacity(const ModelConfig& c, const KvCapacityRequest& r) {
  MLA_CHECK(r.page_size >= 1, "--page-size must be >= 1, got {}", r.page_size);
  KvCapacity k;
  k.bytes_per_token = kv_bytes_per_token(c, r.act_dtype, r.kv_cache_dtype);
  int64_t tokens;
  if (r.max_total_tokens) {
    MLA_CHECK(*r.max_total_tokens >= r.page_size, "--max-total-tokens {} is less than one page of {} tokens",
              *r.max_total_tokens, r.page_size);
    tokens = *r.max_total_tokens;
  } else {
    MLA_CHECK(r.mem_fraction_static > 0 && r.mem_fraction_static < 1, "--mem-fraction-static must be in (0, 1), got {}",
              r.mem_fraction_static);
    k.device_memory = device_memory_bytes(r.device);
    double budget = r.mem_fraction_static * double(k.device_memory) - double(r.weight_bytes);
    MLA_CHECK(budget >= double(k.bytes_per_token) * r.page_size,
              "--mem-fraction-static {} of {:.1f} GiB leaves no room for the KV cache after {:.2f} GiB of weights",
              r.mem_fraction_static, double(k.device_memory) / (1 << 30), double(r.weight_bytes) / (1 << 30));
    tokens = int64_t(budget / double(k.bytes_per_token));
    if (r.device == Device::CPU) tokens = std::min(tokens, kCpuMaxDefaultTokens);
  }
  // Slots are int32 in ForwardBatch.
  tokens = std::min<int64_t>(tokens, INT32_MAX - r.page_size);
  k.num_pages = int(tokens / r.page_size);
  k.tokens = int64_t(k.num_pages) * r.page_size;
  return k;
}

}  // namespace mlaserve::runtime

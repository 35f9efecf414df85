#pragma once
// How many latent-cache tokens fit: from --max-total-tokens when given,
// else from --mem-fraction-static of the device memory minus the weights
// (SGLang's meaning: the fraction holds weights plus KV pool).
#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "io/model_config.h"
#include "model/kv_cache.h"

namespace mlaserve::runtime {

struct KvCapacityRequest {
  std::optional<int64_t> max_total_tokens;
  double mem_fraction_static = 0.85;
  int page_size = 1;
  Device device = Device::CPU;
  DType act_dtype = DType::F32;  // the backend's activations (what auto means)
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
  size_t weight_bytes = 0;
};

struct KvCapacity {
  int num_pages = 0;
  int64_t tokens = 0;
  size_t bytes_per_token = 0;
  size_t device_memory = 0;  // what the fraction was taken of (0 when not used)
};

// All layers' cache bytes for one token (an fp8 cache's slots included).
size_t kv_bytes_per_token(const ModelConfig& c, DType act_dtype, KvCacheDtype d);
// Throws mlaserve::Error when nothing fits (naming the numbers).
KvCapacity plan_kv_capacity(const ModelConfig& c, const KvCapacityRequest& r);

}  // namespace mlaserve::runtime

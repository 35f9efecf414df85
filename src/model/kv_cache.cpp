#include "model/kv_cache.h"

#include <numeric>

#include "core/error.h"

namespace mlaserve {

std::vector<Tensor> allocate_kv_cache(Backend& backend, const ModelConfig& c, int num_slots) {
  MLA_CHECK(num_slots > 0, "kv cache needs at least one slot, got {}", num_slots);
  std::vector<Tensor> cache;
  for (int i = 0; i < c.num_hidden_layers; ++i)
    cache.push_back(backend.alloc({num_slots, c.kv_cache_width()}, backend.act_dtype()));
  return cache;
}

Tensor allocate_mtp_cache(Backend& backend, const ModelConfig& c, int num_slots) {
  MLA_CHECK(num_slots > 0, "kv cache needs at least one slot, got {}", num_slots);
  return backend.alloc({num_slots, c.kv_cache_width()}, backend.act_dtype());
}

ForwardBatch contiguous_sequence_batch(std::span<const int32_t> new_ids, int32_t start, bool all_logits) {
  const int32_t n = int32_t(new_ids.size());
  MLA_CHECK(n > 0 && start >= 0, "a batch needs at least one new token at a non-negative position");
  ForwardBatch b;
  b.input_ids.assign(new_ids.begin(), new_ids.end());
  b.positions.resize(size_t(n));
  std::iota(b.positions.begin(), b.positions.end(), start);
  b.out_slots = b.positions;
  b.q_indptr = {0, n};
  b.kv_indptr = {0, start + n};
  b.kv_slots.resize(size_t(start + n));
  std::iota(b.kv_slots.begin(), b.kv_slots.end(), 0);
  if (all_logits) {
    b.logit_rows.resize(size_t(n));
    std::iota(b.logit_rows.begin(), b.logit_rows.end(), 0);
  } else {
    b.logit_rows = {n - 1};
  }
  return b;
}

}  // namespace mlaserve

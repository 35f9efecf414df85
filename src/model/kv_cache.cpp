#include "model/kv_cache.h"

#include <numeric>

#include "core/error.h"
#include "kernels/fp8_kv_layout.h"

namespace mlaserve {

KvCacheDtype parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return KvCacheDtype::Auto;
  if (name == "bf16") return KvCacheDtype::BF16;
  if (name == "fp8_e4m3") return KvCacheDtype::Fp8E4M3;
  MLA_CHECK(false, "--kv-cache-dtype must be auto, bf16 or fp8_e4m3, got '{}'", name);
  return KvCacheDtype::Auto;
}

std::string_view kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::Auto: return "auto";
    case KvCacheDtype::BF16: return "bf16";
    case KvCacheDtype::Fp8E4M3: return "fp8_e4m3";
  }
  return "?";
}

KvCacheFormat kv_cache_format(const ModelConfig& c, DType act_dtype, KvCacheDtype d) {
  if (d == KvCacheDtype::Fp8E4M3) {
    const Fp8KvLayout layout{c.kv_lora_rank, c.qk_rope_head_dim};
    check_fp8_kv_layout(layout);
    return {DType::U8, layout.slot_bytes()};
  }
  MLA_CHECK(d == KvCacheDtype::Auto || act_dtype == DType::BF16,
            "--kv-cache-dtype bf16 needs a backend with bf16 activations (this one computes in {}; use auto or "
            "fp8_e4m3)", dtype_name(act_dtype));
  return {act_dtype, c.kv_cache_width()};
}

std::vector<Tensor> allocate_kv_cache(Backend& backend, const ModelConfig& c, int num_slots, KvCacheDtype d) {
  MLA_CHECK(num_slots > 0, "kv cache needs at least one slot, got {}", num_slots);
  const KvCacheFormat f = kv_cache_format(c, backend.act_dtype(), d);
  std::vector<Tensor> cache;
  for (int i = 0; i < c.num_hidden_layers; ++i) cache.push_back(backend.alloc({num_slots, f.slot_width}, f.dtype));
  return cache;
}

Tensor allocate_mtp_cache(Backend& backend, const ModelConfig& c, int num_slots, KvCacheDtype d) {
  MLA_CHECK(num_slots > 0, "kv cache needs at least one slot, got {}", num_slots);
  const KvCacheFormat f = kv_cache_format(c, backend.act_dtype(), d);
  return backend.alloc({num_slots, f.slot_width}, f.dtype);
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

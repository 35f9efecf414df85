#pragma once
// The simplest latent-cache layout: one contiguous run of slots per
// sequence (slot = position), which is all `generate` and the model tests
// need. The paged pool and radix cache live in the runtime.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "io/model_config.h"
#include "kernels/backend.h"
#include "kernels/forward_batch.h"

namespace mlaserve {

// --kv-cache-dtype (SGLang's flag): auto = the backend's activation dtype
// (bf16 on CUDA, f32 on CPU); fp8_e4m3 = kernels/fp8_kv_layout.h's slots.
enum class KvCacheDtype { Auto, BF16, Fp8E4M3 };
// "auto" | "bf16" | "fp8_e4m3"; throws naming the accepted values otherwise.
KvCacheDtype parse_kv_cache_dtype(std::string_view name);
std::string_view kv_cache_dtype_name(KvCacheDtype d);

// What one layer's cache tensor is: {slots, slot_width} of dtype. bf16/f32:
// slot_width = kv_lora_rank + qk_rope_head_dim; fp8: U8 and the slot's bytes.
struct KvCacheFormat {
  DType dtype = DType::F32;
  int64_t slot_width = 0;
  size_t slot_bytes() const { return size_t(slot_width) * dtype_size(dtype); }
};
// Throws when the backend's ops cannot hold that dtype (bf16 on the CPU
// backend, whose activations are f32) or the model's widths do not fit
// the fp8 layout.
KvCacheFormat kv_cache_format(const ModelConfig& c, DType act_dtype, KvCacheDtype d);

// One cache tensor per decoder layer (uninitialized: only slots a batch
// wrote are ever read).
std::vector<Tensor> allocate_kv_cache(Backend& backend, const ModelConfig& c, int num_slots,
                                      KvCacheDtype d = KvCacheDtype::Auto);
// The MTP block's cache: one tensor of the same format.
Tensor allocate_mtp_cache(Backend& backend, const ModelConfig& c, int num_slots, KvCacheDtype d = KvCacheDtype::Auto);

// A one-sequence batch appending `new_ids` at positions start .. start + n - 1,
// cached at the slots of the same numbers; logits for the last token, or for
// every new token when `all_logits`.
ForwardBatch contiguous_sequence_batch(std::span<const int32_t> new_ids, int32_t start, bool all_logits);

}  // namespace mlaserve

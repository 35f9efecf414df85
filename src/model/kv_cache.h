#pragma once
// The simplest latent-cache layout: one contiguous run of slots per
// sequence (slot = position), which is all `generate` and the model tests
// need. The paged pool and radix cache live in the runtime.
#include <cstdint>
#include <span>
#include <vector>

#include "io/model_config.h"
#include "kernels/backend.h"
#include "kernels/forward_batch.h"

namespace mlaserve {

// One {num_slots, kv_lora_rank + qk_rope_head_dim} act_dtype tensor per
// decoder layer (uninitialized: only slots a batch wrote are ever read).
std::vector<Tensor> allocate_kv_cache(Backend& backend, const ModelConfig& c, int num_slots);
// The MTP block's cache: one tensor of the same row width.
Tensor allocate_mtp_cache(Backend& backend, const ModelConfig& c, int num_slots);

// A one-sequence batch appending `new_ids` at positions start .. start + n - 1,
// cached at the slots of the same numbers; logits for the last token, or for
// every new token when `all_logits`.
ForwardBatch contiguous_sequence_batch(std::span<const int32_t> new_ids, int32_t start, bool all_logits);

}  // namespace mlaserve

#pragma once
// One static batch as sglang.bench_one_batch runs it: batch_size sequences
// of input_len tokens prefilled in one step, then output_len greedy decode
// steps, straight on the model runner (no scheduler), each sequence in its
// own contiguous run of cache slots.
#include <cstdint>
#include <vector>

#include "kernels/forward_batch.h"

namespace mlaserve::runtime {

// The prefill step: every sequence's prompt, logits for each last token.
ForwardBatch static_prefill_batch(const std::vector<std::vector<int32_t>>& prompts, int slots_per_seq);
// One decode step: sequence b appends tokens[b] at position lens[b].
ForwardBatch static_decode_batch(const std::vector<int32_t>& tokens, const std::vector<int32_t>& lens,
                                 int slots_per_seq);

}  // namespace mlaserve::runtime

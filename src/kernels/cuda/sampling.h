#pragma once
// Sampling on the GPU, so that only token ids cross to the host.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mlaserve::cuda {

// ids[r] = argmax over logits{rows, vocab}[r] (lowest index on ties), in two
// launches: each row's slices in parallel, then the slices' best; workspace
// holds greedy_argmax_workspace_bytes(rows, vocab).
size_t greedy_argmax_workspace_bytes(int64_t rows, int64_t vocab);
void greedy_argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, void* workspace,
                   cudaStream_t stream);

// Per-row sampling parameters (device array, one per row), as the runtime's
// SamplingParams: temperature <= 1e-5 or top_k == 1 means greedy.
struct RowSamplingParams {
  float temperature = 1.0f;
  int top_k = -1;       // <= 0: no limit
  float top_p = 1.0f;
  float min_p = 0.0f;
  float uniform = 0.0f;  // in [0, 1): the draw for this row
};

// Weights w = exp((logit - max) / T); keep the top_k largest, then those with
// w >= min_p (w's maximum is 1), then the smallest set of the largest whose
// mass reaches top_p of what is left (ties at a boundary weight all stay);
// pick the token where the running sum of kept weights, in vocabulary order,
// first exceeds uniform * their total.
void sample_tokens(const float* logits, int64_t rows, int64_t vocab, const RowSamplingParams* params, int32_t* ids,
                   cudaStream_t stream);

}  // namespace mlaserve::cuda

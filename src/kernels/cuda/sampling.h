#pragma once
// Sampling on the GPU, so that only token ids cross to the host.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

// ids[r] = argmax over logits{rows, vocab}[r] (lowest index on ties).
void greedy_argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, cudaStream_t stream);

}  // namespace mlaserve::cuda

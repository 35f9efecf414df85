#pragma once
// Rotary position embedding for MLA's q_pe / k_pe in DeepSeek's interleaved
// layout: the pair (x[2i], x[2i+1]) rotates by positions[t] * inv_freq[i],
// in place. The model computes inv_freq (YaRN included) and the cos/sin
// scale (YaRN's attention factor); see Backend::rope.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

// In place on x{T, heads, row_stride}: rotates x[t, h, offset : offset + 2F].
void rope_inplace(__nv_bfloat16* x, int64_t num_tokens, int64_t heads, int64_t row_stride, int64_t offset,
                  const int32_t* positions, const float* inv_freq, int num_freqs, float cos_sin_scale,
                  cudaStream_t stream);

}  // namespace mlaserve::cuda

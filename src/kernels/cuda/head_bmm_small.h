#pragma once
// Absorbed MLA's per-head products for decode-sized batches:
// out{T, H, No}[:, :, :N] = x{T, H, Kx}[:, :, :K] · w[h] with w {H, K, N}
// (q_nope · W_UK) or {H, N, K} (o_latent · W_UVᵀ), T <= kHeadBmmSmallMaxTokens.
// Pure weight streaming like skinny_gemm: many blocks each read a slice of
// w once with 16-byte loads (the first ones before waiting for the previous
// kernel) and dot it with the few x rows, staged in shared memory as f32.
// cuBLASLt's batched GEMM takes ~8 us for the 2 MB of a V2-Lite layer.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

constexpr int kHeadBmmSmallMaxTokens = 8;
constexpr int kHeadBmmSmallMaxK = 512;

// True when the kernel takes the shape: 1..8 tokens, K <= 512, the
// contiguous weight dimension (N, or K when transposed) a multiple of 8 and
// w 16-byte aligned.
bool head_bmm_small_applies(const __nv_bfloat16* w, bool transpose_w, int64_t tokens, int64_t k, int64_t n);

void head_bmm_small(const __nv_bfloat16* x, const __nv_bfloat16* w, bool transpose_w, int64_t tokens, int64_t heads,
                    int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out, int64_t out_head_stride,
                    cudaStream_t stream);

}  // namespace mlaserve::cuda

#pragma once
// Absorbed MLA's per-head products from block-FP8 weights (SGLang's "FP8
// BMM", without quantizing the activations): w {H, N, K} e4m3 with f32
// scales {H * N / 128, K / 128} (scale[(h * N + n) / 128][k / 128]),
//   out{T, H, No}[:, :, :N] = x{T, H, Kx}[:, :, :K] · (w[h] * scale)ᵀ.
// MLA keeps W_UK transposed per head {H, L, Dn} and W_UV {H, Dv, L} this way
// (model/layer_weights.h): half the bytes of the bf16 copy a decode step
// read before.
// - Up to kHeadBmmFp8StreamTokens tokens (K <= 512): weight streaming, many blocks each
//   reading 16 e4m3 bytes a lane (all before the PDL wait), widened to f32 in
//   registers with the block scale.
// - More: tensor cores (mma.sync bf16): a block widens 64 (quantized output:
//   128) weight rows of one 128-wide K block to bf16 in shared memory, the
//   values a bf16 copy made at load time would hold, and multiplies 64 (32)
//   token rows with them.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

// Streaming wins up to 2 tokens (V3 widths, H100: 4.3 / 4.5 us at 1 token
// against 8.8 / 10.2 on tensor cores), tensor cores from 4 (8.9 against 12.2).
constexpr int kHeadBmmFp8StreamTokens = 2;

// Which kernel runs: Auto picks by token count; the others force one (tests, benchmarks).
enum class HeadBmmFp8Path { Auto, Stream, Mma };

// True when the kernels take the shape: K and N multiples of 128.
bool head_bmm_fp8_applies(int64_t k, int64_t n);

// True when Auto picks the streaming kernel.
bool head_bmm_fp8_streams(int64_t tokens, int64_t k);

// mla_prepare's q split riding in the streaming kernel's launch (the
// absorbed attention's q rows beside q_nope · W_UK): for each token t, head
// h and frequency i, out[(t * heads + h) * out_width + 2i, + 1] = the pair
// q[t * q_stride + h * (nope_dim + 2 * num_freqs) + nope_dim + 2i, + 1]
// rotated at positions[t], the bits mla_prepare writes.
struct HeadBmmFp8Rope {
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride = 0;
  int nope_dim = 0, num_freqs = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float cos_sin_scale = 1.0f;
  __nv_bfloat16* out = nullptr;
  int64_t out_width = 0;
};

// rope (streaming kernel only): also writes the q split's pairs.
void head_bmm_fp8(const __nv_bfloat16* x, const uint8_t* w, const float* w_scale, int64_t tokens, int64_t heads,
                  int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out, int64_t out_head_stride,
                  cudaStream_t stream, HeadBmmFp8Path path = HeadBmmFp8Path::Auto,
                  const HeadBmmFp8Rope* rope = nullptr);

// The tensor-core product for N = 128 with its rows quantized 1x128 for a
// block-FP8 linear over {T, H * 128} (fp8_quant.h's layout: q{T, H * 128},
// scale[h * scale_ld + t]; padding rows are the caller's): the bf16 values
// head_bmm_fp8 writes, quantized as quantize_fp8_act would, so o_proj takes
// W_UV's output with no quantization pass.
void head_bmm_fp8_quantized(const __nv_bfloat16* x, const uint8_t* w, const float* w_scale, int64_t tokens,
                            int64_t heads, int64_t x_head_stride, int64_t k, int64_t n, uint8_t* q, float* scale,
                            int64_t scale_ld, cudaStream_t stream);

}  // namespace mlaserve::cuda

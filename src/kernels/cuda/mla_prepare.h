#pragma once
// Backend::mla_prepare in one launch: one block per (token, part), the parts
// being the latent write (kv_a_layernorm of c_kv, rope of k_pe, the row
// stored at its cache slot), the q_a norm and the q split (rope of each head's
// q_pe, copy of q_nope). The arithmetic is rms_norm's and rope's, so results
// equal the unfused ops up to the order of the norm's sum.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

// Pointers already point at the part's first column; strides are in elements.
// A part with a null output is skipped.
struct MlaPrepareParams {
  const int32_t* positions = nullptr;  // {T}
  const int32_t* out_slots = nullptr;  // {T}
  const float* inv_freq = nullptr;     // {F}, R = 2F
  int num_tokens = 0, num_freqs = 0;
  float cos_sin_scale = 1.0f, eps = 1e-6f;

  // Latent write: cache[out_slots[t]] = [norm(kv[t, :L]) | rope(kv[t, L : L + R])].
  const __nv_bfloat16* kv = nullptr;
  const __nv_bfloat16* kv_norm = nullptr;  // {L}
  __nv_bfloat16* cache = nullptr;          // {S, L + R}
  // Or an FP8 cache (kernels/fp8_kv_layout.h) of the same rows: the row is
  // formed in bf16 as for the bf16 cache, then quantized (cache is null).
  uint8_t* fp8_cache = nullptr;  // {S, Fp8KvLayout{L, R}.slot_bytes()}
  int64_t kv_stride = 0;
  int latent_dim = 0;

  // q_a norm: q_a_out[t] = norm(q_a[t, :Q]).
  const __nv_bfloat16* q_a = nullptr;
  const __nv_bfloat16* q_a_norm = nullptr;  // {Q}
  __nv_bfloat16* q_a_out = nullptr;         // {T, Q}
  int64_t q_a_stride = 0;
  int q_a_dim = 0;
  // Or (q_a_out null) the normed rows quantized 1x128 for a block-FP8 q_b
  // (fp8_quant.h's layout; Q % 128 == 0): the bf16 rows q_a_out would hold,
  // quantized as quantize_fp8_act would. Padding rows are the caller's.
  uint8_t* q_a_q = nullptr;      // {T, Q}
  float* q_a_scale = nullptr;    // [Q / 128][q_a_scale_ld]
  int64_t q_a_scale_ld = 0;

  // Or (partials set) q_a and kv are the fused projection's output with its
  // split-K sum not yet formed (Fp8Linear::run_bf16's deferred_splits): row
  // t's column c is bf16(the sum over s < splits, in order, of partials[(s *
  // num_tokens + t) * partials_width + c]), the bits split_k_sum_kernel would
  // write; q_a at column 0, kv at partials_kv_col. q_a and kv are unused.
  const float* partials = nullptr;
  int splits = 0;
  int64_t partials_width = 0, partials_kv_col = 0;

  // q split: head h of token t at q + t * q_stride + h * (Dn + R).
  const __nv_bfloat16* q = nullptr;
  __nv_bfloat16* q_nope_out = nullptr;  // head h at + (t * H + h) * q_nope_width, or null
  __nv_bfloat16* q_pe_out = nullptr;    // head h at + (t * H + h) * q_pe_width
  int64_t q_stride = 0, q_nope_width = 0, q_pe_width = 0;
  int num_heads = 0, nope_dim = 0;
};

void mla_prepare(const MlaPrepareParams& p, cudaStream_t stream);

}  // namespace mlaserve::cuda

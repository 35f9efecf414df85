#pragma once
// MLA's absorbed-attention products from the block-FP8 kv_b_proj (SGLang's
// "FP8 BMM"). kv_b_proj is {H * (Dn + Dv), L} e4m3 with scales
// {H * (Dn + Dv) / 128, L / 128}; head h's rows are [W_UK (Dn rows) | W_UV (Dv rows)].
//   q_absorb: q_latent{T, H, L} = q_nope{T, H, Dn} · W_UK[h]   (K = Dn)
//   v_up:     out{T, H, Dv}     = o_latent{T, H, L} · W_UV[h]ᵀ (K = L)
// W_UV is used in place. W_UK is read along its rows, so it is transposed
// once at load time into {H, L, Dn}; with Dn and L multiples of 128 its
// 128x128 blocks transpose exactly (no requantization). The expanded form
// (prefill) is a plain FP8 linear on c_kv with kv_b_proj as stored.
// The activations are quantized per token per head per 128 channels.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mlaserve::cuda {

struct Fp8MlaShape {
  int heads = 0, nope_dim = 0, v_dim = 0, kv_lora_rank = 0;  // H, Dn, Dv, L (multiples of 128)
};

struct Fp8MlaWeights {
  Fp8MlaShape shape;
  const uint8_t* kv_b = nullptr;     // {H * (Dn + Dv), L}, as in the checkpoint
  const float* kv_b_scale = nullptr;  // {H * (Dn + Dv) / 128, L / 128}
  const uint8_t* w_uk_t = nullptr;   // {H, L, Dn}, from fp8_repack_w_uk
  const float* w_uk_t_scale = nullptr;  // {H, L / 128, Dn / 128}
};

size_t fp8_w_uk_t_bytes(const Fp8MlaShape& s);
size_t fp8_w_uk_t_scale_count(const Fp8MlaShape& s);
void fp8_repack_w_uk(const Fp8MlaShape& s, const uint8_t* kv_b, const float* kv_b_scale, uint8_t* w_uk_t,
                     float* w_uk_t_scale, cudaStream_t stream);

size_t fp8_mla_bmm_workspace_bytes(const Fp8MlaShape& s, int64_t tokens);

// q{T, H, q_head_stride}: q_nope is its first Dn values per head. out{T, H, L}.
void fp8_q_absorb(const Fp8MlaWeights& w, const __nv_bfloat16* q, int64_t q_head_stride, int64_t tokens,
                  __nv_bfloat16* out, void* workspace, cudaStream_t stream);
// o_latent{T, H, L} -> out{T, H, Dv}.
void fp8_v_up(const Fp8MlaWeights& w, const __nv_bfloat16* o_latent, int64_t tokens, __nv_bfloat16* out,
              void* workspace, cudaStream_t stream);

}  // namespace mlaserve::cuda

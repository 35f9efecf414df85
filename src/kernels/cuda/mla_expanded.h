#pragma once
// Non-absorbed MLA attention for prefill / extend: kv_b_proj has expanded
// the latent into per-head k_nope and v, so this is ordinary multi-head
// attention with q·k over Dn + R = 192 and v of width Dv = 128, causal within
// a sequence's new tokens and full over its cached prefix.
// Flash-attention style: a block owns a tile of query rows of one head,
// streams 64-row K/V tiles through shared memory and keeps the running
// softmax in registers. On Hopper: 192 rows on three consumer warpgroups fed
// by a TMA producer warpgroup, both products on wgmma; elsewhere 128 rows on
// 8 warps of mma.sync with double-buffered cp.async.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

struct MlaExpandedParams {
  const __nv_bfloat16* q = nullptr;     // {T, H, Dn + R}
  const __nv_bfloat16* kv = nullptr;    // {Lk, H, Dn + Dv}: [k_nope | v] per head, kv_slots order
  const __nv_bfloat16* k_pe = nullptr;  // {Lk, R}, shared by all heads
  const int32_t* q_indptr = nullptr;    // {B + 1}
  const int32_t* kv_indptr = nullptr;   // {B + 1}
  int num_seqs = 0, num_tokens = 0, num_heads = 0, max_q_len = 0;
  int64_t kv_rows = 0;  // Lk (the bounds of the Hopper kernel's tile loads)
  int nope_dim = 0, rope_dim = 0, v_dim = 0;
  float scale = 1.0f;
  __nv_bfloat16* out = nullptr;  // {T, H, Dv}
  // Or, with out_q set (the fast path, Dv = 128): each (token, head) row as
  // one 1x128 block-FP8 group for the o_proj GEMM, e4m3 {T, H Dv} and the
  // scale of token t, head h at out_scale[h * out_scale_ld + t], as
  // quantize_fp8_act forms them from the bf16 rows (fp8_quant.h).
  uint8_t* out_q = nullptr;
  float* out_scale = nullptr;
  int64_t out_scale_ld = 0;
  int sm90 = -1;  // the Hopper kernel (TMA, wgmma): 1 yes, 0 the mma.sync one, -1 where the GPU is a Hopper
};

// Dn = 128, R = 64, Dv = 128 (DeepSeek V2/V3) take the tensor-core kernel.
bool mla_expanded_has_fast_path(int nope_dim, int rope_dim, int v_dim);

void mla_attention_expanded(const MlaExpandedParams& p, cudaStream_t stream);

}  // namespace mlaserve::cuda

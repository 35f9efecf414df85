#pragma once
// Absorbed-MLA attention (decode, or any batch) over the slot-addressed latent
// cache: q{T, H, L + R} = [q_nope·W_UK | q_pe], cache{S, L + R} = [c_kv | k_pe],
// out{T, H, L} = softmax(q·cacheᵀ · scale) · c_kv, causal per sequence.
//
// One latent "KV head" serves all H query heads, so a block takes 16 heads
// (64 on Hopper when they fill it: mla_absorbed_sm90.h) of one token and
// every latent row it loads feeds all of them (FlashMLA's idea; QK and PV on
// tensor cores). Small batches split the KV sequence across
// blocks and a merge kernel combines the partial softmax results.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mlaserve::cuda {

struct MlaAbsorbedParams {
  const __nv_bfloat16* q = nullptr;      // {T, H, L + R}
  const __nv_bfloat16* cache = nullptr;  // {S, L + R}
  // Or an FP8 cache (kernels/fp8_kv_layout.h, Fp8KvLayout{L, R}) with cache
  // null: slots are dequantized to bf16 tiles in shared memory, so decode
  // reads 656 instead of 1152 bytes a token at V3 widths.
  // FP8 latent values enter the MMAs as fp16 (an exact integer widening of
  // e4m3, value x 2^-8) and the per-row, per-128 scales are applied to the
  // f32 scores and to P, so no per-value multiply or float conversion.
  const uint8_t* fp8_cache = nullptr;
  const int32_t* q_indptr = nullptr;     // {B + 1}
  const int32_t* kv_indptr = nullptr;    // {B + 1}
  const int32_t* kv_slots = nullptr;     // {kv_indptr[B]}
  int num_seqs = 0, num_tokens = 0, num_heads = 0, latent_dim = 0, rope_dim = 0;
  float scale = 1.0f;
  __nv_bfloat16* out = nullptr;  // {T, H, L}
  // Split-KV scratch (num_splits > 1): {num_splits, T, H, L} and {num_splits, T, H} f32
  // (mla_absorbed_workspace_bytes).
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int num_splits = 1;
  // The 64-head wgmma kernel (Hopper, heads a multiple of 64):
  // 1 yes, 0 the 16-head kernel, -1 wherever it fits (tests force both).
  int wide_blocks = -1;
};

// Whether the launcher picks the 64-head wgmma kernel for these widths (a
// Hopper device, heads a multiple of 64, L = 512, R = 64; either cache).
bool mla_absorbed_uses_wide_blocks(int num_heads, int latent_dim, int rope_dim);

// Splits that fill the GPU for this many tokens and heads on the kernel
// wide_blocks names. max_kv_len only caps the count (splits of a short
// context are pure latency); a captured graph passes the longest context it
// will replay, any count stays correct.
int mla_absorbed_num_splits(int num_tokens, int num_heads, int sm_count, int max_kv_len, bool wide_blocks);
size_t mla_absorbed_workspace_bytes(int num_tokens, int num_heads, int latent_dim, int num_splits);

// True for the shapes the tensor-core kernel handles (L = 512, R = 64, as in
// every DeepSeek V2/V3 checkpoint); others take a simple reference kernel.
bool mla_absorbed_has_fast_path(int latent_dim, int rope_dim);

void mla_attention_absorbed(const MlaAbsorbedParams& p, cudaStream_t stream);

}  // namespace mlaserve::cuda

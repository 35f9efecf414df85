#pragma once
// MoE router logits and expert selection in one launch for decode-sized
// batches (Backend::moe_select): one block per expert streams that router
// row (f32 accumulation, as DeepSeek computes router logits) against the
// few hidden rows; the last block to finish runs moe_router's selection
// (moe_route_token.cuh) over all tokens. Replaces a skinny GEMM and the
// router kernel, two launches of ~7 and ~10 us at batch 1.
// The block that finishes last is found with an arrival counter in a small
// persistent workspace; that block resets it, so the op is graph-safe
// (consecutive launches are ordered on the stream: each waits for the
// previous kernel to complete before touching the workspace).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/moe_router.h"

namespace mlaserve::cuda {

constexpr int kMoeSelectMaxTokens = 8;

// The logits between the two phases and the arrival counter (zero between launches).
struct MoeSelectWorkspace {
  MoeSelectWorkspace();
  DeviceBuffer logits;    // f32 {kMoeSelectMaxTokens, kMaxRoutedExperts}
  DeviceBuffer arrivals;  // one unsigned
};

// True when the fused kernel takes the shape: 1..8 tokens, at most
// kMaxRoutedExperts experts, hidden a multiple of 8, h and w 16-byte aligned.
bool moe_select_applies(const __nv_bfloat16* h, const __nv_bfloat16* w, int64_t tokens, int64_t experts,
                        int64_t hidden);

// p as for moe_route, with p.logits ignored (the workspace holds them):
// logits = h{T, hidden} · w{E, hidden}ᵀ, then the selection into p.topk_ids /
// p.topk_weights.
void moe_select(const __nv_bfloat16* h, const __nv_bfloat16* w, int64_t hidden, MoeRouteParams p,
                MoeSelectWorkspace& ws, cudaStream_t stream);

// rms_norm's post-attention norm formed in moe_select's launch
// (Backend::rms_norm_moe_select): residual{T, hidden} += x, normed =
// rmsnorm(residual) * weight, the bits rms_norm writes; then moe_select over
// normed. One launch instead of two at batch 1 (a kernel boundary on the
// critical path of every MoE layer that has no decode chain).
struct MoeSelectNorm {
  const __nv_bfloat16* x = nullptr;
  __nv_bfloat16* residual = nullptr;
  const __nv_bfloat16* weight = nullptr;  // {hidden}
  float eps = 1e-6f;
  __nv_bfloat16* normed = nullptr;
};

// moe_select_applies, one token, every row of n set and aligned, and 2048
// <= hidden <= 8192 (the row held in registers, summed as rms_norm sums it).
bool rms_norm_moe_select_applies(const MoeSelectNorm& n, const __nv_bfloat16* w, int64_t tokens, int64_t experts,
                                 int64_t hidden);

void rms_norm_moe_select(const MoeSelectNorm& n, const __nv_bfloat16* w, int64_t hidden, MoeRouteParams p,
                         MoeSelectWorkspace& ws, cudaStream_t stream);

}  // namespace mlaserve::cuda

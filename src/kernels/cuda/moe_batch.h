#pragma once
// What every fused-MoE path takes besides its expert weights (moe_experts.h's
// bf16 stacks, fp8_moe.h's block-FP8 stacks, grouped_gemm_sm90.h's Hopper
// kernels): the tokens, their routing, the widths and the output. Each
// path's parameters add their weights to it.
#include <cuda_bf16.h>

#include <cstdint>

namespace mlaserve::cuda {

struct MoeBatch {
  const __nv_bfloat16* x = nullptr;     // {T, D}
  const int32_t* topk_ids = nullptr;    // {T, k}
  const float* topk_weights = nullptr;  // {T, k}
  int num_tokens = 0, hidden = 0, inter = 0;
  int num_experts = 0;  // routed experts E
  int top_k = 0;
  int num_shared = 0;   // shared experts S (stacked after the routed ones)
  __nv_bfloat16* out = nullptr;  // {T, D}
};

}  // namespace mlaserve::cuda

#pragma once
// The whole MoE expert selection in one launch, for the three DeepSeek
// routing methods (see Backend's RouterParams): scoring (softmax or
// sigmoid), NoauxTc's correction bias, group-limited selection, top-k,
// renormalization and scaling. One warp per token.
// (.cu files cannot include backend.h, so the parameters are restated here;
// cuda_backend.cpp maps RouterParams onto them.)
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

enum class RouteMethod : int { Greedy, GroupLimitedGreedy, NoauxTc };

// The rms norm of one token's row that the decode chain leaves to the MoE
// kernels (Backend's PendingNorm): mean(row²) = sum(parts) / width. Every
// reader sums the parts in one order (moe_route_token.cuh's
// pending_norm_scale), so all of them norm with the same scale.
constexpr int kMaxNormParts = 256;
struct PendingNormParams {
  const float* parts = nullptr;  // {count}, count <= kMaxNormParts
  int count = 0, width = 0;
  float eps = 0.0f;
  const __nv_bfloat16* row = nullptr;     // {width}, before the norm
  const __nv_bfloat16* weight = nullptr;  // {width}
};

struct MoeRouteParams {
  const float* logits = nullptr;  // {T, E}
  const float* bias = nullptr;    // {E} or null (NoauxTc's e_score_correction_bias)
  int num_tokens = 0, num_experts = 0;
  RouteMethod method = RouteMethod::Greedy;
  bool sigmoid = false;  // else softmax
  int top_k = 1, n_group = 1, topk_group = 1;
  bool renormalize = false;
  float scaling = 1.0f;
  int32_t* topk_ids = nullptr;     // {T, top_k}
  float* topk_weights = nullptr;   // {T, top_k}
  // One token whose norm is pending (norm.parts set): the logits are the
  // router's times rms(norm.row), and the selection scales them back.
  PendingNormParams norm;
};

constexpr int kMaxRoutedExperts = 512;
constexpr int kMaxTopK = 16;

// Throws (naming op) unless n has parts, a row and a weight.
void require_valid_norm(const PendingNormParams& n, const char* op);
// Throws (naming op) unless p's expert count, top_k and grouping (and
// pending norm) are ones the selection handles.
void require_valid_route(const MoeRouteParams& p, const char* op);

void moe_route(const MoeRouteParams& p, cudaStream_t stream);

// Completes a pending norm where the MoE kernels do not take it:
// normed{width} = rmsnorm(norm.row) * norm.weight (rms_norm's arithmetic) and
// logits{num_experts} scaled by 1 / rms, in place.
void finish_pending_norm(const PendingNormParams& norm, float* logits, int num_experts, __nv_bfloat16* normed,
                         cudaStream_t stream);

}  // namespace mlaserve::cuda

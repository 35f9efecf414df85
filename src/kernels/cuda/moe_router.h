#pragma once
// The whole MoE expert selection in one launch, for the three DeepSeek
// routing methods (see Backend's RouterParams): scoring (softmax or
// sigmoid), NoauxTc's correction bias, group-limited selection, top-k,
// renormalization and scaling. One warp per token.
// (.cu files cannot include backend.h, so the parameters are restated here;
// cuda_backend.cpp maps RouterParams onto them.)
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

enum class RouteMethod : int { Greedy, GroupLimitedGreedy, NoauxTc };

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
};

constexpr int kMaxRoutedExperts = 512;
constexpr int kMaxTopK = 16;

// Throws (naming op) unless p's expert count, top_k and grouping are ones
// the selection handles.
void require_valid_route(const MoeRouteParams& p, const char* op);

void moe_route(const MoeRouteParams& p, cudaStream_t stream);

}  // namespace mlaserve::cuda

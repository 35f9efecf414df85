#include "kernels/cuda/moe_router.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_route_token.cuh"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

template <int kPerLane>
__global__ void moe_route_kernel(MoeRouteParams p) {
  pdl_enter();
  __shared__ float sel_s[kWarpsPerBlock][32 * kPerLane];  // selection scores (+ bias)
  __shared__ bool group_kept[kWarpsPerBlock][32];
  const int warp = threadIdx.x / 32;
  const int t = blockIdx.x * kWarpsPerBlock + warp;
  if (t >= p.num_tokens) return;
  route_token<kPerLane>(p, t, sel_s[warp], group_kept[warp]);
}

constexpr int kFinishThreads = 256;

__global__ void __launch_bounds__(kFinishThreads) finish_pending_norm_kernel(PendingNormParams n, float* logits,
                                                                             int num_experts, __nv_bfloat16* normed) {
  __shared__ float scale;
  pdl_enter();
  if (threadIdx.x < 32) {
    float parts[kNormPartsPerLane];
    request_norm_parts(n, parts);
    const float s = pending_norm_scale(n, parts);
    if (threadIdx.x == 0) scale = s;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n.width; i += kFinishThreads)
    normed[i] = __float2bfloat16(__bfloat162float(n.row[i]) * scale * __bfloat162float(n.weight[i]));
  for (int e = threadIdx.x; e < num_experts; e += kFinishThreads) logits[e] *= scale;
}

}  // namespace

void require_valid_norm(const PendingNormParams& n, const char* op) {
  MLA_CUDA_REQUIRE(n.parts && n.count >= 1 && n.count <= kMaxNormParts && n.width >= 1 && n.row && n.weight,
                   std::string(op) + ": a pending norm of " + std::to_string(n.count) + " parts (1 to " +
                       std::to_string(kMaxNormParts) + ") over " + std::to_string(n.width) +
                       " values, its row and weight");
}

void finish_pending_norm(const PendingNormParams& norm, float* logits, int num_experts, __nv_bfloat16* normed,
                         cudaStream_t stream) {
  require_valid_norm(norm, "finish_pending_norm");
  launch_dependent(finish_pending_norm_kernel, 1, kFinishThreads, 0, stream, norm, logits, num_experts, normed);
  check_launch("finish_pending_norm");
}

void require_valid_route(const MoeRouteParams& p, const char* op) {
  const std::string o = op;
  MLA_CUDA_REQUIRE(p.num_experts > 0 && p.num_experts <= kMaxRoutedExperts,
                   o + ": " + std::to_string(p.num_experts) + " experts (at most " +
                       std::to_string(kMaxRoutedExperts) + ")");
  MLA_CUDA_REQUIRE(p.top_k >= 1 && p.top_k <= kMaxTopK && p.top_k <= p.num_experts,
                   o + ": top_k " + std::to_string(p.top_k) + " out of range");
  if (p.method != RouteMethod::Greedy) {
    MLA_CUDA_REQUIRE(p.n_group >= 1 && p.n_group <= 32 && p.num_experts % p.n_group == 0 &&
                         p.topk_group >= 1 && p.topk_group <= p.n_group,
                     o + ": " + std::to_string(p.num_experts) + " experts in " + std::to_string(p.n_group) +
                         " groups keeping " + std::to_string(p.topk_group) + " is not a valid grouping");
    MLA_CUDA_REQUIRE(p.top_k <= p.topk_group * (p.num_experts / p.n_group),
                     o + ": top_k exceeds the experts in the kept groups");
  }
  if (p.norm.parts) {
    MLA_CUDA_REQUIRE(p.num_tokens == 1, o + ": a pending norm is one token's");
    require_valid_norm(p.norm, op);
  }
}

void moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return;
  require_valid_route(p, "moe_route");
  const int blocks = (p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int per_lane = route_per_lane(p.num_experts);
  const auto kernel = per_lane == 2 ? moe_route_kernel<2> : per_lane == 8 ? moe_route_kernel<8> : moe_route_kernel<16>;
  launch_dependent(kernel, blocks, kWarpsPerBlock * 32, 0, stream, p);
  check_launch("moe_route");
}

}  // namespace mlaserve::cuda

#include "kernels/cuda/moe_router.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kMaxRoutedExperts / 32;

// Warp-wide argmax; ties go to the lower expert index (deterministic).
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
}

__global__ void moe_route_kernel(MoeRouteParams p) {
  pdl_enter();
  __shared__ float sel_s[kWarpsPerBlock][kMaxRoutedExperts];  // selection scores (+ bias)
  __shared__ bool group_kept[kWarpsPerBlock][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarpsPerBlock + warp;
  if (t >= p.num_tokens) return;
  const int E = p.num_experts;
  const float* logits = p.logits + int64_t(t) * E;

  // Scores: lane holds experts lane + 32 i.
  float score[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    score[i] = e < E ? logits[e] : -INFINITY;
    mx = fmaxf(mx, score[i]);
  }
  if (p.sigmoid) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] = 1.0f / (1.0f + __expf(-score[i]));
  } else {
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      score[i] = lane + 32 * i < E ? __expf(score[i] - mx) : 0.0f;
      sum += score[i];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] /= sum;
  }
  const bool biased = p.method == RouteMethod::NoauxTc && p.bias;
  float sel[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    sel[i] = e < E ? score[i] + (biased ? p.bias[e] : 0.0f) : -INFINITY;
    if (e < E) sel_s[warp][e] = sel[i];
  }
  __syncwarp();

  // Group-limited: keep the topk_group best groups (max score, or the sum of
  // the top two biased scores for NoauxTc), then pick experts inside them.
  if (p.method != RouteMethod::Greedy && p.n_group > 1) {
    const int group_size = E / p.n_group;
    float gscore = -INFINITY;
    if (lane < p.n_group) {
      float a = -INFINITY, b = -INFINITY;  // best and second best in the group
      for (int e = lane * group_size; e < (lane + 1) * group_size; ++e) {
        const float v = sel_s[warp][e];
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      gscore = p.method == RouteMethod::NoauxTc ? a + b : a;
    }
    group_kept[warp][lane] = false;
    __syncwarp();
    for (int k = 0; k < p.topk_group; ++k) {
      float v = gscore;
      int idx = lane < p.n_group ? lane : 1 << 30;
      warp_argmax(v, idx);
      if (lane == idx) {
        group_kept[warp][lane] = true;
        gscore = -INFINITY;
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !group_kept[warp][e / group_size]) sel[i] = -INFINITY;
    }
  }

  // Top-k by selection score; weights from the unbiased scores.
  float chosen_weight = 0.0f, weight_sum = 0.0f;
  int chosen_id = 0;
  for (int k = 0; k < p.top_k; ++k) {
    float v = -INFINITY;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && (sel[i] > v || idx == (1 << 30))) {
        v = sel[i];
        idx = e;
      }
    }
    warp_argmax(v, idx);
    const int owner = idx % 32, slot = idx / 32;
    float w = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (i == slot && lane == owner) {
        w = score[i];
        sel[i] = -INFINITY;  // taken
      }
    w = __shfl_sync(0xffffffffu, w, owner);
    weight_sum += w;
    if (lane == k) {
      chosen_weight = w;
      chosen_id = idx;
    }
  }
  if (lane < p.top_k) {
    const float norm = p.renormalize ? 1.0f / weight_sum : 1.0f;
    p.topk_ids[int64_t(t) * p.top_k + lane] = chosen_id;
    p.topk_weights[int64_t(t) * p.top_k + lane] = chosen_weight * norm * p.scaling;
  }
}

}  // namespace

void moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return;
  MLA_CUDA_REQUIRE(p.num_experts > 0 && p.num_experts <= kMaxRoutedExperts,
                   "moe_route: " + std::to_string(p.num_experts) + " experts (at most " +
                       std::to_string(kMaxRoutedExperts) + ")");
  MLA_CUDA_REQUIRE(p.top_k >= 1 && p.top_k <= kMaxTopK && p.top_k <= p.num_experts,
                   "moe_route: top_k " + std::to_string(p.top_k) + " out of range");
  if (p.method != RouteMethod::Greedy) {
    MLA_CUDA_REQUIRE(p.n_group >= 1 && p.n_group <= 32 && p.num_experts % p.n_group == 0 &&
                         p.topk_group >= 1 && p.topk_group <= p.n_group,
                     "moe_route: " + std::to_string(p.num_experts) + " experts in " + std::to_string(p.n_group) +
                         " groups keeping " + std::to_string(p.topk_group) + " is not a valid grouping");
    MLA_CUDA_REQUIRE(p.top_k <= p.topk_group * (p.num_experts / p.n_group),
                     std::string("moe_route: top_k exceeds the experts in the kept groups"));
  }
  const int blocks = (p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  launch_dependent(moe_route_kernel, blocks, kWarpsPerBlock * 32, 0, stream, p);
  check_launch("moe_route");
}

}  // namespace mlaserve::cuda

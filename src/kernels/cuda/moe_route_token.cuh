#pragma once
// One token's expert selection by one warp (moe_router.h's MoeRouteParams):
// shared by the router kernel, moe_select's fused logits + selection and the
// small MoE kernels that route from the decode chain's logits (moe_small.cuh).
// The warp's selection is serial work at the tail of those kernels, so it
// avoids shared-memory loops and shuffle chains:
// groups of 32 experts (V3) are scored by butterfly in registers, and each
// top-k pick is two redux.sync (V3 at one token, H100: moe_select 12.3 ->
// 8.0 us, the selection alone 7.7 -> 4.7).
// sel_s (32 * kRoutePerLane floats) and group_kept (32) are the warp's own
// shared-memory scratch. Logits are read through L2 (__ldcg): moe_select's
// last block reads those the other blocks of its grid wrote.
#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/moe_router.h"

namespace mlaserve::cuda {

// Experts a lane holds (route_token's kRoutePerLane): the selection loops
// are unrolled over them, so the kernels are instantiated for 2, 8 and 16 and
// take the smallest that covers E (V2-Lite's 64 experts: 2, V3's 256: 8). One
// warp's selection is serial; at batch 1 it was most of moe_select's time
// when every E took the 512-expert loops.
inline int route_per_lane(int num_experts) { return num_experts <= 64 ? 2 : num_experts <= 256 ? 8 : 16; }

// Float -> unsigned with the same order (so redux.sync can compare floats).
__device__ __forceinline__ unsigned ordered_key(float v) {
  const unsigned b = __float_as_uint(v);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}

// Warp-wide argmax in two redux.sync steps: the largest value, then the
// lowest index holding it (ties go to the lower expert index, as
// warp_argmax's shuffles decide them).
__device__ __forceinline__ int warp_argmax_index(float v, int idx) {
  const unsigned key = ordered_key(v), best = __reduce_max_sync(0xffffffffu, key);
  return int(__reduce_min_sync(0xffffffffu, key == best ? unsigned(idx) : 0xffffffffu));
}

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

// A pending norm's parts as a warp's lane holds them (lane + 32 j), all
// requested at once, and the scale 1 / rms they give: every warp of every
// kernel sums them in this one order, so all norm the row alike.
constexpr int kNormPartsPerLane = kMaxNormParts / 32;
__device__ __forceinline__ void request_norm_parts(const PendingNormParams& n, float (&v)[kNormPartsPerLane]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kNormPartsPerLane; ++j) v[j] = lane + 32 * j < n.count ? __ldcg(n.parts + lane + 32 * j) : 0.0f;
}
__device__ __forceinline__ float pending_norm_scale(const PendingNormParams& n, const float (&v)[kNormPartsPerLane]) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormPartsPerLane; ++j) sum += v[j];
  return rsqrtf(warp_sum(sum) / float(n.width) + n.eps);
}

// Selects token t's experts (logits scaled back by a pending norm's scale).
template <int kRoutePerLane>
__device__ __forceinline__ void route_token(const MoeRouteParams& p, int t, float* sel_s, bool* group_kept) {
  const int lane = threadIdx.x % 32;
  const int E = p.num_experts;
  const float* logits = p.logits + int64_t(t) * E;

  // Scores: lane holds experts lane + 32 i.
  // The correction bias is requested with the logits: its latency (a
  // weight, often not in L2) then overlaps theirs.
  const bool biased = p.method == RouteMethod::NoauxTc && p.bias;
  float parts[kNormPartsPerLane];  // requested with the logits too
  if (p.norm.parts) request_norm_parts(p.norm, parts);
  float score[kRoutePerLane], bias[kRoutePerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    score[i] = e < E ? __ldcg(logits + e) : -INFINITY;
    bias[i] = biased && e < E ? __ldg(p.bias + e) : 0.0f;
  }
  const float scale = p.norm.parts ? pending_norm_scale(p.norm, parts) : 1.0f;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    score[i] *= scale;
    mx = fmaxf(mx, score[i]);
  }
  if (p.sigmoid) {
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) score[i] = 1.0f / (1.0f + __expf(-score[i]));
  } else {
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      score[i] = lane + 32 * i < E ? __expf(score[i] - mx) : 0.0f;
      sum += score[i];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) score[i] /= sum;
  }
  float sel[kRoutePerLane];
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    sel[i] = e < E ? score[i] + bias[i] : -INFINITY;
  }

  // Group-limited: keep the topk_group best groups (max score, or the sum of
  // the top two biased scores for NoauxTc), then pick experts inside them.
  const bool grouped = p.method != RouteMethod::Greedy && p.n_group > 1;
  if (grouped && E == 32 * p.n_group) {
    // Groups of 32 (V3: 256 experts in 8 groups): group i is every lane's
    // slot i. Each group's top two by butterfly, all groups at once; then
    // every lane ranks the group scores it now holds (ties to the lower
    // group) and keeps the topk_group best.
    float gscore[kRoutePerLane];
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      float a = sel[i], b = -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, a, o), ob = __shfl_xor_sync(0xffffffffu, b, o);
        b = fmaxf(fminf(a, oa), fmaxf(b, ob));
        a = fmaxf(a, oa);
      }
      gscore[i] = p.method == RouteMethod::NoauxTc ? a + b : a;
    }
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      int rank = 0;
#pragma unroll
      for (int j = 0; j < kRoutePerLane; ++j)
        rank += j < p.n_group && (gscore[j] > gscore[i] || (gscore[j] == gscore[i] && j < i));
      if (i >= p.n_group || rank >= p.topk_group) sel[i] = -INFINITY;
    }
  } else if (grouped) {
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E) sel_s[e] = sel[i];
    }
    __syncwarp();
    const int group_size = E / p.n_group;
    float gscore = -INFINITY;
    if (lane < p.n_group) {
      float a = -INFINITY, b = -INFINITY;  // best and second best in the group
      for (int e = lane * group_size; e < (lane + 1) * group_size; ++e) {
        const float v = sel_s[e];
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      gscore = p.method == RouteMethod::NoauxTc ? a + b : a;
    }
    group_kept[lane] = false;
    __syncwarp();
    for (int k = 0; k < p.topk_group; ++k) {
      float v = gscore;
      int idx = lane < p.n_group ? lane : 1 << 30;
      warp_argmax(v, idx);
      if (lane == idx) {
        group_kept[lane] = true;
        gscore = -INFINITY;
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !group_kept[e / group_size]) sel[i] = -INFINITY;
    }
  }

  // Top-k by selection score; weights from the unbiased scores.
  float chosen_weight = 0.0f, weight_sum = 0.0f;
  int chosen_id = 0;
  for (int k = 0; k < p.top_k; ++k) {
    float v = -INFINITY;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && (sel[i] > v || idx == (1 << 30))) {
        v = sel[i];
        idx = e;
      }
    }
    idx = warp_argmax_index(v, idx);
    const int owner = idx % 32, slot = idx / 32;
    float w = 0.0f;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i)
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


}  // namespace mlaserve::cuda

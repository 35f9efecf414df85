#include "kernels/cuda/moe_select.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_route_token.cuh"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxT = kMoeSelectMaxTokens;
constexpr int kStep = kThreads * 8;  // elements a block covers per 16-byte load a thread
constexpr int kPrefetch = 4;         // loads issued before pdl_wait: hidden <= 8192 in full

template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    moe_select_kernel(const __nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ w, int hidden,
                      MoeRouteParams p, float* logits, unsigned* arrivals) {
  pdl_launch_dependents();
  __shared__ float partial[kWarps][kMaxT];
  __shared__ float sel_s[kWarps][32 * kPerLane];
  __shared__ bool group_kept[kWarps][32];
  __shared__ bool last;
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int T = p.num_tokens, E = p.num_experts;
  // The router row does not depend on the previous kernel: load it first.
  const __nv_bfloat16* wr = w + int64_t(e) * hidden;
  Bf16x8 first[kPrefetch];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    const int kk = u * kStep + threadIdx.x * 8;
    if (kk < hidden) first[u] = Bf16x8::load(wr + kk);
  }
  // The last block's selection reads the correction bias: have it in L2 by then.
  if (threadIdx.x == 0 && p.bias && p.method == RouteMethod::NoauxTc)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p.bias + e));
  pdl_wait();
  float acc[kMaxT] = {};
  for (int k0 = 0; k0 < hidden; k0 += kPrefetch * kStep) {
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int kk = k0 + u * kStep + threadIdx.x * 8;
      if (kk >= hidden) continue;
      float wv[8];
      (k0 == 0 ? first[u] : Bf16x8::load(wr + kk)).to_float(wv);
#pragma unroll
      for (int r = 0; r < kMaxT; ++r) {
        if (r < T) {
          float xv[8];
          Bf16x8::load(h + int64_t(r) * hidden + kk).to_float(xv);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r] += wv[j] * xv[j];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxT; ++r) {
    if (r < T) {
      const float v = warp_sum(acc[r]);
      if (lane == 0) partial[warp][r] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < T) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) v += partial[i][threadIdx.x];
    logits[threadIdx.x * E + e] = v;
    __threadfence();  // visible to the last block before this block arrives
  }
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int t = warp; t < T; t += kWarps) route_token<kPerLane>(p, t, sel_s[warp], group_kept[warp]);
  if (threadIdx.x == 0) *arrivals = 0;  // ready for the next launch
}

}  // namespace

MoeSelectWorkspace::MoeSelectWorkspace()
    : logits(size_t(kMoeSelectMaxTokens) * kMaxRoutedExperts * sizeof(float)), arrivals(sizeof(unsigned)) {
  MLA_CUDA_CHECK(cudaMemset(arrivals.get(), 0, arrivals.bytes()), "moe_select workspace");
}

bool moe_select_applies(const __nv_bfloat16* h, const __nv_bfloat16* w, int64_t tokens, int64_t experts,
                        int64_t hidden) {
  const bool aligned = (reinterpret_cast<uintptr_t>(h) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  return aligned && tokens >= 1 && tokens <= kMoeSelectMaxTokens && experts >= 1 && experts <= kMaxRoutedExperts &&
         hidden >= 8 && hidden % 8 == 0;
}

void moe_select(const __nv_bfloat16* h, const __nv_bfloat16* w, int64_t hidden, MoeRouteParams p,
                MoeSelectWorkspace& ws, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(moe_select_applies(h, w, p.num_tokens, p.num_experts, hidden),
                   "moe_select: " + std::to_string(p.num_tokens) + " tokens, " + std::to_string(p.num_experts) +
                       " experts, hidden " + std::to_string(hidden) +
                       " (at most 8 tokens and 512 experts, hidden a multiple of 8, aligned rows)");
  require_valid_route(p, "moe_select");
  float* logits = ws.logits.get<float>();
  p.logits = logits;
  const int per_lane = route_per_lane(p.num_experts);
  const auto kernel = per_lane == 2   ? moe_select_kernel<2>
                      : per_lane == 8 ? moe_select_kernel<8>
                                      : moe_select_kernel<16>;
  launch_dependent(kernel, p.num_experts, kThreads, 0, stream, h, w, int(hidden), p, logits, ws.arrivals.get<unsigned>());
  check_launch("moe_select");
}

}  // namespace mlaserve::cuda

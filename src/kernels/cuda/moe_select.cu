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
// The fused norm holds a row in registers (one pass) and sums its squares as
// rms_norm_kernel's 256 threads do (widths of at least 8 * 256).
constexpr int kNormMinHidden = 8 * kThreads, kNormMaxHidden = kPrefetch * kStep;

// kNorm: h is formed in the launch (rms_norm_moe_select, MoeSelectNorm, one
// token): every block forms the normed row itself from x and the residual,
// with rms_norm_kernel's arithmetic and order (its 256 threads own the same
// 8-column chunks, block_sum the same tree), so the bits equal rms_norm's;
// a block writes its share of the normed chunks, and the last block writes
// the residual sums once every block has read the old ones.
template <int kPerLane, bool kNorm>
__global__ void __launch_bounds__(kThreads)
    moe_select_kernel(const __nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ w, int hidden,
                      MoeRouteParams p, MoeSelectNorm n, float* logits, unsigned* arrivals) {
  pdl_launch_dependents();
  __shared__ float partial[kWarps][kMaxT];
  __shared__ float sel_s[kWarps][32 * kPerLane];
  __shared__ bool group_kept[kWarps][32];
  __shared__ bool last;
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int T = p.num_tokens, E = p.num_experts;
  // The router row (and the norm's weight) do not depend on the previous kernel: load them first.
  const __nv_bfloat16* wr = w + int64_t(e) * hidden;
  Bf16x8 first[kPrefetch], gamma[kNorm ? kPrefetch : 1];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    const int kk = u * kStep + threadIdx.x * 8;
    if (kk < hidden) {
      first[u] = Bf16x8::load(wr + kk);
      if constexpr (kNorm) gamma[u] = Bf16x8::load(n.weight + kk);
    }
  }
  // The last block's selection reads the correction bias: have it in L2 by then.
  if (threadIdx.x == 0 && p.bias && p.method == RouteMethod::NoauxTc)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p.bias + e));
  pdl_wait();
  float acc[kMaxT] = {};
  if constexpr (kNorm) {
    // One token in one pass (hidden <= kPrefetch * kStep): the sums stay
    // packed, so the kernel keeps moe_select's register count and with it
    // the blocks of the kernels around it resident beside its own.
    Bf16x8 sum[kPrefetch], old[kPrefetch];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int kk = u * kStep + threadIdx.x * 8;
      if (kk < hidden) {
        sum[u] = Bf16x8::load(n.x + kk);
        old[u] = Bf16x8::load(n.residual + kk);
      }
    }
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int kk = u * kStep + threadIdx.x * 8;
      if (kk >= hidden) continue;
      float v[8], res[8];
      sum[u].to_float(v);
      old[u].to_float(res);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += res[j];
      sum[u] = Bf16x8::from_float(v);  // what the residual stream will hold
      sum[u].to_float(v);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
    }
    const float inv_rms = rsqrtf(block_sum(ss) / float(hidden) + n.eps);
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int kk = u * kStep + threadIdx.x * 8;
      if (kk >= hidden) continue;
      float v[8], g[8], wv[8];
      sum[u].to_float(v);
      gamma[u].to_float(g);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * inv_rms * g[j];
      const Bf16x8 normed = Bf16x8::from_float(v);
      if ((kk / 8) % gridDim.x == e) normed.store(n.normed + kk);
      normed.to_float(v);
      first[u].to_float(wv);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[0] += wv[j] * v[j];
    }
  } else {
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
  if constexpr (kNorm) {
    // Every block has read the old residual row: the sums replace it,
    // written by the warps that do not route while warp 0 routes.
    for (int c = int(threadIdx.x) - 32; c >= 0 && c < hidden / 8; c += kThreads - 32) {
      float v[8], res[8];
      Bf16x8::load(n.x + 8 * c).to_float(v);
      Bf16x8::load(n.residual + 8 * c).to_float(res);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += res[j];
      Bf16x8::from_float(v).store(n.residual + 8 * c);
    }
  }
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

namespace {

template <bool kNorm>
void launch_select(const __nv_bfloat16* h, const __nv_bfloat16* w, int64_t hidden, MoeRouteParams p,
                   const MoeSelectNorm& n, MoeSelectWorkspace& ws, cudaStream_t stream) {
  require_valid_route(p, "moe_select");
  float* logits = ws.logits.get<float>();
  p.logits = logits;
  const int per_lane = route_per_lane(p.num_experts);
  const auto kernel = per_lane == 2   ? moe_select_kernel<2, kNorm>
                      : per_lane == 8 ? moe_select_kernel<8, kNorm>
                                      : moe_select_kernel<16, kNorm>;
  launch_dependent(kernel, p.num_experts, kThreads, 0, stream, h, w, int(hidden), p, n, logits,
                   ws.arrivals.get<unsigned>());
  check_launch("moe_select");
}

}  // namespace

void moe_select(const __nv_bfloat16* h, const __nv_bfloat16* w, int64_t hidden, MoeRouteParams p,
                MoeSelectWorkspace& ws, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(moe_select_applies(h, w, p.num_tokens, p.num_experts, hidden),
                   "moe_select: " + std::to_string(p.num_tokens) + " tokens, " + std::to_string(p.num_experts) +
                       " experts, hidden " + std::to_string(hidden) +
                       " (at most 8 tokens and 512 experts, hidden a multiple of 8, aligned rows)");
  launch_select<false>(h, w, hidden, p, MoeSelectNorm{}, ws, stream);
}

bool rms_norm_moe_select_applies(const MoeSelectNorm& n, const __nv_bfloat16* w, int64_t tokens, int64_t experts,
                                 int64_t hidden) {
  const bool aligned =
      (reinterpret_cast<uintptr_t>(n.x) | reinterpret_cast<uintptr_t>(n.residual) |
       reinterpret_cast<uintptr_t>(n.weight) | reinterpret_cast<uintptr_t>(n.normed)) % 16 == 0;
  return aligned && n.x && n.residual && n.weight && n.normed && tokens == 1 && hidden >= kNormMinHidden &&
         hidden <= kNormMaxHidden && moe_select_applies(n.normed, w, tokens, experts, hidden);
}

void rms_norm_moe_select(const MoeSelectNorm& n, const __nv_bfloat16* w, int64_t hidden, MoeRouteParams p,
                         MoeSelectWorkspace& ws, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(rms_norm_moe_select_applies(n, w, p.num_tokens, p.num_experts, hidden),
                   "rms_norm_moe_select: " + std::to_string(p.num_tokens) + " tokens, " +
                       std::to_string(p.num_experts) + " experts, hidden " + std::to_string(hidden) +
                       " (one token, at most 512 experts, hidden a multiple of 8 in [" +
                       std::to_string(kNormMinHidden) + ", " + std::to_string(kNormMaxHidden) +
                       "], every row aligned and set)");
  launch_select<true>(n.normed, w, hidden, p, n, ws, stream);
}

}  // namespace mlaserve::cuda

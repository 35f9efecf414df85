#include "kernels/cuda/head_bmm_small.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kMaxT = kHeadBmmSmallMaxTokens;
constexpr int kThreads = 256;

struct Args {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* out;
  int tokens, heads, k, n;
  int64_t x_stride, out_stride;  // per head
};

// x[:, h, :K] as f32 into xs (after pdl_wait: x is the previous kernel's output).
__device__ __forceinline__ void stage_x(const Args& a, int h, float (*xs)[kHeadBmmSmallMaxK]) {
  for (int i = threadIdx.x; i < a.tokens * a.k; i += kThreads) {
    const int t = i / a.k, kk = i % a.k;
    xs[t][kk] = __bfloat162float(a.x[(int64_t(t) * a.heads + h) * a.x_stride + kk]);
  }
  __syncthreads();
}

// w {H, K, N}: a block owns 64 columns of one head. Thread = (column group
// of 8, k lane of 32); each k lane walks K in steps of 32, so a head's K = 128
// rows take four 16-byte loads a thread, all issued before pdl_wait.
constexpr int kColsPerBlock = 64;
constexpr int kKLanes = kThreads / (kColsPerBlock / 8);  // 32
constexpr int kPrefetchRows = 4;

__global__ void __launch_bounds__(kThreads) head_bmm_kn_kernel(Args a) {
  pdl_launch_dependents();
  __shared__ float xs[kMaxT][kHeadBmmSmallMaxK];
  __shared__ float partial[kThreads / 32][kMaxT][kColsPerBlock];
  const int h = blockIdx.y, cg = threadIdx.x % 8, kl = threadIdx.x / 8;
  const int col0 = blockIdx.x * kColsPerBlock + cg * 8;
  const bool active = col0 < a.n;
  const __nv_bfloat16* wh = a.w + int64_t(h) * a.k * a.n + col0;
  Bf16x8 first[kPrefetchRows];
#pragma unroll
  for (int u = 0; u < kPrefetchRows; ++u) {
    const int kk = kl + kKLanes * u;
    if (active && kk < a.k) first[u] = Bf16x8::load(wh + int64_t(kk) * a.n);
  }
  pdl_wait();
  stage_x(a, h, xs);
  float acc[kMaxT][8] = {};
  for (int k0 = 0; k0 < a.k; k0 += kKLanes * kPrefetchRows) {
#pragma unroll
    for (int u = 0; u < kPrefetchRows; ++u) {
      const int kk = k0 + kl + kKLanes * u;
      if (!active || kk >= a.k) continue;
      float wv[8];
      (k0 == 0 ? first[u] : Bf16x8::load(wh + int64_t(kk) * a.n)).to_float(wv);
#pragma unroll
      for (int r = 0; r < kMaxT; ++r) {
        if (r < a.tokens) {
          const float xv = xs[r][kk];
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][j] += wv[j] * xv;
        }
      }
    }
  }
  // Sum the 4 k lanes of a warp that share a column group, then the 8 warps.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < kMaxT; ++r) {
    if (r < a.tokens) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float v = acc[r][j];
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < 8) partial[warp][r][cg * 8 + j] = v;
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < a.tokens * kColsPerBlock; i += kThreads) {
    const int r = i / kColsPerBlock, c = i % kColsPerBlock;
    const int col = blockIdx.x * kColsPerBlock + c;
    if (col >= a.n) continue;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) v += partial[w][r][c];
    a.out[(int64_t(r) * a.heads + h) * a.out_stride + col] = __float2bfloat16(v);
  }
}

// w {H, N, K}: one warp per output column n (a contiguous weight row of K),
// eight consecutive columns of one head a block; K <= 512 is at most two
// 16-byte loads a lane, both issued before pdl_wait.
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int kStep = 32 * 8;

__global__ void __launch_bounds__(kThreads) head_bmm_nk_kernel(Args a) {
  pdl_launch_dependents();
  __shared__ float xs[kMaxT][kHeadBmmSmallMaxK];
  const int h = blockIdx.y, lane = threadIdx.x % 32;
  const int col = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const bool active = col < a.n;
  const __nv_bfloat16* wr = a.w + (int64_t(h) * a.n + (active ? col : 0)) * a.k;
  constexpr int kLoads = kHeadBmmSmallMaxK / kStep;
  Bf16x8 wv8[kLoads];
#pragma unroll
  for (int u = 0; u < kLoads; ++u)
    if (active && u * kStep + lane * 8 < a.k) wv8[u] = Bf16x8::load(wr + u * kStep + lane * 8);
  pdl_wait();
  stage_x(a, h, xs);
  if (!active) return;
  float acc[kMaxT] = {};
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int kk = u * kStep + lane * 8;
    if (kk >= a.k) continue;
    float wv[8];
    wv8[u].to_float(wv);
#pragma unroll
    for (int r = 0; r < kMaxT; ++r) {
      if (r < a.tokens) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] += wv[j] * xs[r][kk + j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxT; ++r) {
    if (r < a.tokens) {
      const float v = warp_sum(acc[r]);
      if (lane == 0) a.out[(int64_t(r) * a.heads + h) * a.out_stride + col] = __float2bfloat16(v);
    }
  }
}

}  // namespace

bool head_bmm_small_applies(const __nv_bfloat16* w, bool transpose_w, int64_t tokens, int64_t k, int64_t n) {
  const int64_t contiguous = transpose_w ? k : n;
  return tokens >= 1 && tokens <= kHeadBmmSmallMaxTokens && k >= 1 && k <= kHeadBmmSmallMaxK && n >= 1 &&
         contiguous % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void head_bmm_small(const __nv_bfloat16* x, const __nv_bfloat16* w, bool transpose_w, int64_t tokens, int64_t heads,
                    int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out, int64_t out_head_stride,
                    cudaStream_t stream) {
  MLA_CUDA_REQUIRE(head_bmm_small_applies(w, transpose_w, tokens, k, n),
                   "head_bmm_small: " + std::to_string(tokens) + " tokens, K " + std::to_string(k) + ", N " +
                       std::to_string(n) + " (at most 8 tokens, K <= 512, contiguous weight width a multiple of 8)");
  if (heads == 0) return;
  const Args a{x, w, out, int(tokens), int(heads), int(k), int(n), x_head_stride, out_head_stride};
  if (transpose_w) {
    const dim3 grid(unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(heads));
    launch_dependent(head_bmm_nk_kernel, grid, kThreads, 0, stream, a);
  } else {
    const dim3 grid(unsigned((n + kColsPerBlock - 1) / kColsPerBlock), unsigned(heads));
    launch_dependent(head_bmm_kn_kernel, grid, kThreads, 0, stream, a);
  }
  check_launch("head_bmm_small");
}

}  // namespace mlaserve::cuda

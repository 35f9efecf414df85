#include "kernels/cuda/skinny_gemm.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

// Batch b (blockIdx.y) of strided problems: x rows x_stride apart (+ b * x_batch),
// w{N, K} at w + b * w_batch, out rows out_stride apart (+ b * out_batch).
struct SkinnyStrides {
  int64_t x_stride, x_batch, w_batch, out_stride, out_batch;
};

template <bool kOutF32>
__global__ void __launch_bounds__(kWarps * 32) skinny_gemm_kernel(const __nv_bfloat16* __restrict__ x,
                                                                  const __nv_bfloat16* __restrict__ w, int m,
                                                                  int64_t n, int64_t k, void* out, SkinnyStrides st) {
  const int lane = threadIdx.x % 32;
  const int64_t col = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (col >= n) return;
  x += blockIdx.y * st.x_batch;
  const __nv_bfloat16* wr = w + blockIdx.y * st.w_batch + col * k;
  float acc[kSkinnyMaxRows] = {};
  constexpr int kStep = 32 * 8;  // elements a warp covers per load
  int64_t k0 = 0;
  for (; k0 + kUnroll * kStep <= k; k0 += kUnroll * kStep) {
    float wv[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Bf16x8::load(wr + k0 + u * kStep + lane * 8).to_float(wv[u]);
#pragma unroll
    for (int r = 0; r < kSkinnyMaxRows; ++r) {
      if (r < m) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          float xv[8];
          Bf16x8::load(x + r * st.x_stride + k0 + u * kStep + lane * 8).to_float(xv);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r] += wv[u][j] * xv[j];
        }
      }
    }
  }
  for (int64_t kk = k0 + lane * 8; kk < k; kk += kStep) {  // tail: fewer than kUnroll steps left
    float wv[8];
    Bf16x8::load(wr + kk).to_float(wv);
#pragma unroll
    for (int r = 0; r < kSkinnyMaxRows; ++r) {
      if (r < m) {
        float xv[8];
        Bf16x8::load(x + r * st.x_stride + kk).to_float(xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] += wv[j] * xv[j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kSkinnyMaxRows; ++r) {
    if (r < m) {
      const float v = warp_sum(acc[r]);
      if (lane == 0) {
        const int64_t o = blockIdx.y * st.out_batch + r * st.out_stride + col;
        if constexpr (kOutF32) static_cast<float*>(out)[o] = v;
        else static_cast<__nv_bfloat16*>(out)[o] = __float2bfloat16(v);
      }
    }
  }
}

// out[t, h, n] = sum_k x[t, h, k] * w[h, k, n] for w {H, K, N} (N contiguous):
// a thread owns 8 consecutive columns and a slice of K; the kSlices partial
// sums of a column meet in shared memory.
constexpr int kColsPerBlock = 128, kSlices = 8;

__global__ void __launch_bounds__(kColsPerBlock / 8 * kSlices) skinny_head_kn_kernel(
    const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w, int m, int64_t heads,
    int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out) {
  __shared__ float part[kSlices][kSkinnyMaxRows][kColsPerBlock];
  const int h = blockIdx.y, lane_col = threadIdx.x % (kColsPerBlock / 8), slice = threadIdx.x / (kColsPerBlock / 8);
  const int64_t col = blockIdx.x * int64_t(kColsPerBlock) + lane_col * 8;
  float acc[kSkinnyMaxRows][8] = {};
  if (col < n) {
    const __nv_bfloat16* wh = w + h * k * n + col;
    for (int64_t kk = slice; kk < k; kk += kSlices) {
      float wv[8];
      Bf16x8::load(wh + kk * n).to_float(wv);
#pragma unroll
      for (int r = 0; r < kSkinnyMaxRows; ++r) {
        if (r < m) {
          const float xv = __bfloat162float(x[(r * heads + h) * x_head_stride + kk]);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][j] += xv * wv[j];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kSkinnyMaxRows; ++r)
#pragma unroll
    for (int j = 0; j < 8; ++j) part[slice][r][lane_col * 8 + j] = acc[r][j];
  __syncthreads();
  for (int i = threadIdx.x; i < m * kColsPerBlock; i += blockDim.x) {
    const int r = i / kColsPerBlock, c = i % kColsPerBlock;
    const int64_t oc = blockIdx.x * int64_t(kColsPerBlock) + c;
    if (oc >= n) continue;
    float s = 0.0f;
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl) s += part[sl][r][c];
    out[(r * heads + h) * n + oc] = __float2bfloat16(s);
  }
}

}  // namespace

bool skinny_gemm_applies(int64_t m, int64_t k) { return m >= 1 && m <= kSkinnyMaxRows && k % 8 == 0; }

void skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
                 bool out_f32, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(skinny_gemm_applies(m, k), "skinny_gemm: " + std::to_string(m) + " rows of width " +
                                                  std::to_string(k) + " (at most 8 rows, width a multiple of 8)");
  if (n == 0) return;
  const unsigned blocks = unsigned((n + kWarps - 1) / kWarps);
  const SkinnyStrides st{k, 0, 0, n, 0};
  if (out_f32) skinny_gemm_kernel<true><<<blocks, kWarps * 32, 0, stream>>>(x, w, int(m), n, k, out, st);
  else skinny_gemm_kernel<false><<<blocks, kWarps * 32, 0, stream>>>(x, w, int(m), n, k, out, st);
  check_launch("skinny_gemm");
}

bool skinny_head_bmm_applies(int64_t tokens, int64_t x_head_stride, int64_t k, int64_t n, bool transpose_w) {
  if (tokens < 1 || tokens > kSkinnyMaxRows) return false;
  return transpose_w ? k % 8 == 0 && x_head_stride % 8 == 0 : n % 8 == 0;
}

void skinny_head_bmm(const __nv_bfloat16* x, const __nv_bfloat16* w, bool transpose_w, int64_t tokens, int64_t heads,
                     int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(skinny_head_bmm_applies(tokens, x_head_stride, k, n, transpose_w),
                   "skinny_head_bmm: " + std::to_string(tokens) + " tokens, K " + std::to_string(k) + ", N " +
                       std::to_string(n) + " not supported");
  if (n == 0 || heads == 0) return;
  if (transpose_w) {  // w {H, N, K}: per head a skinny GEMM over contiguous K
    const SkinnyStrides st{heads * x_head_stride, x_head_stride, n * k, heads * n, n};
    const dim3 grid(unsigned((n + kWarps - 1) / kWarps), unsigned(heads));
    skinny_gemm_kernel<false><<<grid, kWarps * 32, 0, stream>>>(x, w, int(tokens), n, k, out, st);
  } else {
    const dim3 grid(unsigned((n + kColsPerBlock - 1) / kColsPerBlock), unsigned(heads));
    skinny_head_kn_kernel<<<grid, kColsPerBlock / 8 * kSlices, 0, stream>>>(x, w, int(tokens), heads, x_head_stride,
                                                                          k, n, out);
  }
  check_launch("skinny_head_bmm");
}

}  // namespace mlaserve::cuda

#include "kernels/cuda/skinny_gemm.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

template <bool kOutF32>
__global__ void __launch_bounds__(kWarps * 32) skinny_gemm_kernel(const __nv_bfloat16* __restrict__ x,
                                                                  const __nv_bfloat16* __restrict__ w, int m,
                                                                  int64_t n, int64_t k, void* out) {
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t col = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  constexpr int kStep = 32 * 8;  // elements a warp covers per load
  // The weights do not depend on the previous kernel: the first loads are
  // issued before waiting for it, overlapping its tail.
  const __nv_bfloat16* wr = w + (col < n ? col : 0) * k;
  Bf16x8 first[kUnroll];
  const bool prefetched = kUnroll * kStep <= k;
  if (prefetched) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) first[u] = Bf16x8::load(wr + u * kStep + lane * 8);
  }
  pdl_wait();
  if (col >= n) return;
  float acc[kSkinnyMaxRows] = {};
  int64_t k0 = 0;
  for (; k0 + kUnroll * kStep <= k; k0 += kUnroll * kStep) {
    float wv[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k0 == 0) first[u].to_float(wv[u]);
      else Bf16x8::load(wr + k0 + u * kStep + lane * 8).to_float(wv[u]);
    }
#pragma unroll
    for (int r = 0; r < kSkinnyMaxRows; ++r) {
      if (r < m) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          float xv[8];
          Bf16x8::load(x + r * k + k0 + u * kStep + lane * 8).to_float(xv);
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
        Bf16x8::load(x + r * k + kk).to_float(xv);
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
        if constexpr (kOutF32) static_cast<float*>(out)[r * n + col] = v;
        else static_cast<__nv_bfloat16*>(out)[r * n + col] = __float2bfloat16(v);
      }
    }
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
  if (out_f32) launch_dependent(skinny_gemm_kernel<true>, blocks, kWarps * 32, 0, stream, x, w, int(m), n, k, out);
  else launch_dependent(skinny_gemm_kernel<false>, blocks, kWarps * 32, 0, stream, x, w, int(m), n, k, out);
  check_launch("skinny_gemm");
}

}  // namespace mlaserve::cuda

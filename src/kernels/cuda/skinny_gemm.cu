#include "kernels/cuda/skinny_gemm.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/l2_policy.cuh"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

// Decode-step matrices of 2-15 MB are latency-bound: at ~4.3 TB/s the GPU
// needs several MB of weight loads in flight to hide one DRAM round trip.
// So each warp issues every weight load it will ever make in one go, before
// waiting for the previous kernel (pdl), with no load depending on another:
// a warp covers kCols weight rows with kLoads 16-byte loads per lane each,
// and when a row is longer than 256 * kLoads elements the block's warps split
// it (kSplit slices, reduced through shared memory) instead of looping.
constexpr int kBlockWarps = 8;
constexpr int kVecElems = 8;              // bf16 values in a 16-byte load
constexpr int kWarpVecElems = 32 * kVecElems;  // elements a warp covers per load
constexpr int kTargetBlocks = 264;        // 2 per SM on an H100/H200: spread small matrices

// Block: (32 * col_warps, kSplit) threads; warp (cw, s) owns columns
// [(blockIdx.x * col_warps + cw) * kCols, + kCols) and K slice s.
template <int kRows, int kCols, int kLoads, bool kOutF32>
__global__ void __launch_bounds__(kBlockWarps * 32) skinny_gemm_kernel(const __nv_bfloat16* __restrict__ x,
                                                                       const __nv_bfloat16* __restrict__ w, int m,
                                                                       int64_t n, int64_t k, void* out) {
  pdl_launch_dependents();
  constexpr int kChunk = kWarpVecElems * kLoads;
  const int lane = threadIdx.x % 32;
  const int col_warps = blockDim.x / 32, cw = threadIdx.x / 32;
  const int split = threadIdx.y, splits = blockDim.y;
  const int64_t col0 = (int64_t(blockIdx.x) * col_warps + cw) * kCols;

  const __nv_bfloat16* wr[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) wr[c] = w + (col0 + c < n ? col0 + c : n - 1) * k;

  float acc[kRows][kCols] = {};
  bool waited = false;
  // One pass per chunk of kChunk elements; for K <= splits * kChunk (every
  // shape of a V2-Lite/V3 decode step) a warp makes exactly one pass.
  for (int64_t k0 = int64_t(split) * kChunk; k0 < k || !waited; k0 += int64_t(splits) * kChunk) {
    uint4 wv[kCols][kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t kk = k0 + u * kWarpVecElems + lane * kVecElems;
#pragma unroll
      for (int c = 0; c < kCols; ++c) wv[c][u] = kk < k ? load_streamed_16(wr[c] + kk) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {  // the weights are in flight; now the activations may be read
      pdl_wait();
      waited = true;
      if (k0 >= k) break;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t kk = k0 + u * kWarpVecElems + lane * kVecElems;
      if (kk >= k) break;
      float wf[kCols][8];
#pragma unroll
      for (int c = 0; c < kCols; ++c) bf16x8_to_float(wv[c][u], wf[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < m) {
          float xv[8];
          Bf16x8::load(x + r * k + kk).to_float(xv);
#pragma unroll
          for (int c = 0; c < kCols; ++c)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[r][c] += wf[c][j] * xv[j];
        }
      }
    }
  }

  __shared__ float partial[kBlockWarps][kRows][kCols];
  const int warp = split * col_warps + cw;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float v = warp_sum(acc[r][c]);
      if (lane == 0) partial[warp][r][c] = v;
    }
  __syncthreads();
  if (split != 0) return;
  // Lanes of slice 0's warps write: lane = r * kCols + c.
  for (int i = lane; i < kRows * kCols; i += 32) {
    const int r = i / kCols, c = i % kCols;
    const int64_t col = col0 + c;
    if (r >= m || col >= n) continue;
    float v = 0;
    for (int s = 0; s < splits; ++s) v += partial[s * col_warps + cw][r][c];
    if constexpr (kOutF32) static_cast<float*>(out)[r * n + col] = v;
    else static_cast<__nv_bfloat16*>(out)[r * n + col] = __float2bfloat16(v);
  }
}

// Columns a warp covers and loads per lane and column: about eight 16-byte
// loads a lane in all (4 KB a warp). Rows above 2 reuse each activation
// load for two columns, so that L1 traffic for x stays below the weights'.
struct SkinnyPlan {
  int cols, loads, splits, col_warps;
  int64_t blocks;
};

SkinnyPlan plan_for(int64_t m, int64_t n, int64_t k) {
  const int64_t vecs = (k + kWarpVecElems - 1) / kWarpVecElems;  // 16-byte loads a lane for one row
  SkinnyPlan p{};
  if (vecs <= 2) p.cols = 4, p.loads = 2;
  else if (vecs <= 4 || m > 2) p.cols = 2, p.loads = 4;
  else p.cols = 1, p.loads = 8;
  const int64_t chunks = (vecs + p.loads - 1) / p.loads;
  p.splits = 1;
  while (p.splits < kBlockWarps && p.splits < chunks) p.splits *= 2;
  p.col_warps = kBlockWarps / p.splits;
  auto blocks = [&](int cw) { return (n + int64_t(cw) * p.cols - 1) / (int64_t(cw) * p.cols); };
  while (p.col_warps > 1 && blocks(p.col_warps) < kTargetBlocks) p.col_warps /= 2;
  p.blocks = blocks(p.col_warps);
  return p;
}

template <int kRows, bool kOutF32>
void launch_rows(const SkinnyPlan& p, const __nv_bfloat16* x, const __nv_bfloat16* w, int m, int64_t n, int64_t k,
                 void* out, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks)), block(32 * p.col_warps, p.splits);
  if (p.cols == 4) launch_dependent(skinny_gemm_kernel<kRows, 4, 2, kOutF32>, grid, block, 0, stream, x, w, m, n, k, out);
  else if (p.cols == 2) launch_dependent(skinny_gemm_kernel<kRows, 2, 4, kOutF32>, grid, block, 0, stream, x, w, m, n, k, out);
  else launch_dependent(skinny_gemm_kernel<kRows, 1, 8, kOutF32>, grid, block, 0, stream, x, w, m, n, k, out);
}

template <bool kOutF32>
void launch(const SkinnyPlan& p, const __nv_bfloat16* x, const __nv_bfloat16* w, int m, int64_t n, int64_t k,
            void* out, cudaStream_t stream) {
  if (m == 1) launch_rows<1, kOutF32>(p, x, w, m, n, k, out, stream);
  else if (m == 2) launch_rows<2, kOutF32>(p, x, w, m, n, k, out, stream);
  else if (m <= 4) launch_rows<4, kOutF32>(p, x, w, m, n, k, out, stream);
  else launch_rows<8, kOutF32>(p, x, w, m, n, k, out, stream);
}

}  // namespace

bool skinny_gemm_applies(int64_t m, int64_t k) { return m >= 1 && m <= kSkinnyMaxRows && k % 8 == 0 && k > 0; }

void skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
                 bool out_f32, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(skinny_gemm_applies(m, k), "skinny_gemm: " + std::to_string(m) + " rows of width " +
                                                  std::to_string(k) + " (at most 8 rows, width a positive multiple of 8)");
  if (n == 0) return;
  const SkinnyPlan p = plan_for(m, n, k);
  if (out_f32) launch<true>(p, x, w, int(m), n, k, out, stream);
  else launch<false>(p, x, w, int(m), n, k, out, stream);
  check_launch("skinny_gemm");
}

}  // namespace mlaserve::cuda

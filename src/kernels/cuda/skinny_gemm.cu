#include "kernels/cuda/skinny_gemm.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

// Decode-step matrices of 2-15 MB are latency-bound: at ~4.3 TB/s the GPU
// needs several MB of weight loads in flight to hide one DRAM round trip.
// So each warp issues every weight load it will ever make in one go, before
// waiting for the previous kernel (pdl), with no load depending on another:
// a warp covers kCols weight rows with kLoads 16-byte loads per lane each,
// and when a row is longer than 32 * kLoads loads the block's warps split
// it (kSplit slices, reduced through shared memory) instead of looping.
constexpr int kBlockWarps = 8;
constexpr int kTargetBlocks = 264;  // 2 per SM on an H100/H200: spread small matrices

// How the weight rows are stored: bf16, or block-FP8 (e4m3 bytes and one f32
// scale per 128 x 128 block, the checkpoint's layout). kElems: weights in a
// 16-byte load, which never straddles a 128-wide scale block.
struct Bf16Weights {
  static constexpr int kElems = 8, kBytes = 2;
};
struct Fp8Weights {
  static constexpr int kElems = 16, kBytes = 1;
};

struct SkinnyArgs {
  const __nv_bfloat16* x;
  int64_t x_ld;
  const uint8_t* w;        // {n, k} rows of W's format
  const float* w_scale;    // FP8: [row / 128][kk / 128], ceil(k / 128) a row
  int m;
  int64_t n, k;
  void* out;
  SkinnyRmsNorm norm;      // kNorm: x is norm's output, formed in the launch
};

// One row of rms_norm_kernel (elementwise.cu) with its residual add, into
// s_x: the block's 256 threads own its chunks of 8 (thread t the chunks t,
// t + 256, ...) and block_sum the same tree, so the bits equal that
// kernel's. Every block reads the old residual; the last to arrive writes
// the sums, as rms_norm does, once all have read it.
__device__ void form_normed_row(const SkinnyRmsNorm& n, int k, __nv_bfloat16* s_x) {
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, step = 8 * blockDim.x * blockDim.y;
  float ss = 0.0f;
  for (int i = tid * 8; i < k; i += step) {
    float v[8];
    Bf16x8 s = Bf16x8::load(n.x + i);
    if (n.residual) {
      float r[8];
      s.to_float(v);
      Bf16x8::load(n.residual + i).to_float(r);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += r[j];
      s = Bf16x8::from_float(v);
    }
    s.store(s_x + i);
    s.to_float(v);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  const float inv_rms = rsqrtf(block_sum(ss) / float(k) + n.eps);
  if (n.residual) {
    __shared__ bool last;
    __syncthreads();  // every thread has read its residual chunks
    if (tid == 0) last = atomicAdd(n.arrivals, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) {
      for (int i = tid * 8; i < k; i += step) Bf16x8::load(s_x + i).store(n.residual + i);
      if (tid == 0) *n.arrivals = 0;  // ready for the next launch
    }
  }
  for (int i = tid * 8; i < k; i += step) {
    float v[8], g[8];
    Bf16x8::load(s_x + i).to_float(v);
    Bf16x8::load(n.weight + i).to_float(g);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * inv_rms * g[j];
    Bf16x8::from_float(v).store(s_x + i);
  }
  __syncthreads();
}

// kN bf16 activations at p (16-byte aligned) as floats.
template <int kN>
__device__ __forceinline__ void load_x(const __nv_bfloat16* p, float (&f)[kN]) {
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    float t[8];
    Bf16x8::load(p + 8 * i).to_float(t);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[8 * i + j] = t[j];
  }
}

// Block: (32 * col_warps, kSplit) threads; warp (cw, s) owns columns
// [(blockIdx.x * col_warps + cw) * kCols, + kCols) and K slice s. 16 loads
// a lane must still fit two blocks an SM (124 registers). The others name
// no minimum: an explicit 1 moves ptxas's allocation (q_b's kernel 80 -> 82
// registers, perf.md session 38).
template <typename W, int kRows, int kCols, int kLoads, bool kOutF32, bool kNorm = false>
__global__ void __launch_bounds__(kBlockWarps * 32, kLoads >= 16 ? 2 : 0) skinny_gemm_kernel(const SkinnyArgs a) {
  extern __shared__ __align__(16) __nv_bfloat16 s_x[];  // kNorm: the normed row
  pdl_launch_dependents();
  constexpr bool kFp8 = W::kElems == 16;
  constexpr int kWarpVecElems = 32 * W::kElems, kChunk = kWarpVecElems * kLoads;
  const int lane = threadIdx.x % 32;
  const int col_warps = blockDim.x / 32, cw = threadIdx.x / 32;
  const int split = threadIdx.y, splits = blockDim.y;
  const int64_t col0 = (int64_t(blockIdx.x) * col_warps + cw) * kCols, k = a.k;
  const int64_t scale_ld = (k + 127) / 128;

  const uint8_t* wr[kCols];
  const float* sr[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int64_t row = col0 + c < a.n ? col0 + c : a.n - 1;
    wr[c] = a.w + row * k * W::kBytes;
    if constexpr (kFp8) sr[c] = a.w_scale + row / 128 * scale_ld;
  }

  float acc[kRows][kCols] = {};
  bool waited = false;
  // One pass per chunk of kChunk elements; for K <= splits * kChunk (every
  // shape of a V2-Lite/V3 decode step) a warp makes exactly one pass.
  for (int64_t k0 = int64_t(split) * kChunk; k0 < k || !waited; k0 += int64_t(splits) * kChunk) {
    uint4 wv[kCols][kLoads];
    float sv[kCols][kLoads];  // FP8: each load's block scale
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t kk = k0 + u * kWarpVecElems + lane * W::kElems;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        wv[c][u] = kk < k ? load_streamed_16(wr[c] + kk * W::kBytes) : make_uint4(0, 0, 0, 0);
        if constexpr (kFp8) sv[c][u] = kk < k ? __ldg(sr[c] + kk / 128) : 0.0f;
      }
    }
    if (!waited) {  // the weights are in flight; now the activations may be read
      pdl_wait();
      waited = true;
      if constexpr (kNorm) form_normed_row(a.norm, int(k), s_x);
      if (k0 >= k) break;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t kk = k0 + u * kWarpVecElems + lane * W::kElems;
      if (kk >= k) break;
      if constexpr (kFp8) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r < a.m) {
            float xv[16];
            load_x((kNorm ? s_x : a.x + r * a.x_ld) + kk, xv);
#pragma unroll
            for (int c = 0; c < kCols; ++c) acc[r][c] = fmaf(sv[c][u], e4m3x16_dot(wv[c][u], xv), acc[r][c]);
          }
        }
      } else {
        float wf[kCols][8];
#pragma unroll
        for (int c = 0; c < kCols; ++c) bf16x8_to_float(wv[c][u], wf[c]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r < a.m) {
            float xv[8];
            load_x(a.x + r * a.x_ld + kk, xv);
#pragma unroll
            for (int c = 0; c < kCols; ++c)
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[r][c] += wf[c][j] * xv[j];
          }
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
    if (r >= a.m || col >= a.n) continue;
    float v = 0;
    for (int s = 0; s < splits; ++s) v += partial[s * col_warps + cw][r][c];
    if constexpr (kOutF32) static_cast<float*>(a.out)[r * a.n + col] = v;
    else static_cast<__nv_bfloat16*>(a.out)[r * a.n + col] = __float2bfloat16(v);
  }
}

// Columns a warp covers and loads per lane and column: about eight 16-byte
// loads a lane in all (4 KB a warp), sixteen for one or two FP8 rows of K
// up to 8192 (one warp a row). Rows above 2 reuse each activation
// load for two columns, so that L1 traffic for x stays below the weights'.
struct SkinnyPlan {
  int cols, loads, splits, col_warps;
  int64_t blocks;
};

// Blocks an SM holds: 80 registers a thread at 8 loads, 124 at 16.
constexpr int kBlocksPerSmAt8Loads = 3, kBlocksPerSmAt16Loads = 2;

SkinnyPlan plan_with(int64_t n, int64_t vecs, int cols, int loads) {
  SkinnyPlan p{};
  p.cols = cols;
  p.loads = loads;
  const int64_t chunks = (vecs + p.loads - 1) / p.loads;
  p.splits = 1;
  while (p.splits < kBlockWarps && p.splits < chunks) p.splits *= 2;
  p.col_warps = kBlockWarps / p.splits;
  auto blocks = [&](int cw) { return (n + int64_t(cw) * p.cols - 1) / (int64_t(cw) * p.cols); };
  while (p.col_warps > 1 && blocks(p.col_warps) < kTargetBlocks) p.col_warps /= 2;
  p.blocks = blocks(p.col_warps);
  return p;
}

SkinnyPlan plan_for(int64_t m, int64_t n, int64_t k, int elems) {
  const int64_t vecs = (k + 32 * elems - 1) / (32 * elems);  // 16-byte loads a lane for one row
  if (vecs <= 2) return plan_with(n, vecs, 4, 2);
  if (vecs <= 4 || m > 2) return plan_with(n, vecs, 2, 4);
  const SkinnyPlan eight = plan_with(n, vecs, 1, 8);
  // One or two FP8 rows of 9-16 loads (V3's K = 7168) take a 16-load warp
  // a row where that fits one wave and two 8-load slices a row do not: q_a
  // + kv_a {2112, 7168} at one row, 264 blocks against 528 (H200, perf.md
  // session 39: 7.32 against 7.42-7.50 us). Where both fit one wave the slices
  // are faster, each warp's dot products after the loads half as long (q_a
  // 5.06 against 6.03 us, kv_a 3.29 against 4.45); where neither does, too
  // (the shared gate_up {4096, 7168}: 11.3 against 13.4).
  if (elems == 16 && vecs <= 16) {
    int device = 0, sms = 0;
    MLA_CUDA_CHECK(cudaGetDevice(&device), "skinny_gemm");
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "skinny_gemm");
    const SkinnyPlan sixteen = plan_with(n, vecs, 1, 16);
    if (eight.blocks > kBlocksPerSmAt8Loads * sms && sixteen.blocks <= kBlocksPerSmAt16Loads * sms) return sixteen;
  }
  return eight;
}

template <typename W, int kRows, bool kOutF32, bool kNorm = false>
void launch_rows(const SkinnyPlan& p, const SkinnyArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks)), block(32 * p.col_warps, p.splits);
  const size_t smem = kNorm ? size_t(a.k) * sizeof(__nv_bfloat16) : 0;
  if (p.cols == 4) launch_dependent(skinny_gemm_kernel<W, kRows, 4, 2, kOutF32, kNorm>, grid, block, smem, stream, a);
  else if (p.cols == 2)
    launch_dependent(skinny_gemm_kernel<W, kRows, 2, 4, kOutF32, kNorm>, grid, block, smem, stream, a);
  else if constexpr (W::kElems == 16 && kRows <= 2) {  // the only rows plan_for gives 16 loads
    if (p.loads == 16)
      launch_dependent(skinny_gemm_kernel<W, kRows, 1, 16, kOutF32, kNorm>, grid, block, smem, stream, a);
    else launch_dependent(skinny_gemm_kernel<W, kRows, 1, 8, kOutF32, kNorm>, grid, block, smem, stream, a);
  } else {
    launch_dependent(skinny_gemm_kernel<W, kRows, 1, 8, kOutF32, kNorm>, grid, block, smem, stream, a);
  }
}

template <typename W, bool kOutF32>
void launch(const SkinnyArgs& a, cudaStream_t stream) {
  const SkinnyPlan p = plan_for(a.m, a.n, a.k, W::kElems);
  if (a.m == 1) launch_rows<W, 1, kOutF32>(p, a, stream);
  else if (a.m == 2) launch_rows<W, 2, kOutF32>(p, a, stream);
  else if (a.m <= 4) launch_rows<W, 4, kOutF32>(p, a, stream);
  else launch_rows<W, 8, kOutF32>(p, a, stream);
}

}  // namespace

bool skinny_gemm_applies(int64_t m, int64_t k) { return m >= 1 && m <= kSkinnyMaxRows && k % 8 == 0 && k > 0; }

void skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
                 bool out_f32, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(skinny_gemm_applies(m, k), "skinny_gemm: " + std::to_string(m) + " rows of width " +
                                                  std::to_string(k) + " (at most 8 rows, width a positive multiple of 8)");
  if (n == 0) return;
  const SkinnyArgs a{x, k, reinterpret_cast<const uint8_t*>(w), nullptr, int(m), n, k, out};
  if (out_f32) launch<Bf16Weights, true>(a, stream);
  else launch<Bf16Weights, false>(a, stream);
  check_launch("skinny_gemm");
}

bool skinny_gemm_fp8_applies(int64_t m, int64_t k, int64_t x_ld) {
  return m >= 1 && m <= kSkinnyMaxRows && k % 16 == 0 && k > 0 && x_ld >= k && x_ld % 8 == 0;
}

void skinny_gemm_fp8(const __nv_bfloat16* x, int64_t x_ld, const uint8_t* w, const float* w_scale, int64_t m,
                     int64_t n, int64_t k, __nv_bfloat16* out, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(skinny_gemm_fp8_applies(m, k, x_ld),
                   "skinny_gemm_fp8: " + std::to_string(m) + " rows of width " + std::to_string(k) + ", stride " +
                       std::to_string(x_ld) + " (at most 8 rows, width a positive multiple of 16, stride of 8)");
  if (n == 0) return;
  launch<Fp8Weights, false>(SkinnyArgs{x, x_ld, w, w_scale, int(m), n, k, out}, stream);
  check_launch("skinny_gemm_fp8");
}

bool skinny_gemm_fp8_rms_norm_applies(int64_t k) {
  return k >= kSkinnyNormMinWidth && k <= kSkinnyNormMaxWidth && skinny_gemm_fp8_applies(1, k, k);
}

void skinny_gemm_fp8_rms_norm(const SkinnyRmsNorm& norm, const uint8_t* w, const float* w_scale, int64_t n, int64_t k,
                              __nv_bfloat16* out, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(skinny_gemm_fp8_rms_norm_applies(k) && norm.x && norm.weight && (!norm.residual || norm.arrivals),
                   "skinny_gemm_fp8_rms_norm: width " + std::to_string(k) + " (a multiple of 16 in [" +
                       std::to_string(kSkinnyNormMinWidth) + ", " + std::to_string(kSkinnyNormMaxWidth) +
                       "]), x and the norm weight set, and an arrival counter with a residual");
  if (n == 0) return;
  SkinnyArgs a{nullptr, k, w, w_scale, 1, n, k, out};
  a.norm = norm;
  launch_rows<Fp8Weights, 1, false, true>(plan_for(1, n, k, Fp8Weights::kElems), a, stream);
  check_launch("skinny_gemm_fp8_rms_norm");
}

}  // namespace mlaserve::cuda

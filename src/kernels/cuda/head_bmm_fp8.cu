#include "kernels/cuda/head_bmm_fp8.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

struct Args {
  const __nv_bfloat16* x;
  const uint8_t* w;
  const float* w_scale;
  __nv_bfloat16* out;
  int tokens, heads, n, k;
  int64_t x_stride, out_stride;  // per head
};

// ---- streaming (decode) -----------------------------------------------------
// kLanes = K / 16 lanes share a weight row (16 e4m3 bytes a lane, inside one
// 128-wide scale block); a thread owns kRowsPerThread rows kGroups apart, so
// a warp's loads of one round are contiguous. A block's rows lie in one head
// (N % 128 == 0 and a block covers at most 128 rows).
constexpr int kStreamThreads = 256, kRowsPerThread = 4, kMaxT = kHeadBmmFp8StreamTokens;

template <int kLanes>
__global__ void __launch_bounds__(kStreamThreads) head_bmm_fp8_stream_kernel(Args a) {
  constexpr int kK = kLanes * 16, kGroups = kStreamThreads / kLanes, kBlockRows = kGroups * kRowsPerThread;
  pdl_launch_dependents();
  __shared__ __align__(16) float xs[kMaxT][kK];
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const int64_t row0 = int64_t(blockIdx.x) * kBlockRows + group;  // a row of {H * N, K}
  const int h = int(row0 / a.n);
  uint4 wv[kRowsPerThread];
  float s[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int64_t row = row0 + r * kGroups;
    wv[r] = load_weights_16(a.w + row * kK + lane * 16);
    s[r] = __ldg(a.w_scale + (row / 128) * (kK / 128) + lane / 8);
  }
  pdl_wait();
  for (int i = threadIdx.x; i < a.tokens * kK; i += kStreamThreads) {
    const int t = i / kK, kk = i % kK;
    xs[t][kk] = __bfloat162float(a.x[(int64_t(t) * a.heads + h) * a.x_stride + kk]);
  }
  __syncthreads();
  float acc[kMaxT][kRowsPerThread];
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    if (t < a.tokens) {
      float xv[16];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(&xs[t][lane * 16 + 4 * j]);
        xv[4 * j] = v.x, xv[4 * j + 1] = v.y, xv[4 * j + 2] = v.z, xv[4 * j + 3] = v.w;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) acc[t][r] = s[r] * e4m3x16_dot(wv[r], xv);
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    if (t < a.tokens) {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        float v = acc[t][r];
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) {
          const int n = int(row0 + r * kGroups - int64_t(h) * a.n);
          a.out[(int64_t(t) * a.heads + h) * a.out_stride + n] = __float2bfloat16(v);
        }
      }
    }
  }
}

// ---- tensor cores (larger batches) ------------------------------------------
// A block: 64 tokens x 64 columns of one head; 4 warps of 16 tokens each run
// m16n8k16 over the 64 columns. Per 128-wide K block (one weight scale: the
// 64 rows lie in one 128-row block) the weight bytes are widened into ws and
// the x rows copied into xs; the next K block's loads are in registers while
// this one multiplies. Rows padded by 8 bf16 so a fragment's 8 rows hit
// distinct banks.
constexpr int kMmaThreads = 128, kMmaTokens = 64, kMmaCols = 64, kKb = 128, kPad = 8;
constexpr int kWChunks = kMmaCols * kKb / 16 / kMmaThreads;     // 16-byte weight chunks a thread: 4
constexpr int kXChunks = kMmaTokens * kKb * 2 / 16 / kMmaThreads;  // 16-byte x chunks a thread: 8

__global__ void __launch_bounds__(kMmaThreads) head_bmm_fp8_mma_kernel(Args a) {
  pdl_launch_dependents();
  __shared__ __align__(16) __nv_bfloat16 ws[kMmaCols][kKb + kPad];
  __shared__ __align__(16) __nv_bfloat16 xs[kMmaTokens][kKb + kPad];
  const int h = blockIdx.y, n0 = blockIdx.x * kMmaCols, t0 = blockIdx.z * kMmaTokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t row0 = int64_t(h) * a.n + n0;
  const int kbs = a.k / kKb;
  uint4 wv[kWChunks], xv[kXChunks];
  auto load_w = [&](int kb) {
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
      const int chunk = threadIdx.x + kMmaThreads * i, r = chunk / 8, col = chunk % 8 * 16;
      wv[i] = load_weights_16(a.w + (row0 + r) * a.k + kb * kKb + col);
    }
  };
  auto load_x = [&](int kb) {
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int chunk = threadIdx.x + kMmaThreads * i, r = chunk / 16, col = chunk % 16 * 8;
      const int t = t0 + r;
      xv[i] = t < a.tokens ? *reinterpret_cast<const uint4*>(a.x + (int64_t(t) * a.heads + h) * a.x_stride +
                                                             kb * kKb + col)
                           : make_uint4(0, 0, 0, 0);
    }
  };
  load_w(0);
  pdl_wait();
  load_x(0);
  float acc[kMmaCols / 8][4] = {};
  for (int kb = 0; kb < kbs; ++kb) {
    const float s = __ldg(a.w_scale + (row0 / 128) * kbs + kb);
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
      const int chunk = threadIdx.x + kMmaThreads * i, r = chunk / 8, col = chunk % 8 * 16;
      const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&wv[i]);
      uint32_t packed[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
        packed[j] = pack_bf16x2(f.x * s, f.y * s);
      }
      *reinterpret_cast<uint4*>(&ws[r][col]) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      *reinterpret_cast<uint4*>(&ws[r][col + 8]) = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    }
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int chunk = threadIdx.x + kMmaThreads * i, r = chunk / 16, col = chunk % 16 * 8;
      *reinterpret_cast<uint4*>(&xs[r][col]) = xv[i];
    }
    __syncthreads();
    if (kb + 1 < kbs) {
      load_w(kb + 1);
      load_x(kb + 1);
    }
    const int tr = warp * 16 + g;
#pragma unroll
    for (int ks = 0; ks < kKb; ks += 16) {
      uint32_t af[4];
      af[0] = *reinterpret_cast<const uint32_t*>(&xs[tr][ks + 2 * c]);
      af[1] = *reinterpret_cast<const uint32_t*>(&xs[tr + 8][ks + 2 * c]);
      af[2] = *reinterpret_cast<const uint32_t*>(&xs[tr][ks + 2 * c + 8]);
      af[3] = *reinterpret_cast<const uint32_t*>(&xs[tr + 8][ks + 2 * c + 8]);
#pragma unroll
      for (int j = 0; j < kMmaCols / 8; ++j) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ws[j * 8 + g][ks + 2 * c]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ws[j * 8 + g][ks + 2 * c + 8]);
        mma_bf16_16816(acc[j], af, b0, b1);
      }
    }
    __syncthreads();
  }
  const int t_lo = t0 + warp * 16 + g, t_hi = t_lo + 8;
#pragma unroll
  for (int j = 0; j < kMmaCols / 8; ++j) {
    const int n = n0 + j * 8 + 2 * c;
    if (t_lo < a.tokens)
      *reinterpret_cast<uint32_t*>(a.out + (int64_t(t_lo) * a.heads + h) * a.out_stride + n) =
          pack_bf16x2(acc[j][0], acc[j][1]);
    if (t_hi < a.tokens)
      *reinterpret_cast<uint32_t*>(a.out + (int64_t(t_hi) * a.heads + h) * a.out_stride + n) =
          pack_bf16x2(acc[j][2], acc[j][3]);
  }
}

}  // namespace

bool head_bmm_fp8_applies(int64_t k, int64_t n) { return k > 0 && k % 128 == 0 && n > 0 && n % 128 == 0; }

void head_bmm_fp8(const __nv_bfloat16* x, const uint8_t* w, const float* w_scale, int64_t tokens, int64_t heads,
                  int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out, int64_t out_head_stride,
                  cudaStream_t stream, HeadBmmFp8Path path) {
  MLA_CUDA_REQUIRE(head_bmm_fp8_applies(k, n) && tokens >= 0,
                   "head_bmm_fp8: K " + std::to_string(k) + ", N " + std::to_string(n) +
                       " (both multiples of 128)");
  MLA_CUDA_REQUIRE(x_head_stride >= k && x_head_stride % 8 == 0 && out_head_stride >= n && out_head_stride % 2 == 0,
                   "head_bmm_fp8: x rows of " + std::to_string(x_head_stride) + " and out rows of " +
                       std::to_string(out_head_stride) + " (x a multiple of 8 >= K, out even >= N)");
  if (tokens == 0 || heads == 0) return;
  const bool streams = tokens <= kHeadBmmFp8StreamTokens && k <= 512;
  if (path == HeadBmmFp8Path::Auto) path = streams ? HeadBmmFp8Path::Stream : HeadBmmFp8Path::Mma;
  MLA_CUDA_REQUIRE(path == HeadBmmFp8Path::Mma || streams,
                   "head_bmm_fp8: the streaming kernel takes at most " + std::to_string(kHeadBmmFp8StreamTokens) +
                       " tokens and K <= 512");
  const Args a{x, w, w_scale, out, int(tokens), int(heads), int(n), int(k), x_head_stride, out_head_stride};
  if (path == HeadBmmFp8Path::Mma) {
    const dim3 grid(unsigned(n / kMmaCols), unsigned(heads), unsigned((tokens + kMmaTokens - 1) / kMmaTokens));
    launch_dependent(head_bmm_fp8_mma_kernel, grid, kMmaThreads, 0, stream, a);
  } else {
    const int64_t rows = heads * n;
    auto launch = [&](auto kernel, int lanes) {
      const int64_t block_rows = kStreamThreads / lanes * kRowsPerThread;
      launch_dependent(kernel, dim3(unsigned(rows / block_rows)), kStreamThreads, 0, stream, a);
    };
    if (k == 128)
      launch(head_bmm_fp8_stream_kernel<8>, 8);
    else if (k == 256)
      launch(head_bmm_fp8_stream_kernel<16>, 16);
    else
      launch(head_bmm_fp8_stream_kernel<32>, 32);
  }
  check_launch("head_bmm_fp8");
}

}  // namespace mlaserve::cuda

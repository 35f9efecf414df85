#include "kernels/cuda/head_bmm_fp8.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope_rotate.cuh"

namespace mlaserve::cuda {
namespace {

struct Args {
  const __nv_bfloat16* x;
  const uint8_t* w;
  const float* w_scale;
  __nv_bfloat16* out;
  int tokens, heads, n, k;
  int64_t x_stride, out_stride;  // per head
  HeadBmmFp8Rope rope;           // out null: none
};

// The q split's pairs (HeadBmmFp8Rope), spread over the grid's threads: as
// mla_prepare_kernel's rotate_pair on rope_cos_sin(positions[t], ...).
__device__ void rope_q_split(const HeadBmmFp8Rope& r, int tokens, int heads) {
  const int F = r.num_freqs;
  const int64_t pairs = int64_t(tokens) * heads * F, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += stride) {
    const int f = int(i % F), h = int(i / F % heads), t = int(i / F / heads);
    const float2 cs = rope_cos_sin(float(r.positions[t]), r.inv_freq[f], r.cos_sin_scale);
    const __nv_bfloat16* src = r.q + t * r.q_stride + int64_t(h) * (r.nope_dim + 2 * F) + r.nope_dim + 2 * f;
    const __nv_bfloat162 v = rope_rotate(__bfloat162float(src[0]), __bfloat162float(src[1]), cs);
    __nv_bfloat16* dst = r.out + (int64_t(t) * heads + h) * r.out_width + 2 * f;
    dst[0] = v.x;
    dst[1] = v.y;
  }
}

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
    wv[r] = load_streamed_16(a.w + row * kK + lane * 16);
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
  // After the product: its stores are the attention's critical path, the
  // few pairs a thread ropes are not.
  if (a.rope.out) rope_q_split(a.rope, a.tokens, a.heads);
}

// ---- tensor cores (larger batches) ------------------------------------------
// A block: kTokens tokens x kCols columns of one head; 4 warps of 16 tokens x
// 64 columns each run m16n8k16. Per 128-wide K block (one weight scale: the
// block's rows lie in one 128-row block) the weight bytes are widened into ws
// and the x rows copied into xs; the next K block's loads are in registers
// while this one multiplies. Rows padded by 8 bf16 so a fragment's 8 rows hit
// distinct banks. 64 x 64 for bf16 output; 32 x 128 when the output is
// quantized, so that a block holds whole 128-wide (token, head) rows.
constexpr int kMmaThreads = 128, kKb = 128, kPad = 8;

struct QuantizedOut {
  uint8_t* q;      // {T, H * N}
  float* scale;    // [h][scale_ld]: N == 128, one group a head
  int64_t scale_ld;
};

template <int kTokens, int kCols, bool kQuantize>
__global__ void __launch_bounds__(kMmaThreads) head_bmm_fp8_mma_kernel(Args a, QuantizedOut qo) {
  constexpr int kWarpsT = kTokens / 16;
  static_assert(kWarpsT * (kCols / 64) == kMmaThreads / 32, "one warp a 16 x 64 tile");
  constexpr int kWChunks = kCols * kKb / 16 / kMmaThreads;     // 16-byte weight chunks a thread
  constexpr int kXChunks = kTokens * kKb * 2 / 16 / kMmaThreads;  // 16-byte x chunks a thread
  pdl_launch_dependents();
  __shared__ __align__(16) __nv_bfloat16 ws[kCols][kKb + kPad];
  __shared__ __align__(16) __nv_bfloat16 xs[kTokens][kKb + kPad];
  const int h = blockIdx.y, n0 = blockIdx.x * kCols, t0 = blockIdx.z * kTokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int warp_t = warp % kWarpsT, warp_c = warp / kWarpsT;
  const int64_t row0 = int64_t(h) * a.n + n0;
  const int kbs = a.k / kKb;
  uint4 wv[kWChunks], xv[kXChunks];
  auto load_w = [&](int kb) {
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
      const int chunk = threadIdx.x + kMmaThreads * i, r = chunk / 8, col = chunk % 8 * 16;
      wv[i] = load_streamed_16(a.w + (row0 + r) * a.k + kb * kKb + col);
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
  float acc[8][4] = {};
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
    const int tr = warp_t * 16 + g, wr = warp_c * 64 + g;
#pragma unroll
    for (int ks = 0; ks < kKb; ks += 16) {
      uint32_t af[4];
      af[0] = *reinterpret_cast<const uint32_t*>(&xs[tr][ks + 2 * c]);
      af[1] = *reinterpret_cast<const uint32_t*>(&xs[tr + 8][ks + 2 * c]);
      af[2] = *reinterpret_cast<const uint32_t*>(&xs[tr][ks + 2 * c + 8]);
      af[3] = *reinterpret_cast<const uint32_t*>(&xs[tr + 8][ks + 2 * c + 8]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ws[wr + j * 8][ks + 2 * c]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ws[wr + j * 8][ks + 2 * c + 8]);
        mma_bf16_16816(acc[j], af, b0, b1);
      }
    }
    __syncthreads();
  }
  const int r_lo = warp_t * 16 + g, t_lo = t0 + r_lo, t_hi = t_lo + 8;
  if constexpr (!kQuantize) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + warp_c * 64 + j * 8 + 2 * c;
      if (t_lo < a.tokens)
        *reinterpret_cast<uint32_t*>(a.out + (int64_t(t_lo) * a.heads + h) * a.out_stride + n) =
            pack_bf16x2(acc[j][0], acc[j][1]);
      if (t_hi < a.tokens)
        *reinterpret_cast<uint32_t*>(a.out + (int64_t(t_hi) * a.heads + h) * a.out_stride + n) =
            pack_bf16x2(acc[j][2], acc[j][3]);
    }
  } else {
    // The bf16 values the other instance writes, quantized as
    // quantize_group_16lanes does: a row's amax over its quad's lanes, then
    // over the two warps holding its halves.
    static_assert(kCols == kKb, "a block holds whole 128-wide groups");
    __shared__ float half_amax[2][kTokens];
    float amax_lo = 0.0f, amax_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = __bfloat162float(__float2bfloat16(acc[j][e]));
      amax_lo = fmaxf(amax_lo, fmaxf(fabsf(acc[j][0]), fabsf(acc[j][1])));
      amax_hi = fmaxf(amax_hi, fmaxf(fabsf(acc[j][2]), fabsf(acc[j][3])));
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      amax_lo = fmaxf(amax_lo, __shfl_xor_sync(0xffffffffu, amax_lo, o));
      amax_hi = fmaxf(amax_hi, __shfl_xor_sync(0xffffffffu, amax_hi, o));
    }
    if (c == 0) {
      half_amax[warp_c][r_lo] = amax_lo;
      half_amax[warp_c][r_lo + 8] = amax_hi;
    }
    __syncthreads();
    const float s_lo = fp8_group_scale(fmaxf(half_amax[0][r_lo], half_amax[1][r_lo]));
    const float s_hi = fp8_group_scale(fmaxf(half_amax[0][r_lo + 8], half_amax[1][r_lo + 8]));
    const float inv_lo = 1.0f / s_lo, inv_hi = 1.0f / s_hi;
    const int64_t width = int64_t(a.heads) * a.n;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t col = int64_t(h) * a.n + n0 + warp_c * 64 + j * 8 + 2 * c;
      if (t_lo < a.tokens)
        *reinterpret_cast<__nv_fp8x2_storage_t*>(qo.q + t_lo * width + col) =
            pack_e4m3x2(acc[j][0] * inv_lo, acc[j][1] * inv_lo);
      if (t_hi < a.tokens)
        *reinterpret_cast<__nv_fp8x2_storage_t*>(qo.q + t_hi * width + col) =
            pack_e4m3x2(acc[j][2] * inv_hi, acc[j][3] * inv_hi);
    }
    if (warp_c == 0 && c == 0) {
      if (t_lo < a.tokens) qo.scale[h * qo.scale_ld + t_lo] = s_lo;
      if (t_hi < a.tokens) qo.scale[h * qo.scale_ld + t_hi] = s_hi;
    }
  }
}

}  // namespace

bool head_bmm_fp8_applies(int64_t k, int64_t n) { return k > 0 && k % 128 == 0 && n > 0 && n % 128 == 0; }

bool head_bmm_fp8_streams(int64_t tokens, int64_t k) { return tokens <= kHeadBmmFp8StreamTokens && k <= 512; }

namespace {

void check_args(int64_t tokens, int64_t x_head_stride, int64_t k, int64_t n) {
  MLA_CUDA_REQUIRE(head_bmm_fp8_applies(k, n) && tokens >= 0,
                   "head_bmm_fp8: K " + std::to_string(k) + ", N " + std::to_string(n) +
                       " (both multiples of 128)");
  MLA_CUDA_REQUIRE(x_head_stride >= k && x_head_stride % 8 == 0,
                   "head_bmm_fp8: x rows of " + std::to_string(x_head_stride) + " (a multiple of 8 >= K)");
}

template <int kTokens, int kCols, bool kQuantize>
void launch_mma(const Args& a, const QuantizedOut& qo, cudaStream_t stream) {
  const dim3 grid(unsigned(a.n / kCols), unsigned(a.heads), unsigned((a.tokens + kTokens - 1) / kTokens));
  launch_dependent(head_bmm_fp8_mma_kernel<kTokens, kCols, kQuantize>, grid, kMmaThreads, 0, stream, a, qo);
}

}  // namespace

void head_bmm_fp8(const __nv_bfloat16* x, const uint8_t* w, const float* w_scale, int64_t tokens, int64_t heads,
                  int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out, int64_t out_head_stride,
                  cudaStream_t stream, HeadBmmFp8Path path, const HeadBmmFp8Rope* rope) {
  check_args(tokens, x_head_stride, k, n);
  MLA_CUDA_REQUIRE(out_head_stride >= n && out_head_stride % 2 == 0,
                   "head_bmm_fp8: out rows of " + std::to_string(out_head_stride) + " (even, >= N)");
  if (tokens == 0 || heads == 0) return;
  const bool streams = head_bmm_fp8_streams(tokens, k);
  if (path == HeadBmmFp8Path::Auto) path = streams ? HeadBmmFp8Path::Stream : HeadBmmFp8Path::Mma;
  MLA_CUDA_REQUIRE(path == HeadBmmFp8Path::Mma || streams,
                   "head_bmm_fp8: the streaming kernel takes at most " + std::to_string(kHeadBmmFp8StreamTokens) +
                       " tokens and K <= 512");
  MLA_CUDA_REQUIRE(!rope || (path == HeadBmmFp8Path::Stream && rope->q && rope->positions && rope->inv_freq &&
                             rope->out && rope->num_freqs > 0),
                   "head_bmm_fp8: the q split's rope rides in the streaming kernel only, with every pointer set");
  Args a{x, w, w_scale, out, int(tokens), int(heads), int(n), int(k), x_head_stride, out_head_stride, {}};
  if (rope) a.rope = *rope;
  if (path == HeadBmmFp8Path::Mma) {
    launch_mma<64, 64, false>(a, QuantizedOut{}, stream);
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

void head_bmm_fp8_quantized(const __nv_bfloat16* x, const uint8_t* w, const float* w_scale, int64_t tokens,
                            int64_t heads, int64_t x_head_stride, int64_t k, int64_t n, uint8_t* q, float* scale,
                            int64_t scale_ld, cudaStream_t stream) {
  check_args(tokens, x_head_stride, k, n);
  MLA_CUDA_REQUIRE(n == 128 && scale_ld >= tokens,
                   "head_bmm_fp8_quantized: N " + std::to_string(n) + " (must be 128) and scale_ld " +
                       std::to_string(scale_ld) + " >= " + std::to_string(tokens) + " tokens");
  if (tokens == 0 || heads == 0) return;
  const Args a{x, w, w_scale, nullptr, int(tokens), int(heads), int(n), int(k), x_head_stride, 0, {}};
  launch_mma<32, 128, true>(a, QuantizedOut{q, scale, scale_ld}, stream);
  check_launch("head_bmm_fp8_quantized");
}

}  // namespace mlaserve::cuda

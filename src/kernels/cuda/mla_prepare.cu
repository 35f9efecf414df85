#include "kernels/cuda/mla_prepare.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/fp8_kv_cache.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope_rotate.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxFreqs = 256;
constexpr int kMaxFp8Row = 1024;  // L + R of an FP8 cache row
constexpr int kMaxSummedRow = 2048;  // q_a or L + R formed from split-K partials
enum Part { kLatentWrite = 0, kQaNorm = 1, kQSplit = 2, kParts = 3 };

// rms_norm_kernel's arithmetic (scalar accesses: the rows here are a few
// hundred values and may start at any column).
__device__ float row_inv_rms(const __nv_bfloat16* x, int n, float eps) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = __bfloat162float(x[i]);
    ss += v * v;
  }
  return rsqrtf(block_sum(ss) / float(n) + eps);
}

__device__ __forceinline__ __nv_bfloat16 normed(const __nv_bfloat16* x, const __nv_bfloat16* w, int i,
                                                float inv_rms) {
  return __float2bfloat16_rn(__bfloat162float(x[i]) * inv_rms * __bfloat162float(w[i]));
}

// out[i] = x[i] * inv_rms * w[i].
__device__ void norm_row(const __nv_bfloat16* x, const __nv_bfloat16* w, int n, float eps, __nv_bfloat16* out) {
  const float inv_rms = row_inv_rms(x, n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = normed(x, w, i, inv_rms);
}

// norm_row's bf16 values quantized 1x128 (16 lanes a group, as fp8_quant.cu's
// kernels): q{n} and scale[g * scale_ld] of row t.
__device__ void norm_row_quantized(const __nv_bfloat16* x, const __nv_bfloat16* w, int n, float eps, uint8_t* q,
                                   float* scale, int64_t scale_ld) {
  const float inv_rms = row_inv_rms(x, n, eps);
  const int groups = n / kFp8Group, per_pass = kThreads / 16, j = threadIdx.x & 15;
  for (int g0 = 0; g0 < groups; g0 += per_pass) {  // the same passes for every lane (shuffles)
    const int g = g0 + threadIdx.x / 16;
    const bool live = g < groups;
    float v[8] = {};
    if (live)
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = __bfloat162float(normed(x, w, g * kFp8Group + 8 * j + e, inv_rms));
    const QuantizedGroupPart part = quantize_group_16lanes(v);
    if (live) {
      *reinterpret_cast<uint2*>(q + g * kFp8Group + 8 * j) = part.q;
      if (j == 0) scale[g * scale_ld] = part.scale;
    }
  }
}

// rope_kernel's rotation of pair i with cs[i] = rope_cos_sin(...).
__device__ __forceinline__ void rotate_pair(const __nv_bfloat16* src, const float2* cs, int i, __nv_bfloat16* dst) {
  const __nv_bfloat162 r = rope_rotate(__bfloat162float(src[2 * i]), __bfloat162float(src[2 * i + 1]), cs[i]);
  dst[2 * i] = r.x;
  dst[2 * i + 1] = r.y;
}

// Token t's n projection values from column col: read in place, or
// (p.partials) their split-K sum formed into row_s as split_k_sum_kernel
// forms it (four columns a thread, eight splits' loads in flight at once).
__device__ const __nv_bfloat16* projection_row(const MlaPrepareParams& p, const __nv_bfloat16* in_place,
                                               int64_t stride, int64_t t, int64_t col, int n, __nv_bfloat16* row_s) {
  if (!p.partials) return in_place + t * stride;
  constexpr int kSplitsInFlight = 8;
  const int64_t split_stride = int64_t(p.num_tokens) * p.partials_width;
  for (int i = 4 * threadIdx.x; i < n; i += 4 * blockDim.x) {
    const float* src = p.partials + t * p.partials_width + col + i;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < p.splits; s0 += kSplitsInFlight) {
      float4 v[kSplitsInFlight];
#pragma unroll
      for (int j = 0; j < kSplitsInFlight; ++j)
        if (s0 + j < p.splits) v[j] = *reinterpret_cast<const float4*>(src + (s0 + j) * split_stride);
#pragma unroll
      for (int j = 0; j < kSplitsInFlight; ++j) {
        if (s0 + j >= p.splits) break;
        if (s0 + j == 0) {
          sum = v[0];
        } else {
          sum.x += v[j].x;
          sum.y += v[j].y;
          sum.z += v[j].z;
          sum.w += v[j].w;
        }
      }
    }
    row_s[i] = __float2bfloat16_rn(sum.x);
    row_s[i + 1] = __float2bfloat16_rn(sum.y);
    row_s[i + 2] = __float2bfloat16_rn(sum.z);
    row_s[i + 3] = __float2bfloat16_rn(sum.w);
  }
  __syncthreads();
  return row_s;
}

__global__ void __launch_bounds__(kThreads) mla_prepare_kernel(MlaPrepareParams p) {
  pdl_enter();  // everything it reads comes from the projection GEMM or the batch upload
  const int64_t t = blockIdx.x;
  const int part = blockIdx.y;
  __shared__ __nv_bfloat16 summed_row[kMaxSummedRow];
  if (part == kQaNorm) {
    if (!p.q_a_out && !p.q_a_q) return;
    const __nv_bfloat16* q_a = projection_row(p, p.q_a, p.q_a_stride, t, 0, p.q_a_dim, summed_row);
    if (p.q_a_out)
      norm_row(q_a, p.q_a_norm, p.q_a_dim, p.eps, p.q_a_out + t * p.q_a_dim);
    else if (p.q_a_q)
      norm_row_quantized(q_a, p.q_a_norm, p.q_a_dim, p.eps, p.q_a_q + t * p.q_a_dim, p.q_a_scale + t,
                         p.q_a_scale_ld);
    return;
  }
  if ((part == kLatentWrite && !p.cache && !p.fp8_cache) || (part == kQSplit && !p.q_pe_out)) return;

  // cos/sin of this token's angles, as rope_kernel forms them.
  __shared__ float2 cs[kMaxFreqs];
  const float pos = float(p.positions[t]);
  for (int i = threadIdx.x; i < p.num_freqs; i += blockDim.x) cs[i] = rope_cos_sin(pos, p.inv_freq[i], p.cos_sin_scale);
  __syncthreads();
  const int R = 2 * p.num_freqs;

  if (part == kLatentWrite) {
    const __nv_bfloat16* src =
        projection_row(p, p.kv, p.kv_stride, t, p.partials_kv_col, p.latent_dim + 2 * p.num_freqs, summed_row);
    __shared__ __nv_bfloat16 fp8_row[kMaxFp8Row];  // the bf16 row an FP8 cache quantizes
    __nv_bfloat16* row = p.fp8_cache ? fp8_row : p.cache + int64_t(p.out_slots[t]) * (p.latent_dim + R);
    norm_row(src, p.kv_norm, p.latent_dim, p.eps, row);
    for (int i = threadIdx.x; i < p.num_freqs; i += blockDim.x)
      rotate_pair(src + p.latent_dim, cs, i, row + p.latent_dim);
    if (p.fp8_cache) {
      __syncthreads();
      const Fp8KvLayout layout{p.latent_dim, R};
      store_fp8_kv_row(fp8_row, layout, p.fp8_cache + int64_t(p.out_slots[t]) * layout.slot_bytes());
    }
    return;
  }

  const int H = p.num_heads, Dn = p.nope_dim;
  const __nv_bfloat16* q = p.q + t * p.q_stride;
  if (p.q_nope_out) {
    for (int i = threadIdx.x; i < H * Dn; i += blockDim.x) {
      const int h = i / Dn, d = i % Dn;
      p.q_nope_out[(t * H + h) * p.q_nope_width + d] = q[int64_t(h) * (Dn + R) + d];
    }
  }
  for (int i = threadIdx.x; i < H * p.num_freqs; i += blockDim.x) {
    const int h = i / p.num_freqs, f = i % p.num_freqs;
    rotate_pair(q + int64_t(h) * (Dn + R) + Dn, cs, f, p.q_pe_out + (t * H + h) * p.q_pe_width);
  }
}

}  // namespace

void mla_prepare(const MlaPrepareParams& p, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(p.num_freqs > 0 && p.num_freqs <= kMaxFreqs,
                   "mla_prepare: " + std::to_string(p.num_freqs) + " rope frequencies (1 to " +
                       std::to_string(kMaxFreqs) + " supported)");
  MLA_CUDA_REQUIRE(!p.fp8_cache || p.latent_dim + 2 * p.num_freqs <= kMaxFp8Row,
                   "mla_prepare: fp8 cache rows of " + std::to_string(p.latent_dim + 2 * p.num_freqs) +
                       " values (at most " + std::to_string(kMaxFp8Row) + " supported)");
  MLA_CUDA_REQUIRE(!p.q_a_q || (p.q_a_dim % kFp8Group == 0 && p.q_a_scale_ld >= p.num_tokens),
                   "mla_prepare: quantized q_a rows of " + std::to_string(p.q_a_dim) +
                       " values (a multiple of 128) with scale_ld >= the token count");
  MLA_CUDA_REQUIRE(!p.partials || (p.splits > 0 && p.q_a_dim <= kMaxSummedRow && p.q_a_dim % 4 == 0 &&
                                    p.latent_dim + 2 * p.num_freqs <= kMaxSummedRow && p.latent_dim % 4 == 0 &&
                                    p.partials_width % 4 == 0 && p.partials_kv_col % 4 == 0 &&
                                    reinterpret_cast<uintptr_t>(p.partials) % 16 == 0),
                   "mla_prepare: projection rows summed from split-K partials take at most " +
                       std::to_string(kMaxSummedRow) + " values, in 16-byte aligned groups of four");
  if (p.num_tokens == 0 || !(p.cache || p.fp8_cache || p.q_a_out || p.q_a_q || p.q_pe_out)) return;
  launch_dependent(mla_prepare_kernel, dim3(unsigned(p.num_tokens), kParts), dim3(kThreads), 0, stream, p);
  check_launch("mla_prepare");
}

}  // namespace mlaserve::cuda

#include "kernels/cuda/mla_prepare.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/fp8_kv_cache.cuh"
#include "kernels/cuda/rope_rotate.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxFreqs = 256;
constexpr int kMaxFp8Row = 1024;  // L + R of an FP8 cache row
enum Part { kLatentWrite = 0, kQaNorm = 1, kQSplit = 2, kParts = 3 };

// out[i] = x[i] * inv_rms * w[i], rms_norm_kernel's arithmetic (scalar
// accesses: the rows here are a few hundred values and may start at any column).
__device__ void norm_row(const __nv_bfloat16* x, const __nv_bfloat16* w, int n, float eps, __nv_bfloat16* out) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = __bfloat162float(x[i]);
    ss += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    out[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * inv_rms * __bfloat162float(w[i]));
}

// rope_kernel's rotation of pair i with cs[i] = rope_cos_sin(...).
__device__ __forceinline__ void rotate_pair(const __nv_bfloat16* src, const float2* cs, int i, __nv_bfloat16* dst) {
  const __nv_bfloat162 r = rope_rotate(__bfloat162float(src[2 * i]), __bfloat162float(src[2 * i + 1]), cs[i]);
  dst[2 * i] = r.x;
  dst[2 * i + 1] = r.y;
}

__global__ void __launch_bounds__(kThreads) mla_prepare_kernel(MlaPrepareParams p) {
  pdl_enter();  // everything it reads comes from the projection GEMM or the batch upload
  const int64_t t = blockIdx.x;
  const int part = blockIdx.y;
  if (part == kQaNorm) {
    if (p.q_a_out) norm_row(p.q_a + t * p.q_a_stride, p.q_a_norm, p.q_a_dim, p.eps, p.q_a_out + t * p.q_a_dim);
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
    const __nv_bfloat16* src = p.kv + t * p.kv_stride;
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
  if (p.num_tokens == 0 || !(p.cache || p.fp8_cache || p.q_a_out || p.q_pe_out)) return;
  launch_dependent(mla_prepare_kernel, dim3(unsigned(p.num_tokens), kParts), dim3(kThreads), 0, stream, p);
  check_launch("mla_prepare");
}

}  // namespace mlaserve::cuda

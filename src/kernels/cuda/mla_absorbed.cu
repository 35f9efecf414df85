#include "kernels/cuda/mla_absorbed.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_sm80.cuh"

namespace mlaserve::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kHeadsPerBlock = 16;  // one m16 tile of query heads
constexpr int kBlockN = 32;         // latent rows per pipeline stage
constexpr int kWarps = 4;
constexpr int kLoadersPerRow = 4;  // threads copying one latent row
constexpr int kMaxSplits = 64;
constexpr int kMinRowsPerSplit = 64;  // below this a split is all latency

// Which sequence token t belongs to, and the kv range it attends to.
struct TokenRange {
  int kv_begin, attend;
};
__device__ __forceinline__ TokenRange token_range(const MlaAbsorbedParams& p, int t) {
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.q_indptr[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  const int q_len = p.q_indptr[lo + 1] - p.q_indptr[lo];
  const int kv_len = p.kv_indptr[lo + 1] - p.kv_indptr[lo];
  return {p.kv_indptr[lo], kv_len - q_len + (t - p.q_indptr[lo]) + 1};
}

// Rows of the split: a multiple of kBlockN so splits start on tile bounds.
__device__ __forceinline__ int split_chunk(int attend, int num_splits) {
  return ((attend + num_splits - 1) / num_splits + kBlockN - 1) / kBlockN * kBlockN;
}

// NOTES: smem rows are padded by 16 bytes (584 bf16 = 73 x 16 B, odd), so the
// eight 16-byte rows an ldmatrix phase reads fall in distinct bank groups.
// ~95 KB of smem lets two blocks share an SM: one block's tile loads overlap
// the other's tensor-core work.
template <int kL, int kR>
__global__ void __launch_bounds__(kWarps * 32, 2) mla_absorbed_mma_kernel(MlaAbsorbedParams p) {
  constexpr int kD = kL + kR, kStride = kD + 8, kPStride = kBlockN + 8;
  constexpr int kDimsPerWarp = kL / kWarps, kNTiles = kDimsPerWarp / 8;
  constexpr int kChunksPerRow = kD / 8;
  static_assert(kD % 32 == 0 && kDimsPerWarp % 16 == 0, "latent/rope widths must tile by 16");
  static_assert(kBlockN == 8 * kWarps, "each warp scores 8 latent rows of a tile");

  extern __shared__ __align__(16) uint8_t smem_raw[];
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [16][kStride]
  __nv_bfloat16* kv_s = q_s + kHeadsPerBlock * kStride;     // [2][kBlockN][kStride]
  __nv_bfloat16* p_s = kv_s + 2 * kBlockN * kStride;        // [16][kPStride]
  auto* red_max = reinterpret_cast<float*>(p_s + kHeadsPerBlock * kPStride);  // [kWarps][16]
  float* red_sum = red_max + kWarps * kHeadsPerBlock;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c2 = (lane % 4) * 2;
  const int split = blockIdx.x, h0 = blockIdx.y * kHeadsPerBlock, t = blockIdx.z;
  const int heads = min(kHeadsPerBlock, p.num_heads - h0);
  const TokenRange range = token_range(p, t);
  const int chunk = split_chunk(range.attend, p.num_splits);
  const int begin = split * chunk, end = min(begin + chunk, range.attend);

  if (begin >= end) {  // this split got no rows: an empty partial result
    if (p.num_splits > 1) {
      const int64_t sth0 = (int64_t(split) * p.num_tokens + t) * p.num_heads + h0;
      if (tid < heads) p.partial_lse[sth0 + tid] = -INFINITY;
      // Zeros, so the merge can read every split unconditionally (weight 0).
      for (int i = tid; i < heads * kL; i += blockDim.x) p.partial_out[sth0 * kL + i] = 0.0f;
    } else {
      for (int i = tid; i < heads * kL; i += blockDim.x)
        p.out[(int64_t(t) * p.num_heads + h0) * kL + i] = __float2bfloat16(0.0f);
    }
    return;
  }

  for (int c = tid; c < kHeadsPerBlock * kChunksPerRow; c += blockDim.x) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = r < heads;
    const __nv_bfloat16* src = p.q + (int64_t(t) * p.num_heads + h0 + (valid ? r : 0)) * kD + col;
    cp_async_16(q_s + r * kStride + col, src, valid ? 16 : 0);
  }
  // NOTES: each thread copies 18 chunks of one latent row, so it reads one
  // slot index per tile, and reads it a tile ahead: a dependent global load
  // per chunk (the naive mapping) serialized ~18 L2 round trips per tile.
  static_assert(kBlockN * kLoadersPerRow == kWarps * 32 && kChunksPerRow % kLoadersPerRow == 0, "row mapping");
  const int32_t* slots = p.kv_slots + range.kv_begin;
  const int load_row = tid / kLoadersPerRow, load_chunk0 = tid % kLoadersPerRow;
  auto slot_of = [&](int tile_start) -> int64_t {
    const int j = tile_start + load_row;
    return j < end ? int64_t(slots[j]) : int64_t(-1);
  };
  auto load_tile = [&](int64_t slot, int buf) {
    __nv_bfloat16* dst = kv_s + (buf * kBlockN + load_row) * kStride;
    const __nv_bfloat16* src = p.cache + (slot >= 0 ? slot : 0) * kD;
#pragma unroll
    for (int i = 0; i < kChunksPerRow / kLoadersPerRow; ++i) {
      const int col = (load_chunk0 + kLoadersPerRow * i) * 8;
      cp_async_16(dst + col, src + col, slot >= 0 ? 16 : 0);
    }
  };
  load_tile(slot_of(begin), 0);
  cp_async_commit();
  int64_t next_slot = slot_of(begin + kBlockN);

  float o[kNTiles][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kLog2e;
  const int num_tiles = (end - begin + kBlockN - 1) / kBlockN;

  for (int it = 0; it < num_tiles; ++it) {
    const int tile_start = begin + it * kBlockN, buf = it & 1;
    if (it + 1 < num_tiles) load_tile(next_slot, buf ^ 1);
    cp_async_commit();
    next_slot = slot_of(tile_start + 2 * kBlockN);  // consumed next iteration: latency hidden
    cp_async_wait<1>();
    __syncthreads();

    // S{16 heads, 8 rows} = Q · Kᵀ over all kD columns for this warp's rows.
    // NOTES: four independent accumulators: one accumulator would chain 36
    // dependent mma.sync (~35 cycles each) per tile, the critical path of a
    // decode block when the batch is small.
    float s4[4][4] = {};
    const __nv_bfloat16* k_rows = kv_s + (buf * kBlockN + warp * 8) * kStride;
#pragma unroll
    for (int k = 0; k < kD; k += 32) {
      uint32_t a0[4], a1[4], b[4];
      ldmatrix_x4(a0, q_s + (lane % 16) * kStride + k + (lane / 16) * 8);
      ldmatrix_x4(a1, q_s + (lane % 16) * kStride + k + 16 + (lane / 16) * 8);
      ldmatrix_x4(b, k_rows + (lane % 8) * kStride + k + (lane / 8) * 8);
      mma_bf16_16816(s4[(k / 32) % 2 * 2], a0, b[0], b[1]);
      mma_bf16_16816(s4[(k / 32) % 2 * 2 + 1], a1, b[2], b[3]);
    }
    float s[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] = (s4[0][e] + s4[1][e]) + (s4[2][e] + s4[3][e]);

    // Online softmax in the log2 domain; the tile max spans all warps.
    const int col = tile_start + warp * 8 + c2;
    float v[4];
    v[0] = col < end ? s[0] * scale_log2 : -INFINITY;
    v[1] = col + 1 < end ? s[1] * scale_log2 : -INFINITY;
    v[2] = col < end ? s[2] * scale_log2 : -INFINITY;
    v[3] = col + 1 < end ? s[3] * scale_log2 : -INFINITY;
    float mx[2] = {fmaxf(v[0], v[1]), fmaxf(v[2], v[3])};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (lane % 4 == 0) {
      red_max[warp * kHeadsPerBlock + g] = mx[0];
      red_max[warp * kHeadsPerBlock + g + 8] = mx[1];
    }
    __syncthreads();
    float m_new[2], alpha[2], sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = red_max[g + 8 * r];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) tile_max = fmaxf(tile_max, red_max[w * kHeadsPerBlock + g + 8 * r]);
      m_new[r] = fmaxf(m_run[r], tile_max);  // finite: every tile has a valid row
      alpha[r] = exp2f(m_run[r] - m_new[r]);
      m_run[r] = m_new[r];
    }
    const float p0 = exp2f(v[0] - m_new[0]), p1 = exp2f(v[1] - m_new[0]);
    const float p2 = exp2f(v[2] - m_new[1]), p3 = exp2f(v[3] - m_new[1]);
    *reinterpret_cast<uint32_t*>(p_s + g * kPStride + warp * 8 + c2) = pack_bf16x2(p0, p1);
    *reinterpret_cast<uint32_t*>(p_s + (g + 8) * kPStride + warp * 8 + c2) = pack_bf16x2(p2, p3);
    sum[0] = p0 + p1;
    sum[1] = p2 + p3;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
    if (lane % 4 == 0) {
      red_sum[warp * kHeadsPerBlock + g] = sum[0];
      red_sum[warp * kHeadsPerBlock + g + 8] = sum[1];
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) tile_sum += red_sum[w * kHeadsPerBlock + g + 8 * r];
      l_run[r] = l_run[r] * alpha[r] + tile_sum;
    }

    // O{16 heads, this warp's kDimsPerWarp} += P{16, kBlockN} · c_kv{kBlockN, dims}.
    const __nv_bfloat16* v_rows = kv_s + buf * kBlockN * kStride;
#pragma unroll
    for (int kk = 0; kk < kBlockN; kk += 16) {
      uint32_t a[4];
      ldmatrix_x4(a, p_s + (lane % 16) * kPStride + kk + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < kNTiles; j += 2) {
        uint32_t b[4];
        const int n0 = warp * kDimsPerWarp + j * 8;
        ldmatrix_x4_trans(b, v_rows + (kk + lane % 8 + ((lane / 8) % 2) * 8) * kStride + n0 + (lane / 16) * 8);
        mma_bf16_16816(o[j], a, b[0], b[1]);
        mma_bf16_16816(o[j + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // the next iteration refills this buffer and the reductions
  }

  const float inv[2] = {1.0f / l_run[0], 1.0f / l_run[1]};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (row >= heads) continue;
    const int64_t th = int64_t(t) * p.num_heads + h0 + row;
    if (p.num_splits == 1) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int dim = warp * kDimsPerWarp + j * 8 + c2;
        *reinterpret_cast<__nv_bfloat162*>(p.out + th * kL + dim) =
            __floats2bfloat162_rn(o[j][2 * r] * inv[r], o[j][2 * r + 1] * inv[r]);
      }
    } else {
      const int64_t sth = int64_t(split) * p.num_tokens * p.num_heads + th;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int dim = warp * kDimsPerWarp + j * 8 + c2;
        *reinterpret_cast<float2*>(p.partial_out + sth * kL + dim) =
            make_float2(o[j][2 * r] * inv[r], o[j][2 * r + 1] * inv[r]);
      }
      if (warp == 0 && lane % 4 == 0) p.partial_lse[sth] = m_run[r] + log2f(l_run[r]);
    }
  }
}

// Combines the splits of one (token, head): weights 2^(lse_s - max) / sum.
// NOTES: the split weights are formed once in shared memory and the partial
// rows are read with independent loads (unrolled); a loop that re-read each
// lse from global memory serialized ~2 x splits L2 round trips per thread,
// ~20 us at 56 splits.
__global__ void mla_merge_kernel(MlaAbsorbedParams p) {
  __shared__ float weight[kMaxSplits];
  const int64_t th = blockIdx.x;  // blockIdx.y picks a slice of the latent dims
  const int64_t stride = int64_t(p.num_tokens) * p.num_heads;
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x) weight[s] = p.partial_lse[s * stride + th];
  __syncthreads();
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int s = threadIdx.x; s < p.num_splits; s += 32) m = fmaxf(m, weight[s]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int s = threadIdx.x; s < p.num_splits; s += 32) {
      const float w = weight[s] == -INFINITY ? 0.0f : exp2f(weight[s] - m);
      weight[s] = w;
      sum += w;
    }
    sum = warp_sum(sum);
    __syncwarp();
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int s = threadIdx.x; s < p.num_splits; s += 32) weight[s] *= inv;
  }
  __syncthreads();
  for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < p.latent_dim; d += gridDim.y * blockDim.x) {
    const float* src = p.partial_out + th * p.latent_dim + d;
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < p.num_splits; ++s) acc += weight[s] * src[s * stride * p.latent_dim];
    p.out[th * p.latent_dim + d] = __float2bfloat16(acc);
  }
}

// Any latent/rope width: one block per (token, head), one latent row at a
// time. Slow; for tiny test models whose widths the fast kernel does not tile.
__global__ void mla_absorbed_reference_kernel(MlaAbsorbedParams p) {
  extern __shared__ float acc[];  // [L]
  const int t = blockIdx.x / p.num_heads, h = blockIdx.x % p.num_heads;
  const int D = p.latent_dim + p.rope_dim;
  const TokenRange range = token_range(p, t);
  const __nv_bfloat16* q = p.q + (int64_t(t) * p.num_heads + h) * D;
  for (int d = threadIdx.x; d < p.latent_dim; d += blockDim.x) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < range.attend; ++j) {
    const __nv_bfloat16* row = p.cache + int64_t(p.kv_slots[range.kv_begin + j]) * D;
    float dot = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) dot += __bfloat162float(q[d]) * __bfloat162float(row[d]);
    const float s = block_sum(dot) * p.scale;
    const float m_new = fmaxf(m, s), alpha = __expf(m - m_new), w = __expf(s - m_new);
    for (int d = threadIdx.x; d < p.latent_dim; d += blockDim.x)
      acc[d] = acc[d] * alpha + w * __bfloat162float(row[d]);
    l = l * alpha + w;
    m = m_new;
  }
  for (int d = threadIdx.x; d < p.latent_dim; d += blockDim.x)
    p.out[(int64_t(t) * p.num_heads + h) * p.latent_dim + d] = __float2bfloat16(l > 0.0f ? acc[d] / l : 0.0f);
}

template <int kL, int kR>
size_t mma_smem_bytes() {
  constexpr int kStride = kL + kR + 8;
  return sizeof(__nv_bfloat16) * ((kHeadsPerBlock + 2 * kBlockN) * kStride + kHeadsPerBlock * (kBlockN + 8)) +
         sizeof(float) * 2 * kWarps * kHeadsPerBlock;
}

}  // namespace

int mla_absorbed_num_splits(int num_tokens, int num_heads, int sm_count, int max_kv_len) {
  // Two blocks fit an SM. Pick the split count whose grid fills the last wave
  // best (a grid of 1.45 waves idles a quarter of the GPU in its tail),
  // preferring fewer splits unless more are 5% better (less merge traffic),
  // and never splits shorter than kMinRowsPerSplit rows. (The margin is
  // relative: an absolute one kept a one-token batch at one split below 13.)
  const int slots = 2 * sm_count;
  const int blocks = std::max(1, num_tokens * ((num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock));
  const int limit = std::clamp(max_kv_len / kMinRowsPerSplit, 1, kMaxSplits);
  int best = 1;
  double best_eff = 0;
  for (int s = 1; s <= limit; ++s) {
    const int total = blocks * s, waves = (total + slots - 1) / slots;
    // Efficiency of the waves, discounted for a grid under one wave.
    const double eff = double(total) / (double(waves) * slots);
    if (eff > best_eff * 1.05) {
      best_eff = eff;
      best = s;
    }
  }
  return best;
}

size_t mla_absorbed_workspace_bytes(int num_tokens, int num_heads, int latent_dim, int num_splits) {
  if (num_splits <= 1) return 0;
  return sizeof(float) * size_t(num_splits) * num_tokens * num_heads * (latent_dim + 1);
}

bool mla_absorbed_has_fast_path(int latent_dim, int rope_dim) { return latent_dim == 512 && rope_dim == 64; }

void mla_attention_absorbed(const MlaAbsorbedParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_heads == 0) return;
  MLA_CUDA_REQUIRE(p.num_seqs > 0 && p.latent_dim > 0 && p.rope_dim >= 0,
                   "mla_attention_absorbed: bad shape (seqs " + std::to_string(p.num_seqs) + ", latent " +
                       std::to_string(p.latent_dim) + ")");
  if (!mla_absorbed_has_fast_path(p.latent_dim, p.rope_dim)) {
    mla_absorbed_reference_kernel<<<p.num_tokens * p.num_heads, 128, p.latent_dim * sizeof(float), stream>>>(p);
    check_launch("mla_attention_absorbed (reference kernel)");
    return;
  }
  MLA_CUDA_REQUIRE(p.num_splits >= 1 && p.num_splits <= kMaxSplits,
                   "mla_attention_absorbed: num_splits " + std::to_string(p.num_splits) + " outside [1, " +
                       std::to_string(kMaxSplits) + "]");
  MLA_CUDA_REQUIRE(p.num_splits == 1 || (p.partial_out && p.partial_lse),
                   std::string("mla_attention_absorbed: split-KV needs workspace"));
  auto kernel = mla_absorbed_mma_kernel<512, 64>;
  const size_t smem = mma_smem_bytes<512, 64>();
  static bool attribute_set = false;  // once per process; the kernel is fixed
  if (!attribute_set) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                   "mla_attention_absorbed");
    attribute_set = true;
  }
  const dim3 grid(p.num_splits, (p.num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock, p.num_tokens);
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  check_launch("mla_attention_absorbed");
  if (p.num_splits > 1) {
    mla_merge_kernel<<<dim3(p.num_tokens * p.num_heads, (p.latent_dim + 127) / 128), 128, 0, stream>>>(p);
    check_launch("mla_attention_absorbed (merge)");
  }
}

}  // namespace mlaserve::cuda

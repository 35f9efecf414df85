#include "kernels/cuda/mla_expanded.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/grouped_gemm_sm90.cuh"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/mma_sm80.cuh"

namespace mlaserve::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBlockN = 64;  // kv rows per tile

// kWarps warps of 16 query rows each share every K/V tile a block loads.
// kSwizzled (q·k on wgmma): Q and K tiles in the 128-byte-swizzled K-major
// layout wgmma reads (64-dim column blocks of rows of 128 bytes, 1024-byte
// aligned); otherwise rows padded by 16 bytes (no ldmatrix bank conflicts).
template <int kDn, int kR, int kDv, int kWarps, bool kSwizzled = false>
struct ExpandedSmem {
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kDqk = kDn + kR;
  static constexpr int kPad = kSwizzled ? 0 : 8;
  static constexpr int kQStride = kDqk + kPad, kKStride = kDqk + kPad, kVStride = kDv + 8;
  static constexpr int kQ = kBlockM * kQStride, kK = kBlockN * kKStride, kV = kBlockN * kVStride;
  static constexpr size_t kBytes = sizeof(__nv_bfloat16) * (kQ + 2 * (kK + kV)) + (kSwizzled ? 1024 : 0);
};

// Byte offset of 16-byte chunk `chunk` (8 values) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t swizzled_offset(int rows, int r, int chunk) {
  return uint32_t((chunk / 8) * rows * 128 + r * 128 + (((chunk % 8) ^ (r % 8)) * 16));
}

// NOTES: query tiles are taken heaviest first (the causal tile at the end of
// a sequence attends to the most keys) across all heads, so the light ones
// fill the tail (heaviest first within each head only, the profiler still saw
// SMs idle 24% of the kernel at 1 x 4096, 16 heads); a
// warp whose 16 rows all precede a kv tile skips it, and only tiles that
// cross a row's diagonal are masked. q·k runs k-step outer, n-tile inner, so
// consecutive mma.sync are independent.
// kWgmma (Hopper): each warpgroup's 64 x 64 score tile is one chain of
// wgmma m64n64k16 from the swizzled Q and K tiles (no Q in registers); its
// accumulator layout is the mma.sync one, so the softmax and P·V (mma.sync,
// P from registers) are shared. Tiles are skipped per warpgroup.
// NOTES: the products still wait before the softmax and P·V; overlapping
// the next tile's q·k with them (a third K/V stage) and P·V on wgmma are
// what FlashAttention-3 adds.
template <int kDn, int kR, int kDv, int kWarps, int kMinBlocks, bool kWgmma>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) mla_expanded_mma_kernel(MlaExpandedParams p) {
  using Smem = ExpandedSmem<kDn, kR, kDv, kWarps, kWgmma>;
  constexpr int kBlockM = Smem::kBlockM;
  constexpr int kDqk = Smem::kDqk, kKSteps = kDqk / 16, kSTiles = kBlockN / 8, kOTiles = kDv / 8;
  static_assert(kDn % 8 == 0 && kR % 8 == 0 && kDqk % 32 == 0 && kDv % 16 == 0, "widths must tile");
  static_assert(!kWgmma || (kDqk % 64 == 0 && kWarps % 4 == 0), "wgmma: 64-dim column blocks, whole warpgroups");

  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem_base = smem_raw;
  if constexpr (kWgmma)
    smem_base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem_base);
  __nv_bfloat16* k_s = q_s + Smem::kQ;       // [2][kBlockN][kKStride]
  __nv_bfloat16* v_s = k_s + 2 * Smem::kK;   // [2][kBlockN][kVStride]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c2 = (lane % 4) * 2;
  // Blocks start in linear order, heads fastest: query tiles go heaviest
  // first across all heads and sequences (longest-first keeps the tail short).
  const int h = blockIdx.x, b = blockIdx.y, row0 = (gridDim.z - 1 - blockIdx.z) * kBlockM;
  const int q_begin = p.q_indptr[b], q_len = p.q_indptr[b + 1] - q_begin;
  const int kv_begin = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - kv_begin;
  if (row0 >= q_len) return;
  const int prefix = kv_len - q_len;  // query row i sits at kv position prefix + i
  const int rows = min(kBlockM, q_len - row0);
  const int kv_end = prefix + row0 + rows;  // exclusive bound over the block's rows
  const int H = p.num_heads;

  // Where chunk c (8 values) of Q / K tile row r goes.
  auto q_dst = [&](int r, int c) -> void* {
    if constexpr (kWgmma) return reinterpret_cast<uint8_t*>(q_s) + swizzled_offset(kBlockM, r, c);
    return q_s + r * Smem::kQStride + c * 8;
  };
  auto k_dst = [&](__nv_bfloat16* ks, int r, int c) -> void* {
    if constexpr (kWgmma) return reinterpret_cast<uint8_t*>(ks) + swizzled_offset(kBlockN, r, c);
    return ks + r * Smem::kKStride + c * 8;
  };
  // Q tile.
  for (int c = tid; c < kBlockM * (kDqk / 8); c += blockDim.x) {
    const int r = c / (kDqk / 8), col = (c % (kDqk / 8)) * 8;
    const bool valid = r < rows;
    cp_async_16(q_dst(r, col / 8), p.q + (int64_t(q_begin + row0 + (valid ? r : 0)) * H + h) * kDqk + col,
                valid ? 16 : 0);
  }
  auto load_tile = [&](int j0, int buf) {
    __nv_bfloat16* ks = k_s + buf * Smem::kK;
    __nv_bfloat16* vs = v_s + buf * Smem::kV;
    constexpr int kKChunks = kDqk / 8, kVChunks = kDv / 8;
    for (int c = tid; c < kBlockN * (kKChunks + kVChunks); c += blockDim.x) {
      const int r = c / (kKChunks + kVChunks), col = (c % (kKChunks + kVChunks)) * 8;
      const bool valid = j0 + r < kv_end;
      const int64_t kv_row = kv_begin + (valid ? j0 + r : 0);
      const __nv_bfloat16* head = p.kv + (kv_row * H + h) * (kDn + kDv);
      if (col < kDn) {
        cp_async_16(k_dst(ks, r, col / 8), head + col, valid ? 16 : 0);
      } else if (col < kDqk) {
        cp_async_16(k_dst(ks, r, col / 8), p.k_pe + kv_row * kR + (col - kDn), valid ? 16 : 0);
      } else {
        cp_async_16(vs + r * Smem::kVStride + (col - kDqk), head + kDn + (col - kDqk), valid ? 16 : 0);
      }
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  // Row positions of this thread's two rows (g and g + 8 of the warp's 16).
  int qpos[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + warp * 16 + g + 8 * r;
    qpos[r] = prefix + (i < q_len ? i : q_len - 1);  // padding rows mirror the last row: finite, unused
  }
  // This warp's first and last row positions (padding rows sit at the last);
  // with wgmma a tile is skipped only past its warpgroup's last row.
  const int warp_first = prefix + min(row0 + warp * 16, q_len - 1);
  const int warp_last = prefix + min(row0 + warp * 16 + 15, q_len - 1);
  const int skip_after = kWgmma ? prefix + min(row0 + (warp / 4) * 64 + 63, q_len - 1) : warp_last;
  uint32_t qa[kWgmma ? 1 : kKSteps][4];
  float o[kOTiles][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kLog2e;
  const int num_tiles = (kv_end + kBlockN - 1) / kBlockN;

  for (int it = 0; it < num_tiles; ++it) {
    const int j0 = it * kBlockN, buf = it & 1;
    if (it + 1 < num_tiles) load_tile(j0 + kBlockN, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    if constexpr (kWgmma) sm90::fence_proxy_async_smem();  // wgmma reads what cp.async wrote
    __syncthreads();
    if constexpr (!kWgmma) {
      if (it == 0) {
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks)
          ldmatrix_x4(qa[ks], q_s + (warp * 16 + lane % 16) * Smem::kQStride + ks * 16 + (lane / 16) * 8);
      }
    }
    const __nv_bfloat16* ks_tile = k_s + buf * Smem::kK;
    const __nv_bfloat16* vs_tile = v_s + buf * Smem::kV;
    if (j0 > skip_after) {  // every key of the tile is after every row of this warp (warpgroup)
      __syncthreads();
      continue;
    }

    float s[kSTiles][4] = {};
    if constexpr (kWgmma) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
      static_assert(kSTiles * 4 == 32, "one m64n64 accumulator");
      float(&acc)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
      const uint32_t qa_base = sm90::smem_u32(q_s) + (warp / 4) * 64 * 128;
      const uint32_t kb_base = sm90::smem_u32(ks_tile);
      sm90::fence_registers(acc);
      sm90::wgmma_fence();
#pragma unroll
      for (int blk = 0; blk < kDqk / 64; ++blk) {
        const uint64_t da = sm90::wgmma_desc(qa_base + blk * kBlockM * 128);
        const uint64_t db = sm90::wgmma_desc(kb_base + blk * kBlockN * 128);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) sm90::wgmma_m64n64k16_bf16(acc, da + 2 * kk, db + 2 * kk, blk + kk > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_registers(acc);
#else
      __trap();  // built for sm_90a only; the host never picks it elsewhere
#endif
    } else {
#pragma unroll
      for (int k = 0; k < kDqk; k += 32) {
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt) {
          uint32_t bk[4];
          ldmatrix_x4(bk, ks_tile + (nt * 8 + lane % 8) * Smem::kKStride + k + (lane / 8) * 8);
          mma_bf16_16816(s[nt], qa[k / 16], bk[0], bk[1]);
          mma_bf16_16816(s[nt], qa[k / 16 + 1], bk[2], bk[3]);
        }
      }
    }

    float mx[2] = {-INFINITY, -INFINITY};
    if (j0 + kBlockN - 1 <= warp_first) {  // below the diagonal of every row: nothing masked
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nt][e] *= scale_log2;
          mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, j = j0 + nt * 8 + c2 + (e % 2);
          s[nt][e] = j <= qpos[r] ? s[nt][e] * scale_log2 : -INFINITY;
          mx[r] = fmaxf(mx[r], s[nt][e]);
        }
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      // A row may see only masked keys in this tile but never before the first.
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = exp2f(m_run[r] - m_use[r]);
      m_run[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
    uint32_t pa[kBlockN / 16][4];
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
      const float p0 = exp2f(s[nt][0] - m_use[0]), p1 = exp2f(s[nt][1] - m_use[0]);
      const float p2 = exp2f(s[nt][2] - m_use[1]), p3 = exp2f(s[nt][3] - m_use[1]);
      sum[0] += p0 + p1;
      sum[1] += p2 + p3;
      // The S accumulator layout of n-tiles 2kk, 2kk+1 is the A layout of k-step kk.
      pa[nt / 2][(nt % 2) * 2 + 0] = pack_bf16x2(p0, p1);
      pa[nt / 2][(nt % 2) * 2 + 1] = pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l_run[r] = l_run[r] * alpha[r] + sum[r];
    }
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < kOTiles; j += 2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vs_tile + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * Smem::kVStride + j * 8 +
                                  (lane / 16) * 8);
        mma_bf16_16816(o[j], pa[kk], bv[0], bv[1]);
        mma_bf16_16816(o[j + 1], pa[kk], bv[2], bv[3]);
      }
    }
    __syncthreads();  // the next iteration refills the other buffer pair
  }

  // A row's Dv values lie with the 4 lanes of a quad (lanes 4g..4g+3).
  const unsigned quad_mask = 0xfu << (lane & ~3);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + warp * 16 + g + 8 * r;
    if (i >= q_len) continue;
    const float inv = 1.0f / l_run[r];
    const int64_t row = int64_t(q_begin + i) * H + h;
    if (p.out_q) {
      static_assert(kDv == kFp8Group, "a head's output is one quantization group");
      __nv_bfloat162 v[kOTiles];
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        v[j] = __floats2bfloat162_rn(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
        const float2 f = __bfloat1622float2(v[j]);
        amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
      amax = fmaxf(amax, __shfl_xor_sync(quad_mask, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(quad_mask, amax, 2));
      const float s = fp8_group_scale(amax), s_inv = 1.0f / s;
      uint8_t* dst = p.out_q + row * kDv;
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        const float2 f = __bfloat1622float2(v[j]);
        *reinterpret_cast<__nv_fp8x2_storage_t*>(dst + j * 8 + c2) = pack_e4m3x2(f.x * s_inv, f.y * s_inv);
      }
      if (c2 == 0) p.out_scale[h * p.out_scale_ld + q_begin + i] = s;
      continue;
    }
    __nv_bfloat16* dst = p.out + row * kDv;
#pragma unroll
    for (int j = 0; j < kOTiles; ++j)
      *reinterpret_cast<__nv_bfloat162*>(dst + j * 8 + c2) =
          __floats2bfloat162_rn(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
  }
}

// Any widths: one block per (token, head), one kv row at a time. For tiny
// test models only.
__global__ void mla_expanded_reference_kernel(MlaExpandedParams p) {
  extern __shared__ float acc[];  // [Dv]
  const int t = blockIdx.x / p.num_heads, h = blockIdx.x % p.num_heads, H = p.num_heads;
  int b = 0;
  while (p.q_indptr[b + 1] <= t) ++b;
  const int kv_begin = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - kv_begin;
  const int attend = kv_len - (p.q_indptr[b + 1] - p.q_indptr[b]) + (t - p.q_indptr[b]) + 1;
  const int dqk = p.nope_dim + p.rope_dim, dkv = p.nope_dim + p.v_dim;
  const __nv_bfloat16* q = p.q + (int64_t(t) * H + h) * dqk;
  for (int d = threadIdx.x; d < p.v_dim; d += blockDim.x) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < attend; ++j) {
    const __nv_bfloat16* kvh = p.kv + (int64_t(kv_begin + j) * H + h) * dkv;
    const __nv_bfloat16* kpe = p.k_pe + int64_t(kv_begin + j) * p.rope_dim;
    float dot = 0.0f;
    for (int d = threadIdx.x; d < dqk; d += blockDim.x)
      dot += __bfloat162float(q[d]) * __bfloat162float(d < p.nope_dim ? kvh[d] : kpe[d - p.nope_dim]);
    const float s = block_sum(dot) * p.scale;
    const float m_new = fmaxf(m, s), alpha = __expf(m - m_new), w = __expf(s - m_new);
    for (int d = threadIdx.x; d < p.v_dim; d += blockDim.x)
      acc[d] = acc[d] * alpha + w * __bfloat162float(kvh[p.nope_dim + d]);
    l = l * alpha + w;
    m = m_new;
  }
  for (int d = threadIdx.x; d < p.v_dim; d += blockDim.x)
    p.out[(int64_t(t) * H + h) * p.v_dim + d] = __float2bfloat16(l > 0.0f ? acc[d] / l : 0.0f);
}

template <int kWarps, int kMinBlocks, bool kWgmma>
void launch_mma(const MlaExpandedParams& p, cudaStream_t stream) {
  using Smem = ExpandedSmem<128, 64, 128, kWarps, kWgmma>;
  auto kernel = mla_expanded_mma_kernel<128, 64, 128, kWarps, kMinBlocks, kWgmma>;
  static bool attribute_set = false;  // once per process and variant
  if (!attribute_set) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Smem::kBytes)),
                   "mla_attention_expanded");
    attribute_set = true;
  }
  const dim3 grid(p.num_heads, p.num_seqs, (p.max_q_len + Smem::kBlockM - 1) / Smem::kBlockM);
  kernel<<<grid, kWarps * 32, Smem::kBytes, stream>>>(p);
  check_launch("mla_attention_expanded");
}

// mma.sync: 8 warps (128 query rows share each K/V tile), one block per SM
// (134 KB). Measured on the H200 (one run, 16 heads): 1 x 4096 in 581 us
// (148 TFLOP/s) against 712 us for 4 warps at two blocks per SM and 745 us
// for the previous kernel (64 rows, tiles in launch order); 8 x 512: 102 /
// 117 / 120 us; 128 heads, 1 x 4096: 3.63 / 4.62 / 4.74 ms.
// wgmma q·k: Q stays in shared memory, so the kernel needs 160 registers
// instead of 237 and 12 warps (192 query rows a K/V tile, 154 KB) fit one
// block per SM: H100 (perf.md session 8), 128 heads x 4096 2.65 ms against
// 3.21 with 8 warps and 3.40 on mma.sync.
constexpr int kMmaSyncWarps = 8, kWgmmaWarps = 12;

}  // namespace

bool mla_expanded_has_fast_path(int nope_dim, int rope_dim, int v_dim) {
  return nope_dim == 128 && rope_dim == 64 && v_dim == 128;
}

void mla_attention_expanded(const MlaExpandedParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_heads == 0) return;
  MLA_CUDA_REQUIRE(p.num_seqs > 0 && p.max_q_len > 0,
                   "mla_attention_expanded: bad batch (seqs " + std::to_string(p.num_seqs) + ", max_q_len " +
                       std::to_string(p.max_q_len) + ")");
  MLA_CUDA_REQUIRE(!p.out_q || (p.out_scale && p.out_scale_ld >= p.num_tokens &&
                                 mla_expanded_has_fast_path(p.nope_dim, p.rope_dim, p.v_dim)),
                   "mla_attention_expanded: FP8 rows need their scales and the Dv = 128 kernel");
  if (!mla_expanded_has_fast_path(p.nope_dim, p.rope_dim, p.v_dim)) {
    mla_expanded_reference_kernel<<<p.num_tokens * p.num_heads, 128, p.v_dim * sizeof(float), stream>>>(p);
    check_launch("mla_attention_expanded (reference kernel)");
    return;
  }
  const bool wgmma = p.qk_wgmma < 0 ? sm90_gemm_supported() : p.qk_wgmma != 0;
  MLA_CUDA_REQUIRE(!wgmma || sm90_gemm_supported(), "mla_attention_expanded: q·k on wgmma needs a Hopper GPU");
  if (wgmma)
    launch_mma<kWgmmaWarps, 1, true>(p, stream);
  else
    launch_mma<kMmaSyncWarps, 1, false>(p, stream);
}

}  // namespace mlaserve::cuda

#include "kernels/cuda/mla_expanded.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/grouped_gemm_sm90.cuh"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/tma_map.h"

namespace mlaserve::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

constexpr int kBlockN = 64;  // kv rows per tile

// The online softmax of one 64-row kv tile for a warp's 16 query rows (two a
// thread: g and g + 8 of the quad layout): s holds the raw (unscaled) scores
// (mma.sync / wgmma accumulator layout); keys past a row's position are masked (only on
// tiles that cross the warp's diagonal); m_run / l_run / o are rescaled and
// P comes out as bf16 pairs in the A-fragment layout of the P·V product
// (the score layout of n-tiles 2kk, 2kk + 1 is the A layout of k-step kk).
template <int kOTiles, bool kSkipSettled>
__device__ __forceinline__ void online_softmax(float (&s)[kBlockN / 8][4], float (&o)[kOTiles][4], float (&m_run)[2],
                                               float (&l_run)[2], uint32_t (&pa)[kBlockN / 16][4], int j0,
                                               int warp_first, const int (&qpos)[2], float scale_log2, int c2) {
  constexpr int kSTiles = kBlockN / 8;
  // The max over raw scores (scale_log2 > 0), the scale folded into each exponent's FMA.
  float mx[2] = {-INFINITY, -INFINITY};
  if (j0 + kBlockN - 1 <= warp_first) {  // below the diagonal of every row: nothing masked
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
  } else {
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, j = j0 + nt * 8 + c2 + (e % 2);
        if (j > qpos[r]) s[nt][e] = -INFINITY;
        mx[r] = fmaxf(mx[r], s[nt][e]);
      }
  }
  float alpha[2], m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r] * scale_log2);
    // A row may see only masked keys in this tile but never before the first.
    m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[r] = exp2f(m_run[r] - m_use[r]);
    m_run[r] = m_new;
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < kSTiles; ++nt) {
    auto p = [&](float x, int r) { return exp2f(fmaf(x, scale_log2, -m_use[r])); };
    const float p0 = p(s[nt][0], 0), p1 = p(s[nt][1], 0), p2 = p(s[nt][2], 1), p3 = p(s[nt][3], 1);
    sum[0] += p0 + p1;
    sum[1] += p2 + p3;
    pa[nt / 2][(nt % 2) * 2 + 0] = pack_bf16x2(p0, p1);
    pa[nt / 2][(nt % 2) * 2 + 1] = pack_bf16x2(p2, p3);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    l_run[r] = l_run[r] * alpha[r] + sum[r];
  }
  // kSkipSettled: once the rows' maxima settle (most tiles of a long causal
  // row) alpha is exactly 1 for the whole warp and the output keeps its
  // scale. (The vote and branch slowed the mma.sync kernel 5-7% on an H100;
  // the wgmma kernel gained 3-7%.)
  if (!kSkipSettled || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
  }
}

// The block's output rows from the running softmax: rows first_row + g and
// + 8 of a warp's 16 (lane's quad g), bf16 or (out_q) e4m3 with the row's scale.
template <int kDv>
__device__ __forceinline__ void store_rows(const MlaExpandedParams& p, const float (&o)[kDv / 8][4],
                                           const float (&l_run)[2], int first_row, int q_len, int q_begin, int h,
                                           int lane) {
  constexpr int kOTiles = kDv / 8;
  const int g = lane / 4, c2 = (lane % 4) * 2, H = p.num_heads;
  // A row's Dv values lie with the 4 lanes of a quad (lanes 4g..4g+3).
  const unsigned quad_mask = 0xfu << (lane & ~3);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = first_row + g + 8 * r;
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

// The block of query rows [row0, row0 + block_m) of one head and sequence.
// Blocks run heaviest first (see the kernels' notes) in chunks of
// kChunkBlocks query blocks a head; inside a chunk, in groups of kGroupHeads
// heads, so the blocks running at once share a few heads' K/V in L2. With
// every head at once, the 128 heads of a V3 prefill of 4096 tokens (268 MB
// of K/V) left L2 before the next wave of query blocks read them again:
// 3.5 GB from DRAM, 76% of its throughput. The heaviest chunk comes first,
// so the last blocks to start are light ones. H100, same call, 128 / 16
// heads x 4096 tokens, us: every head at once 1,605 / 189; chunks of 8 x 16
// heads 1,467 / 193; 16 x 8 (these) 1,436 / 196; 32 x 4 1,419 / 210.
constexpr int kChunkBlocks = 16, kGroupHeads = 8;
struct QueryBlock {
  int h, q_begin, q_len, kv_begin, prefix, row0, kv_end;
};
// A one-dimensional grid over heads x sequences x query blocks.
inline dim3 query_grid(const MlaExpandedParams& p, int block_m) {
  return dim3(p.num_heads * p.num_seqs * ((p.max_q_len + block_m - 1) / block_m));
}
__device__ __forceinline__ bool query_block(const MlaExpandedParams& p, int block_m, QueryBlock& qb) {
  const int blocks = (p.max_q_len + block_m - 1) / block_m, H = p.num_heads, S = p.num_seqs;
  int i = blockIdx.x;
  // Chunk c: query-block ranks [c * kChunkBlocks, + ranks) of every head and sequence.
  const int c = i / (kChunkBlocks * H * S), ranks = min(kChunkBlocks, blocks - c * kChunkBlocks);
  i -= c * kChunkBlocks * H * S;
  // Head group: heads [first_head, + heads) of the chunk.
  const int first_head = i / (ranks * kGroupHeads * S) * kGroupHeads, heads = min(kGroupHeads, H - first_head);
  i -= first_head * ranks * S;
  const int rank = c * kChunkBlocks + i / (heads * S), b = i % (heads * S) / heads;
  qb.h = first_head + i % heads;
  qb.row0 = (blocks - 1 - rank) * block_m;
  qb.q_begin = p.q_indptr[b];
  qb.q_len = p.q_indptr[b + 1] - qb.q_begin;
  qb.kv_begin = p.kv_indptr[b];
  qb.prefix = (p.kv_indptr[b + 1] - qb.kv_begin) - qb.q_len;  // query row i sits at kv position prefix + i
  qb.kv_end = qb.prefix + qb.row0 + min(block_m, qb.q_len - qb.row0);  // exclusive bound over the block's rows
  return qb.row0 < qb.q_len;
}

// Positions of a thread's two rows (g and g + 8 of its warp's 16 from
// first_row); padding rows mirror the last row: finite, unused.
__device__ __forceinline__ void row_positions(const QueryBlock& qb, int first_row, int g, int (&qpos)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = first_row + g + 8 * r;
    qpos[r] = qb.prefix + (i < qb.q_len ? i : qb.q_len - 1);
  }
}

// Portable kernel (mma.sync): kWarps warps of 16 query rows each share every
// K/V tile a block loads (double-buffered cp.async, rows padded by 16 bytes:
// no ldmatrix bank conflicts).
// NOTES: query tiles are taken heaviest first (the causal tile at the end of
// a sequence attends to the most keys) in chunks over groups of heads
// (query_block), so the light ones fill the tail (heaviest first within each
// head only, the profiler still saw SMs idle 24% of the kernel at 1 x 4096,
// 16 heads); a
// warp whose 16 rows all precede a kv tile skips it, and only tiles that
// cross a row's diagonal are masked. q·k runs k-step outer, n-tile inner, so
// consecutive mma.sync are independent.
template <int kDn, int kR, int kDv, int kWarps>
struct ExpandedSmem {
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kDqk = kDn + kR;
  static constexpr int kQStride = kDqk + 8, kKStride = kDqk + 8, kVStride = kDv + 8;
  static constexpr int kQ = kBlockM * kQStride, kK = kBlockN * kKStride, kV = kBlockN * kVStride;
  static constexpr size_t kBytes = sizeof(__nv_bfloat16) * (kQ + 2 * (kK + kV));
};

template <int kDn, int kR, int kDv, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 1) mla_expanded_mma_kernel(MlaExpandedParams p) {
  using Smem = ExpandedSmem<kDn, kR, kDv, kWarps>;
  constexpr int kBlockM = Smem::kBlockM;
  constexpr int kDqk = Smem::kDqk, kKSteps = kDqk / 16, kSTiles = kBlockN / 8, kOTiles = kDv / 8;
  static_assert(kDn % 8 == 0 && kR % 8 == 0 && kDqk % 32 == 0 && kDv % 16 == 0, "widths must tile");

  extern __shared__ __align__(16) uint8_t smem_raw[];
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* k_s = q_s + Smem::kQ;       // [2][kBlockN][kKStride]
  __nv_bfloat16* v_s = k_s + 2 * Smem::kK;   // [2][kBlockN][kVStride]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c2 = (lane % 4) * 2;
  QueryBlock qb;
  if (!query_block(p, kBlockM, qb)) return;
  const int H = p.num_heads, h = qb.h;

  // Q tile.
  for (int c = tid; c < kBlockM * (kDqk / 8); c += blockDim.x) {
    const int r = c / (kDqk / 8), col = (c % (kDqk / 8)) * 8;
    const bool valid = qb.row0 + r < qb.q_len;
    cp_async_16(q_s + r * Smem::kQStride + col,
                p.q + (int64_t(qb.q_begin + qb.row0 + (valid ? r : 0)) * H + h) * kDqk + col, valid ? 16 : 0);
  }
  auto load_tile = [&](int j0, int buf) {
    __nv_bfloat16* ks = k_s + buf * Smem::kK;
    __nv_bfloat16* vs = v_s + buf * Smem::kV;
    constexpr int kKChunks = kDqk / 8, kVChunks = kDv / 8;
    for (int c = tid; c < kBlockN * (kKChunks + kVChunks); c += blockDim.x) {
      const int r = c / (kKChunks + kVChunks), col = (c % (kKChunks + kVChunks)) * 8;
      const bool valid = j0 + r < qb.kv_end;
      const int64_t kv_row = qb.kv_begin + (valid ? j0 + r : 0);
      const __nv_bfloat16* head = p.kv + (kv_row * H + h) * (kDn + kDv);
      if (col < kDn)
        cp_async_16(ks + r * Smem::kKStride + col, head + col, valid ? 16 : 0);
      else if (col < kDqk)
        cp_async_16(ks + r * Smem::kKStride + col, p.k_pe + kv_row * kR + (col - kDn), valid ? 16 : 0);
      else
        cp_async_16(vs + r * Smem::kVStride + (col - kDqk), head + kDn + (col - kDqk), valid ? 16 : 0);
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  int qpos[2];
  row_positions(qb, qb.row0 + warp * 16, g, qpos);
  // This warp's first and last row positions (padding rows sit at the last).
  const int warp_first = qb.prefix + min(qb.row0 + warp * 16, qb.q_len - 1);
  const int warp_last = qb.prefix + min(qb.row0 + warp * 16 + 15, qb.q_len - 1);
  uint32_t qa[kKSteps][4];
  float o[kOTiles][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kLog2e;
  const int num_tiles = (qb.kv_end + kBlockN - 1) / kBlockN;

  for (int it = 0; it < num_tiles; ++it) {
    const int j0 = it * kBlockN, buf = it & 1;
    if (it + 1 < num_tiles) load_tile(j0 + kBlockN, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ldmatrix_x4(qa[ks], q_s + (warp * 16 + lane % 16) * Smem::kQStride + ks * 16 + (lane / 16) * 8);
    }
    const __nv_bfloat16* ks_tile = k_s + buf * Smem::kK;
    const __nv_bfloat16* vs_tile = v_s + buf * Smem::kV;
    // Every key of the tile is after every row of this warp, or the warp's rows are all past the sequence's.
    if (j0 > warp_last || qb.row0 + warp * 16 >= qb.q_len) {
      __syncthreads();
      continue;
    }

    float s[kSTiles][4] = {};
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
    uint32_t pa[kBlockN / 16][4];
    online_softmax<kOTiles, false>(s, o, m_run, l_run, pa, j0, warp_first, qpos, scale_log2, c2);
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
  store_rows<kDv>(p, o, l_run, qb.row0 + warp * 16, qb.q_len, qb.q_begin, h, lane);
}

// Hopper kernel (Dn 128, R 64, Dv 128): three consumer warpgroups of 64 query
// rows and a producer warpgroup (setmaxnreg: 24 registers, the consumers
// 160). The producer's first thread loads the Q tile once and each 64-row
// K/V tile by bulk tensor copies (k_nope and v: boxes of 64 dims x 1 head x
// 64 rows of kv; k_pe: 64 x 64) into a ring of kTmaStages stages with full /
// empty mbarriers, in the 128-byte-swizzled layout wgmma reads. Each
// warpgroup runs its tiles on its own schedule (no block barrier per tile),
// so one's softmax overlaps another's products: q·k on wgmma (Q, K from
// shared memory), P·V on wgmma (P from registers, V as the MN-major B
// operand). Rows of a tile past a sequence's keys (the next sequence's, or
// zeros past kv_rows) are masked like future keys. H100, 128 heads x 4096:
// 1.56 ms against 2.77 for the previous Hopper kernel (cp.async by all 12
// warps, two block barriers a tile; perf.md session 17).
// NOTES: measured and dropped (same card and shape, one call): two consumer
// warpgroups on 128-row K/V tiles (240 registers) 1.70 ms; FlashAttention-3's
// intra-warpgroup overlap (the next tile's q·k issued before this tile's
// softmax, a second score set) 1.70 ms, and 2.16 on 128-row tiles; this
// layout 1.56-1.61. Not tried: separate K and V barriers.
constexpr int kTmaConsumers = 3, kTmaStages = 3, kTmaThreads = 128 * (kTmaConsumers + 1);
constexpr int kTmaBlockM = 64 * kTmaConsumers;
constexpr int kTmaQBytes = kTmaBlockM * 192 * 2, kTmaKBytes = kBlockN * 192 * 2, kTmaVBytes = kBlockN * 128 * 2;
constexpr int kTmaStageBytes = kTmaKBytes + kTmaVBytes;
constexpr size_t kTmaSmemBytes = 1024 + kTmaQBytes + size_t(kTmaStages) * kTmaStageBytes;

__global__ void __launch_bounds__(kTmaThreads, 1)
    mla_expanded_tma_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_kv,
                            const __grid_constant__ CUtensorMap map_pe, MlaExpandedParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kDn = 128, kDv = 128, kDqk = 192, kSTiles = kBlockN / 8, kOTiles = kDv / 8;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* q_s = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* stages = q_s + kTmaQBytes;
  __shared__ __align__(8) uint64_t q_full, full[kTmaStages], empty[kTmaStages];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c2 = (lane % 4) * 2;
  QueryBlock qb;
  if (!query_block(p, kTmaBlockM, qb)) return;
  const int num_tiles = (qb.kv_end + kBlockN - 1) / kBlockN;

  if (tid == 0) {
    sm90::mbar_init(&q_full, 1);
    for (int st = 0; st < kTmaStages; ++st) {
      sm90::mbar_init(&full[st], 1);
      sm90::mbar_init(&empty[st], 4 * kTmaConsumers);  // lane 0 of every consumer warp
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if (warp >= 4 * kTmaConsumers) {  // the producer warpgroup
    sm90::setmaxnreg_dec<24>();
    if (tid == 128 * kTmaConsumers) {
      sm90::mbar_arrive_expect_tx(&q_full, kTmaQBytes);
      for (int cb = 0; cb < kDqk / 64; ++cb)
        sm90::tma_load_3d(q_s + cb * kTmaBlockM * 128, &map_q, &q_full, cb * 64, qb.h, qb.q_begin + qb.row0);
      for (int t = 0; t < num_tiles; ++t) {
        const int st = t % kTmaStages;
        if (t >= kTmaStages) sm90::mbar_wait(&empty[st], (t / kTmaStages - 1) & 1);
        uint8_t* k = stages + st * kTmaStageBytes;
        uint8_t* v = k + kTmaKBytes;
        const int row = qb.kv_begin + t * kBlockN;
        sm90::mbar_arrive_expect_tx(&full[st], kTmaStageBytes);
        sm90::tma_load_3d(k, &map_kv, &full[st], 0, qb.h, row);
        sm90::tma_load_3d(k + kBlockN * 128, &map_kv, &full[st], 64, qb.h, row);
        sm90::tma_load_2d(k + 2 * kBlockN * 128, &map_pe, &full[st], 0, row);
        sm90::tma_load_3d(v, &map_kv, &full[st], kDn, qb.h, row);
        sm90::tma_load_3d(v + kBlockN * 128, &map_kv, &full[st], kDn + 64, qb.h, row);
      }
    }
    return;
  }

  sm90::setmaxnreg_inc<160>();
  const int wg = warp / 4;
  int qpos[2];
  row_positions(qb, qb.row0 + warp * 16, g, qpos);
  const int warp_first = qb.prefix + min(qb.row0 + warp * 16, qb.q_len - 1);
  // A warpgroup's products are one instruction: a tile is skipped only past
  // its last row, and every tile when all its rows are past the sequence's.
  const bool has_rows = qb.row0 + wg * 64 < qb.q_len;
  const int skip_after = qb.prefix + min(qb.row0 + wg * 64 + 63, qb.q_len - 1);
  float o[kOTiles][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kLog2e;
  const uint32_t qa_base = sm90::smem_u32(q_s) + wg * 64 * 128;
  sm90::mbar_wait(&q_full, 0);

  for (int t = 0; t < num_tiles; ++t) {
    const int st = t % kTmaStages, j0 = t * kBlockN;
    // Skipped tiles are waited for too: a release must not run ahead of the stage's fill.
    sm90::mbar_wait(&full[st], (t / kTmaStages) & 1);
    if (has_rows && j0 <= skip_after) {
      const uint32_t kb_base = sm90::smem_u32(stages + st * kTmaStageBytes);
      const uint32_t vb_base = kb_base + kTmaKBytes;
      float s[kSTiles][4] = {};
      float(&sacc)[kSTiles * 4] = *reinterpret_cast<float(*)[kSTiles * 4]>(&s[0][0]);
      sm90::fence_registers(sacc);
      sm90::wgmma_fence();
#pragma unroll
      for (int blk = 0; blk < kDqk / 64; ++blk) {
        const uint64_t da = sm90::wgmma_desc(qa_base + blk * kTmaBlockM * 128);
        const uint64_t db = sm90::wgmma_desc(kb_base + blk * kBlockN * 128);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) sm90::wgmma_m64n64k16_bf16(sacc, da + 2 * kk, db + 2 * kk, blk + kk > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_registers(sacc);

      uint32_t pa[kBlockN / 16][4];
      online_softmax<kOTiles, true>(s, o, m_run, l_run, pa, j0, warp_first, qpos, scale_log2, c2);
      float(&oacc)[kOTiles * 4] = *reinterpret_cast<float(*)[kOTiles * 4]>(&o[0][0]);
      sm90::fence_registers(oacc);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        sm90::wgmma_m64n128k16_bf16_rs_mn(oacc, pa[kk], sm90::wgmma_desc_mn(vb_base + kk * 16 * 128, kBlockN * 128));
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_registers(oacc);
    }
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(&empty[st]);
  }
  store_rows<kDv>(p, o, l_run, qb.row0 + warp * 16, qb.q_len, qb.q_begin, qb.h, lane);
#else
  __trap();  // built for sm_90a only; the host never picks it elsewhere
#endif
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

// The portable kernel: 8 warps (128 query rows share each K/V tile), one
// block per SM (134 KB). Measured on the H200 (one run, 16 heads): 1 x 4096
// in 581 us (148 TFLOP/s) against 712 us for 4 warps at two blocks per SM
// and 745 us for the previous kernel (64 rows, tiles in launch order); 8 x
// 512: 102 / 117 / 120 us; 128 heads, 1 x 4096: 3.63 / 4.62 / 4.74 ms.
void launch_mma(const MlaExpandedParams& p, cudaStream_t stream) {
  constexpr int kWarps = 8;
  using Smem = ExpandedSmem<128, 64, 128, kWarps>;
  auto kernel = mla_expanded_mma_kernel<128, 64, 128, kWarps>;
  static const bool attribute_set = [&] {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Smem::kBytes)),
                   "mla_attention_expanded");
    return true;
  }();
  (void)attribute_set;
  kernel<<<query_grid(p, Smem::kBlockM), kWarps * 32, Smem::kBytes, stream>>>(p);
  check_launch("mla_attention_expanded");
}

// The Hopper kernel's tensor maps: q {T, H, 192} and kv {Lk, H, 256} in
// boxes of 64 dims x 1 head x rows, k_pe {Lk, 64} in 64 x 64 boxes.
void launch_tma(const MlaExpandedParams& p, cudaStream_t stream) {
  const uint64_t H = uint64_t(p.num_heads), T = uint64_t(p.num_tokens), Lk = uint64_t(p.kv_rows);
  const uint64_t q_dims[3] = {192, H, T}, q_strides[2] = {192 * 2, H * 192 * 2};
  const uint32_t q_box[3] = {64, 1, kTmaBlockM};
  const uint64_t kv_dims[3] = {256, H, Lk}, kv_strides[2] = {256 * 2, H * 256 * 2};
  const uint32_t kv_box[3] = {64, 1, kBlockN};
  const uint64_t pe_dims[2] = {64, Lk}, pe_strides[1] = {64 * 2};
  const uint32_t pe_box[2] = {64, kBlockN};
  const CUtensorMap map_q = bf16_swizzled_tensor_map(p.q, 3, q_dims, q_strides, q_box, "mla_attention_expanded q");
  const CUtensorMap map_kv =
      bf16_swizzled_tensor_map(p.kv, 3, kv_dims, kv_strides, kv_box, "mla_attention_expanded kv");
  const CUtensorMap map_pe =
      bf16_swizzled_tensor_map(p.k_pe, 2, pe_dims, pe_strides, pe_box, "mla_attention_expanded k_pe");
  static const bool attribute_set = [] {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(mla_expanded_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kTmaSmemBytes)),
                   "mla_attention_expanded");
    return true;
  }();
  (void)attribute_set;
  mla_expanded_tma_kernel<<<query_grid(p, kTmaBlockM), kTmaThreads, kTmaSmemBytes, stream>>>(map_q, map_kv, map_pe,
                                                                                            p);
  check_launch("mla_attention_expanded");
}

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
  const bool sm90 = p.sm90 < 0 ? sm90_gemm_supported() : p.sm90 != 0;
  MLA_CUDA_REQUIRE(!sm90 || (sm90_gemm_supported() && p.kv_rows > 0),
                   "mla_attention_expanded: the Hopper kernel needs a Hopper GPU and kv_rows");
  if (sm90)
    launch_tma(p, stream);
  else
    launch_mma(p, stream);
}

}  // namespace mlaserve::cuda

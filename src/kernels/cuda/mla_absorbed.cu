#include "kernels/cuda/mla_absorbed.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_kv_cache.cuh"
#include "kernels/cuda/mla_absorbed_rows.cuh"
#include "kernels/cuda/mla_absorbed_sm90.h"
#include "kernels/cuda/mma_sm80.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kHeadsPerBlock = 16;  // one m16 tile of query heads
constexpr int kBlockN = kMlaSplitRows;  // latent rows per pipeline stage
constexpr int kWarps = 4;
constexpr int kLoadersPerRow = 4;  // threads copying one latent row
constexpr int kMaxSplits = 64;
// Splits are combined by a separate merge kernel. Merging them on chip
// instead (thread-block clusters over distributed shared memory, removed in
// session 3) was slower at every shape timed on the H200 (075cfab, eager):
// 1 x 512 16.5 us (cluster 8) vs 14.4, 1 x 4096 18.3 vs 17.9, 4 x 4096 34.8
// vs 22.3, 64 x 8192 251 (cluster 4) vs 165: a cluster waits for its slowest
// split and its blocks must share a GPC.
// Below two tiles a split is mostly latency, except for the smallest batches.
// (One tile: a 1 x 640 call in a graph took 8.2 us at 20 splits vs 8.4 at 10,
// but 8 x 640 took 11.5 us at 20 splits, more merge, where the previous kernel
// took 9.7 at 10. Eager on the H200, 075cfab: 1 x 512 12.9 us at 16 splits vs
// 14.4 at 8; 4 x 512 13.7 vs 14.9.) Hence split_min_rows and
// kMlaSmallBatchTokens (mla_absorbed_rows.cuh).

// c += a · b for one m16n8k16 tile of fp16 operands (the FP8 cache's latent
// tile and the query / P fragments that meet it).
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t bits) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
  return pack_f16x2(f.x, f.y);
}

// Two e4m3 bytes (bits 0-7 and 16-23 of t, the rest zero) as fp16x2 of
// exactly their values times 2^-8: the 7 magnitude bits shifted into fp16's
// exponent / mantissa line up (both formats' subnormals included) and the
// sign moves from bit 14 to 15 by adding bit 14 to itself. Integer ops only;
// the 2^8 and the per-group scale are applied to the f32 scores and to P.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_scaled(uint32_t t) {
  const uint32_t s = t << 7;
  return s + (s & 0x40004000u);
}

// Tile rows are kD wide with no padding; the 16-byte chunk c of row r is
// stored at chunk c ^ (r % 8) (kD / 8 is a multiple of 8, so this never leaves
// the row): the eight rows an ldmatrix phase reads at one logical chunk land
// in eight distinct bank groups. Callers precompute the XOR of their lane's
// row with the few chunk residues they use, so addresses stay immediates.
__device__ __forceinline__ int swizzle_chunk(int chunk, int row) { return chunk ^ (row & 7); }

// One block: 16 heads of one token over one split of its context, in tiles of
// kBlockN latent rows streamed through a kStages-deep cp.async ring.
//
// Warps form a 2 x 2 grid for q·k: warp (k_half, row_half) scores 16 rows of
// the tile over half of the 576 dims, with its half of the query tile held in
// registers (72 registers, loaded once), so no warp re-reads q from shared
// memory per tile. The partial scores meet in a 4 KB exchange buffer; every
// warp then sums the full 16 x 32 score tile and runs the same online softmax
// (redundant but cheap: 16 exp2 per thread), which leaves P in registers in
// exactly the A-fragment layout of the P·V product, so P never goes through
// shared memory. Each warp then owns 128 of the 512 output dims.
//
// NOTES: two barriers per tile (after the tile lands, after the score
// exchange). The previous version kept q in shared memory (re-read by every
// warp for every tile: 72 KB of ~145 KB shared-memory reads a tile), padded
// rows, P through shared memory and three barriers: 208 us at 128 x 4096
// (70% of copy bandwidth) on the H200. This one: 169 us (85%). Measured in
// one run: 2 stages and 3 stages at two blocks per SM within 1% of each
// other (the gain is the cheaper tile, not more bytes in flight); 4-6 stages
// at one block per SM 25% slower.
//
// kFp8: the cache holds FP8 slots (fp8_kv_cache.h). cp.async brings the raw
// slots (656 bytes at V3 widths) through the ring instead; after a tile lands
// the block widens it into one 16-bit tile of the layout above (a third
// barrier per tile): latent values as fp16 (e4m3 x 2^-8, integer ops only),
// k_pe copied as bf16. The latent MMAs run in fp16 (q converted once), the
// per-row scales of a warp's two 128-dim groups multiply its f32 partial
// scores, and the scale of the group a warp outputs multiplies P.
// NOTES: on the H200 (075cfab) this ran 128 x 4096 in 212 us, the same as the
// float dequantization into a bf16 tile it replaced (212): the conversion was
// not what bounds the FP8 kernel (bf16: 165 us).
template <int kL, int kR, int kStages, int kBlocksPerSm, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm) mla_absorbed_mma_kernel(MlaAbsorbedParams p) {
  constexpr int kD = kL + kR, kLatentSteps = kL / 32, kQkSteps = kLatentSteps + kR / 32;
  constexpr int kDimsPerWarp = kL / kWarps, kNTiles = kDimsPerWarp / 8;
  constexpr int kChunksPerRow = kD / 8;
  static_assert(kWarps == 4 && kBlockN == 32, "2 x 2 warp grid over (dims half, rows half) of a 32-row tile");
  static_assert(kL % 128 == 0 && kR % 64 == 0 && kDimsPerWarp % 16 == 0,
                "each warp's latent and rope halves start on 8-chunk swizzle boundaries");
  static_assert(kStages >= 2, "a ring needs two stages");

  constexpr Fp8KvLayout kFp8Layout{kL, kR};
  constexpr int kFp8SlotChunks = int(kFp8Layout.slot_bytes() / 16);
  static_assert(!kFp8 || fp8_kv_is_vectorizable(kFp8Layout), "16-byte copies of whole FP8 slots");
  // bf16: kStages tiles; FP8: one bf16 tile, then kStages raw slot tiles.
  constexpr int kBf16Tiles = kFp8 ? 1 : kStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  auto* kv_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);                      // [kBf16Tiles][kBlockN][kD]
  auto* score_x = reinterpret_cast<float4*>(kv_s + kBf16Tiles * kBlockN * kD);  // [kWarps][2 n-tiles][32 lanes]
  auto* raw_s = reinterpret_cast<uint8_t*>(score_x + kWarps * 2 * 32);         // FP8: [kStages][kBlockN][slot]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c2 = (lane % 4) * 2;
  const int k_half = warp % 2, row_half = warp / 2;
  const int split = blockIdx.x, h0 = blockIdx.y * kHeadsPerBlock, t = blockIdx.z;
  const int heads = min(kHeadsPerBlock, p.num_heads - h0);
  const TokenRange range = token_range(p, t);
  const int chunk = split_chunk(range.attend, p.num_splits, split_min_rows(p.num_tokens, kBlockN));
  const int begin = split * chunk, end = min(begin + chunk, range.attend);

  if (begin >= end) {  // this split got no rows: an empty partial result
    if (p.num_splits > 1) {
      // Weight 0: the merge skips this split's (unwritten) partial rows.
      const int64_t sth0 = (int64_t(split) * p.num_tokens + t) * p.num_heads + h0;
      if (tid < heads) p.partial_lse[sth0 + tid] = -INFINITY;
    } else {
      for (int i = tid; i < heads * kL; i += blockDim.x)
        p.out[(int64_t(t) * p.num_heads + h0) * kL + i] = __float2bfloat16(0.0f);
    }
    return;
  }

  // NOTES: each thread copies 18 chunks of one latent row, so it reads one
  // slot index per tile, and reads it a tile ahead: a dependent global load
  // per chunk (the naive mapping) serialized ~18 L2 round trips per tile.
  static_assert(kBlockN * kLoadersPerRow == kWarps * 32 && kChunksPerRow % kLoadersPerRow == 0, "row mapping");
  const int32_t* slots = p.kv_slots + range.kv_begin;
  const int load_row = tid / kLoadersPerRow, load_chunk0 = tid % kLoadersPerRow;
  const int num_tiles = (end - begin + kBlockN - 1) / kBlockN;
  auto slot_of = [&](int tile) -> int64_t {
    const int j = begin + tile * kBlockN + load_row;
    return j < end ? int64_t(slots[j]) : int64_t(-1);
  };
  // Chunk load_chunk0 + 4 i: its residue mod 8 alternates between two values.
  static_assert(kLoadersPerRow == 4, "two chunk residues per loader");
  const int load_x[2] = {swizzle_chunk(load_chunk0, load_row), swizzle_chunk(load_chunk0 + 4, load_row)};
  auto load_tile = [&](int64_t slot, int buf) {
    if constexpr (kFp8) {
      uint8_t* dst = raw_s + (buf * kBlockN + load_row) * kFp8Layout.slot_bytes();
      const uint8_t* src = p.fp8_cache + (slot >= 0 ? slot : 0) * kFp8Layout.slot_bytes();
#pragma unroll
      for (int i = 0; i < (kFp8SlotChunks + kLoadersPerRow - 1) / kLoadersPerRow; ++i) {
        const int chunk = load_chunk0 + kLoadersPerRow * i;
        // Zero-filled rows past the split dequantize to 0 (0 bytes times scale 0).
        if (chunk < kFp8SlotChunks) cp_async_16(dst + chunk * 16, src + chunk * 16, slot >= 0 ? 16 : 0);
      }
      return;
    }
    __nv_bfloat16* dst = kv_s + (buf * kBlockN + load_row) * kD;
    const __nv_bfloat16* src = p.cache + (slot >= 0 ? slot : 0) * kD;
#pragma unroll
    for (int i = 0; i < kChunksPerRow / kLoadersPerRow; ++i) {
      const int chunk = load_chunk0 + kLoadersPerRow * i;
      // Rows past the split are zero-filled: P is 0 there, and 0 · garbage
      // could be NaN.
      cp_async_16(dst + (8 * (i / 2) + load_x[i % 2]) * 8, src + chunk * 8, slot >= 0 ? 16 : 0);
    }
  };
  {  // Prologue: the slot indices of the first kStages - 1 tiles as independent loads, then their rows.
    int64_t first[kStages - 1];
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) first[s] = slot_of(s);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_tiles) load_tile(first[s], s);
      cp_async_commit();
    }
  }
  int64_t next_slot = slot_of(kStages - 1);

  // This warp's half of the query tile as m16k16 A fragments (rows: heads):
  // latent dims [256 k_half, +256) then rope dims [kL + 32 k_half, +32), so
  // both halves start on 8-chunk boundaries of the swizzle.
  uint32_t qf[kQkSteps][4];
  auto qk_dim = [&](int kt) {
    return kt < kLatentSteps ? k_half * (kL / 2) + kt * 16 : kL + k_half * (kR / 2) + (kt - kLatentSteps) * 16;
  };
  {
    const int64_t q_row0 = int64_t(t) * p.num_heads + h0;
    const __nv_bfloat16* q_lo = p.q + (q_row0 + min(g, heads - 1)) * kD + c2;
    const __nv_bfloat16* q_hi = p.q + (q_row0 + min(g + 8, heads - 1)) * kD + c2;
    const bool lo_ok = g < heads, hi_ok = g + 8 < heads;
#pragma unroll
    for (int kt = 0; kt < kQkSteps; ++kt) {
      const int d = qk_dim(kt);
      qf[kt][0] = lo_ok ? __ldg(reinterpret_cast<const unsigned int*>(q_lo + d)) : 0u;
      qf[kt][1] = hi_ok ? __ldg(reinterpret_cast<const unsigned int*>(q_hi + d)) : 0u;
      qf[kt][2] = lo_ok ? __ldg(reinterpret_cast<const unsigned int*>(q_lo + d + 8)) : 0u;
      qf[kt][3] = hi_ok ? __ldg(reinterpret_cast<const unsigned int*>(q_hi + d + 8)) : 0u;
      if (kFp8 && kt < kLatentSteps) {  // meets the fp16 latent tile
#pragma unroll
        for (int i = 0; i < 4; ++i) qf[kt][i] = bf16x2_to_f16x2(qf[kt][i]);
      }
    }
  }
  // ldmatrix addresses. q·k: this lane's row of the warp's 16, at chunk
  // qk_dim(kt) / 8 + (lane / 8) % 2, whose residue mod 8 is 2 (kt % 4) + that
  // for latent steps and 4 k_half + 2 (kt - 16) + that for rope steps.
  const int qk_row = row_half * 16 + (lane / 16) * 8 + lane % 8;
  int qk_x[4], rope_x[2];
#pragma unroll
  for (int m = 0; m < 4; ++m) qk_x[m] = swizzle_chunk(2 * m + (lane / 8) % 2, qk_row);
#pragma unroll
  for (int m = 0; m < 2; ++m) rope_x[m] = swizzle_chunk(4 * k_half + 2 * m + (lane / 8) % 2, qk_row);
  auto qk_offset = [&](int kt) {
    return kt < kLatentSteps ? qk_row * kD + (k_half * (kL / 16) + 8 * (kt / 4) + qk_x[kt % 4]) * 8
                             : qk_row * kD + (kL / 8 + rope_x[kt - kLatentSteps]) * 8;
  };
  // p·v (transposed loads): rows kk * 16 + lane % 8 + 8 ((lane / 8) % 2),
  // chunk 16 warp + j + lane / 16 for even j, residue (j % 8) + lane / 16.
  const int pv_row = lane % 8 + ((lane / 8) % 2) * 8;
  int pv_x[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) pv_x[m] = swizzle_chunk(2 * m + lane / 16, pv_row);
  auto pv_offset = [&](int kk, int j) {
    return (kk * 16 + pv_row) * kD + (warp * (kDimsPerWarp / 8) + 8 * (j / 8) + pv_x[(j % 8) / 2]) * 8;
  };

  float o[kNTiles][4] = {};
  // l_run sums this thread's columns only; the quad reduces it once at the end.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kMlaLog2e;

  for (int it = 0; it < num_tiles; ++it) {
    const __nv_bfloat16* tile_s = kv_s + (kFp8 ? 0 : (it % kStages) * kBlockN * kD);
    cp_async_wait<kStages - 2>();
    // After this barrier every warp is done with tile it - 1: its buffer and
    // the score exchange may be overwritten.
    __syncthreads();
    {
      const int ahead = it + kStages - 1;
      if (ahead < num_tiles) load_tile(next_slot, ahead % kStages);
      cp_async_commit();
      next_slot = slot_of(ahead + 1);  // consumed next iteration: latency hidden
    }
    if constexpr (kFp8) {
      // Raw tile -> the 16-bit tile: this thread's row, every 4th 8-value
      // chunk; latent values as fp16 of value x 2^-8 (scales applied later).
      const uint8_t* raw = raw_s + ((it % kStages) * kBlockN + load_row) * kFp8Layout.slot_bytes();
      __nv_bfloat16* dst = kv_s + load_row * kD;
#pragma unroll
      for (int i = 0; i < kL / 8 / kLoadersPerRow; ++i) {
        const int chunk = load_chunk0 + kLoadersPerRow * i;
        const uint2 b = *reinterpret_cast<const uint2*>(raw + chunk * 8);
        const uint4 h = make_uint4(e4m3x2_to_f16x2_scaled(__byte_perm(b.x, 0, 0x4140)),
                                   e4m3x2_to_f16x2_scaled(__byte_perm(b.x, 0, 0x4342)),
                                   e4m3x2_to_f16x2_scaled(__byte_perm(b.y, 0, 0x4140)),
                                   e4m3x2_to_f16x2_scaled(__byte_perm(b.y, 0, 0x4342)));
        *reinterpret_cast<uint4*>(dst + swizzle_chunk(chunk, load_row) * 8) = h;
      }
#pragma unroll
      for (int i = 0; i < kR / 8 / kLoadersPerRow; ++i) {
        const int chunk = kL / 8 + load_chunk0 + kLoadersPerRow * i;
        *reinterpret_cast<uint4*>(dst + swizzle_chunk(chunk, load_row) * 8) =
            *reinterpret_cast<const uint4*>(raw + kFp8Layout.rope_offset() + (chunk - kL / 8) * 16);
      }
      __syncthreads();
    }

    // The FP8 tile's per-row, per-128-dims scales (x 2^8, undoing the fp16
    // expansion's 2^-8) for kv row `row` of this tile, group `group`.
    const uint8_t* raw_tile = raw_s + (it % kStages) * kBlockN * kFp8Layout.slot_bytes();
    auto fp8_row_scale = [&](int row, int group) {
      return 256.0f *
             reinterpret_cast<const float*>(raw_tile + row * kFp8Layout.slot_bytes() + kFp8Layout.scale_offset())[group];
    };
    if constexpr (kFp8) {
      // Partial S over this warp's half: its two 128-dim latent groups in
      // separate accumulators (each scaled per kv row afterwards) and rope.
      static_assert(kL / 2 == 2 * kFp8KvGroup, "a warp's latent half is two scale groups");
      float sg[3][2][4] = {};
#pragma unroll
      for (int kt = 0; kt < kQkSteps; ++kt) {
        uint32_t b[4];
        ldmatrix_x4(b, tile_s + qk_offset(kt));
        const int acc = kt < kLatentSteps ? kt / (kLatentSteps / 2) : 2;
        if (kt < kLatentSteps) {
          mma_f16_16816(sg[acc][0], qf[kt], b[0], b[1]);
          mma_f16_16816(sg[acc][1], qf[kt], b[2], b[3]);
        } else {
          mma_bf16_16816(sg[acc][0], qf[kt], b[0], b[1]);
          mma_bf16_16816(sg[acc][1], qf[kt], b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int row = row_half * 16 + nt * 8 + c2;  // kv rows of columns c2, c2 + 1
        const float f0 = fp8_row_scale(row, 2 * k_half), f1 = fp8_row_scale(row + 1, 2 * k_half);
        const float g0 = fp8_row_scale(row, 2 * k_half + 1), g1 = fp8_row_scale(row + 1, 2 * k_half + 1);
        score_x[(warp * 2 + nt) * 32 + lane] =
            make_float4(sg[0][nt][0] * f0 + sg[1][nt][0] * g0 + sg[2][nt][0],
                        sg[0][nt][1] * f1 + sg[1][nt][1] * g1 + sg[2][nt][1],
                        sg[0][nt][2] * f0 + sg[1][nt][2] * g0 + sg[2][nt][2],
                        sg[0][nt][3] * f1 + sg[1][nt][3] * g1 + sg[2][nt][3]);
      }
    } else {
      // Partial S{16 heads, this warp's 16 rows} over its half of the dims;
      // even and odd k-steps in separate accumulators (half the mma chain).
      float sa[2][2][4] = {};
#pragma unroll
      for (int kt = 0; kt < kQkSteps; ++kt) {
        uint32_t b[4];
        ldmatrix_x4(b, tile_s + qk_offset(kt));
        mma_bf16_16816(sa[kt % 2][0], qf[kt], b[0], b[1]);
        mma_bf16_16816(sa[kt % 2][1], qf[kt], b[2], b[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        score_x[(warp * 2 + nt) * 32 + lane] = make_float4(sa[0][nt][0] + sa[1][nt][0], sa[0][nt][1] + sa[1][nt][1],
                                                           sa[0][nt][2] + sa[1][nt][2], sa[0][nt][3] + sa[1][nt][3]);
    }
    __syncthreads();

    // Full S{16, 32} in C-fragment layout: n-tile n covers rows 8n..8n+7,
    // the sum of the two dims halves (warps 2 * row_half + {0, 1}).
    const int tile_start = begin + it * kBlockN;
    float s[4][4];
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float4 a = score_x[((n / 2) * 4 + n % 2) * 32 + lane];
      const float4 b = score_x[((n / 2) * 4 + 2 + n % 2) * 32 + lane];
      const int col = tile_start + n * 8 + c2;
      s[n][0] = col < end ? (a.x + b.x) * scale_log2 : -INFINITY;
      s[n][1] = col + 1 < end ? (a.y + b.y) * scale_log2 : -INFINITY;
      s[n][2] = col < end ? (a.z + b.z) * scale_log2 : -INFINITY;
      s[n][3] = col + 1 < end ? (a.w + b.w) * scale_log2 : -INFINITY;
      mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);  // finite: a tile's first row is always valid
      alpha[r] = exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
    }
    // P as two m16k16 A fragments (k: tile rows 0-15, 16-31).
    uint32_t pa[2][4];
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float p0 = exp2f(s[n][0] - m_run[0]), p1 = exp2f(s[n][1] - m_run[0]);
      const float p2 = exp2f(s[n][2] - m_run[1]), p3 = exp2f(s[n][3] - m_run[1]);
      sum[0] += p0 + p1;
      sum[1] += p2 + p3;
      if constexpr (kFp8) {
        // This warp's 128 output dims are one scale group: P takes the
        // group's per-row scale, so the fp16 tile needs no multiply.
        const int row = n * 8 + c2;
        const float f0 = fp8_row_scale(row, warp), f1 = fp8_row_scale(row + 1, warp);
        pa[n / 2][(n % 2) * 2] = pack_f16x2(p0 * f0, p1 * f1);
        pa[n / 2][(n % 2) * 2 + 1] = pack_f16x2(p2 * f0, p3 * f1);
      } else {
        pa[n / 2][(n % 2) * 2] = pack_bf16x2(p0, p1);
        pa[n / 2][(n % 2) * 2 + 1] = pack_bf16x2(p2, p3);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

    // O{16 heads, this warp's kDimsPerWarp} += P{16, kBlockN} · c_kv{kBlockN, dims}.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int j = 0; j < kNTiles; j += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tile_s + pv_offset(kk, j));
        if constexpr (kFp8) {
          mma_f16_16816(o[j], pa[kk], b[0], b[1]);
          mma_f16_16816(o[j + 1], pa[kk], b[2], b[3]);
        } else {
          mma_bf16_16816(o[j], pa[kk], b[0], b[1]);
          mma_bf16_16816(o[j + 1], pa[kk], b[2], b[3]);
        }
      }
    }
  }
  // Dependents (the split merge) may launch now; they wait for this grid's
  // completion and memory before reading anything.
  grid_dependents_launch();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
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
// A block takes 128 latent dims of one (token, head): 32 threads of float4
// columns times kMergeGroups groups that each sum every kMergeGroups-th split.
// NOTES: the split weights are formed once in shared memory and the partial
// rows are read with independent loads (unrolled); a loop that re-read each
// lse from global memory serialized ~2 x splits L2 round trips per thread,
// ~20 us at 56 splits. Splitting the splits over four thread groups cuts the
// L2 round trips a thread waits for by four again (a 1-token batch at 64
// splits: 2 rounds of 8 loads).
constexpr int kMergeDims = 128, kMergeGroups = 4;
__global__ void __launch_bounds__(kMergeGroups * kMergeDims / 4) mla_merge_kernel(MlaAbsorbedParams p) {
  constexpr int kQuads = kMergeDims / 4;
  __shared__ float weight[kMaxSplits];
  __shared__ float4 group_sum[kMergeGroups - 1][kQuads];
  grid_dependency_wait();
  const int64_t th = blockIdx.x;  // blockIdx.y picks a slice of the latent dims
  const int64_t stride = int64_t(p.num_tokens) * p.num_heads;
  const int num_partials = p.num_splits;
  for (int s = threadIdx.x; s < num_partials; s += blockDim.x) weight[s] = p.partial_lse[s * stride + th];
  __syncthreads();
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int s = threadIdx.x; s < num_partials; s += 32) m = fmaxf(m, weight[s]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int s = threadIdx.x; s < num_partials; s += 32) {
      const float w = weight[s] == -INFINITY ? 0.0f : exp2f(weight[s] - m);
      weight[s] = w;
      sum += w;
    }
    sum = warp_sum(sum);
    __syncwarp();
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int s = threadIdx.x; s < num_partials; s += 32) weight[s] *= inv;
  }
  __syncthreads();
  const int quad = threadIdx.x % kQuads, group = threadIdx.x / kQuads;
  const int d = blockIdx.y * kMergeDims + quad * 4;
  const float* src = p.partial_out + th * p.latent_dim + d;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
  for (int s = group; s < num_partials; s += kMergeGroups) {
    const float w = weight[s];
    if (w == 0.0f) continue;  // an empty split (or one that underflows): its rows may be garbage
    const float4 v = *reinterpret_cast<const float4*>(src + s * stride * p.latent_dim);
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  if (group > 0) group_sum[group - 1][quad] = acc;
  __syncthreads();
  if (group == 0) {
#pragma unroll
    for (int g = 0; g < kMergeGroups - 1; ++g) {
      const float4 v = group_sum[g][quad];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    auto* dst = reinterpret_cast<__nv_bfloat162*>(p.out + th * p.latent_dim + d);
    dst[0] = __floats2bfloat162_rn(acc.x, acc.y);
    dst[1] = __floats2bfloat162_rn(acc.z, acc.w);
  }
}

// Any latent/rope width: one block per (token, head), one latent row at a
// time. Slow; for tiny test models whose widths the fast kernel does not tile.
__global__ void mla_absorbed_reference_kernel(MlaAbsorbedParams p) {
  extern __shared__ float acc[];  // [L]
  const int t = blockIdx.x / p.num_heads, h = blockIdx.x % p.num_heads;
  const int D = p.latent_dim + p.rope_dim;
  const Fp8KvLayout layout{p.latent_dim, p.rope_dim};
  const TokenRange range = token_range(p, t);
  const __nv_bfloat16* q = p.q + (int64_t(t) * p.num_heads + h) * D;
  for (int d = threadIdx.x; d < p.latent_dim; d += blockDim.x) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < range.attend; ++j) {
    const int64_t slot = p.kv_slots[range.kv_begin + j];
    auto value = [&](int d) {
      return p.fp8_cache ? load_fp8_kv_value(p.fp8_cache + slot * layout.slot_bytes(), layout, d)
                         : __bfloat162float(p.cache[slot * D + d]);
    };
    float dot = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) dot += __bfloat162float(q[d]) * value(d);
    const float s = block_sum(dot) * p.scale;
    const float m_new = fmaxf(m, s), alpha = __expf(m - m_new), w = __expf(s - m_new);
    for (int d = threadIdx.x; d < p.latent_dim; d += blockDim.x) acc[d] = acc[d] * alpha + w * value(d);
    l = l * alpha + w;
    m = m_new;
  }
  for (int d = threadIdx.x; d < p.latent_dim; d += blockDim.x)
    p.out[(int64_t(t) * p.num_heads + h) * p.latent_dim + d] = __float2bfloat16(l > 0.0f ? acc[d] / l : 0.0f);
}

template <int kL, int kR, int kStages, bool kFp8>
constexpr size_t mma_smem_bytes() {
  const size_t exchange = sizeof(float4) * kWarps * 2 * 32;
  if (kFp8)
    return sizeof(__nv_bfloat16) * kBlockN * (kL + kR) + exchange +
           size_t(kStages) * kBlockN * Fp8KvLayout{kL, kR}.slot_bytes();
  return sizeof(__nv_bfloat16) * kStages * kBlockN * (kL + kR) + exchange;
}

// The split merge (with split-KV), launched as a programmatic dependent so
// that its launch overlaps the attention grid.
void launch_merge(const MlaAbsorbedParams& p, cudaStream_t stream) {
  if (p.num_splits <= 1) return;
  cudaLaunchConfig_t config = {};
  static_assert(512 % kMergeDims == 0, "merge slices tile the latent");
  config.gridDim = dim3(p.num_tokens * p.num_heads, 512 / kMergeDims);
  config.blockDim = dim3(kMergeGroups * kMergeDims / 4);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&config, mla_merge_kernel, p), "mla_attention_absorbed (merge)");
}

// The decode pipeline: two 32-row stages, two blocks per SM (2 x 76 KB).
constexpr int kDecodeStages = 2, kDecodeBlocksPerSm = 2;

// The 16-head tensor-core kernel and, for split-KV, the merge.
template <int kStages, int kBlocksPerSm, bool kFp8>
void launch_mma(const MlaAbsorbedParams& p, cudaStream_t stream) {
  auto kernel = mla_absorbed_mma_kernel<512, 64, kStages, kBlocksPerSm, kFp8>;
  constexpr size_t smem = mma_smem_bytes<512, 64, kStages, kFp8>();
  static bool attribute_set = false;  // once per process and variant
  if (!attribute_set) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                   "mla_attention_absorbed");
    attribute_set = true;
  }
  const dim3 grid(p.num_splits, (p.num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock, p.num_tokens);
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  check_launch("mla_attention_absorbed");
  launch_merge(p, stream);
}

}  // namespace

int mla_absorbed_num_splits(int num_tokens, int num_heads, int sm_count, int max_kv_len, bool wide_blocks) {
  // Blocks that fit an SM at once: kDecodeBlocksPerSm of the 16-head kernel,
  // one of the 64-head one. Pick the split count whose grid
  // fills the last wave best (a grid of 1.45 waves idles a quarter of the
  // GPU in its tail), preferring fewer splits unless more are 5% better
  // (less merge traffic), and never splits shorter than the minimum rows
  // (two tiles; one for the smallest batches). Only splits that get rows
  // count: splits start on 32-row bounds, so 61 splits of 4096 rows are 43
  // of 96 rows. (The margin is relative: an absolute one kept a one-token
  // batch at one split below 13.)
  const int slots = (wide_blocks ? 1 : kDecodeBlocksPerSm) * sm_count;
  const int heads_per_block = wide_blocks ? kMlaWideHeads : kHeadsPerBlock;
  const int tile_rows = wide_blocks ? 2 * kBlockN : kBlockN;
  const int blocks = std::max(1, num_tokens * ((num_heads + heads_per_block - 1) / heads_per_block));
  const int kv_len = std::max(1, max_kv_len);
  const int min_rows = split_min_rows(num_tokens, tile_rows);
  const int limit = std::clamp(kv_len / min_rows, 1, kMaxSplits);
  int best = 1;
  double best_eff = 0;
  for (int s = 1; s <= limit; ++s) {
    const int chunk = ((kv_len + s - 1) / s + kBlockN - 1) / kBlockN * kBlockN;
    const int total = blocks * ((kv_len + chunk - 1) / chunk), waves = (total + slots - 1) / slots;
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
  const bool fits = mla_absorbed_uses_wide_blocks(p.num_heads, p.latent_dim, p.rope_dim),
             wide = p.wide_blocks < 0 ? fits : p.wide_blocks != 0;
  MLA_CUDA_REQUIRE(!wide || fits, "mla_attention_absorbed: the 64-head wgmma kernel needs a Hopper GPU and heads "
                                  "a multiple of 64 (heads " + std::to_string(p.num_heads) + ")");
  if (wide) {
    launch_mla_absorbed_sm90(p, stream);
    launch_merge(p, stream);
  } else if (p.fp8_cache) {
    launch_mma<kDecodeStages, kDecodeBlocksPerSm, true>(p, stream);
  } else {
    launch_mma<kDecodeStages, kDecodeBlocksPerSm, false>(p, stream);
  }
}

}  // namespace mlaserve::cuda

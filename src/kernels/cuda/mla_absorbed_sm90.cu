#include "kernels/cuda/mla_absorbed_sm90.h"

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_kv_cache.cuh"
#include "kernels/cuda/grouped_gemm_sm90.cuh"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/mla_absorbed_rows.cuh"
#include "kernels/cuda/mma_sm80.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kL = 512, kR = 64, kD = kL + kR;
constexpr int kRows = 64;        // kv rows a tile; each warpgroup scores 32 of them
constexpr int kThreads = 256;    // two warpgroups
constexpr int kColBlocks = kD / 64;
// A swizzled tile of 64 rows (query heads or kv rows) x 576 bf16: nine
// column blocks of 64 dims, each 64 rows of 128 bytes (grouped_gemm_sm90.cuh).
constexpr int kBlockBytes = 64 * 128, kTileBytes = kColBlocks * kBlockBytes;
constexpr int kLoadersPerRow = 4, kChunksPerRow = kD / 8;
constexpr Fp8KvLayout kFp8Layout{kL, kR};
constexpr int kSlotBytes = int(kFp8Layout.slot_bytes()), kSlotChunks = kSlotBytes / 16;
static_assert(kSlotBytes % 16 == 0 && (kRows * kSlotBytes) % 1024 == 0 && kFp8Layout.num_groups() == kL / kFp8KvGroup, "16-byte copies of whole slots");
// Q tile, the kv tiles (bf16: two; FP8: one bf16 tile and one raw slot tile),
// the P tile (one column block), the row exchange; 1024-byte alignment slack.
template <bool kFp8>
constexpr size_t smem_bytes() {
  const size_t kv = kFp8 ? size_t(kTileBytes) + size_t(kRows) * kSlotBytes : 2 * size_t(kTileBytes);
  return 1024 + size_t(kTileBytes) + kv + kBlockBytes + 2 * 64 * sizeof(float);
}
static_assert(smem_bytes<false>() <= 227 * 1024 && smem_bytes<true>() <= 227 * 1024, "fits one Hopper SM");

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled 64-row tile.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return uint32_t((chunk / 8) * kBlockBytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
}

// One block: 64 heads of one token over one split of its context, in tiles
// of 64 latent rows (two-stage cp.async ring). Warpgroup w scores kv rows
// [32w, 32w + 32) of a tile against all 64 heads (wgmma m64n32k16, Q and K
// from shared memory), the two exchange their row maxima, each writes its
// half of P (bf16) to a shared tile, and then warpgroup w accumulates output
// dims [256w, 256w + 256) over all 64 rows (wgmma m64n256k16, P from shared
// memory, the tile's latent part read as the MN-major B operand: the same
// tile serves K and V).
// NOTES: the phases of a tile run in order (scores, softmax, products); the
// next tile's copies overlap them. H100, 64 x 8192 x 128 heads (perf.md
// session 9): 438 us; without the copies 293, without the MMAs 316, without
// both 96 (softmax, barriers): copies and MMAs barely overlap, and the copies
// alone reach only ~1.9 TB/s of unique bytes (each tile crosses L2 -> SM
// once per 64-head block). Measured and dropped: bulk L2 prefetch of the
// next tiles (+10%), skipping the rescale when no row maximum moved and
// masking only the last tile (+3-8%). Next: a cluster of a token's two head
// blocks with the tile multicast by TMA (one box of 64 dims x 1 row per
// column block lands in the swizzled layout), and the next tile's scores
// overlapping this tile's softmax (FlashMLA).
// kFp8: the cache holds FP8 slots (fp8_kv_layout.h); cp.async brings a tile
// of raw slots (42 KB), which the block widens into the bf16 tile (value x
// scale in f32, rounded to bf16: 2^-9 relative, far under e4m3's own
// rounding) before the next raw tile is requested. No room for a second
// raw tile next to the Q tile; the rows in flight match the bf16 ring's.
// Measured and dropped (H100, perf.md session 9): 48-row tiles, so that two
// widened tiles and a raw tile fit, with tile it + 1 widened while the
// tensor cores score tile it: 735-749 against 620-626 us at 64 x 8192.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_absorbed_sm90_kernel(MlaAbsorbedParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* q_s = base;
  uint8_t* kv_s = base + kTileBytes;  // bf16: [2] tiles; FP8: the bf16 tile, then the raw slot tile
  uint8_t* raw_s = kv_s + kTileBytes;
  uint8_t* p_s = kv_s + (kFp8 ? kTileBytes + kRows * kSlotBytes : 2 * kTileBytes);  // 1024-byte aligned
  float* x_s = reinterpret_cast<float*>(p_s + kBlockBytes);  // [2 warpgroups][64 heads]

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c2 = (lane % 4) * 2, row0 = warp * 16 + g;  // this thread's heads: row0, row0 + 8
  const int split = blockIdx.x, h0 = blockIdx.y * kMlaWideHeads, t = blockIdx.z, H = p.num_heads;
  const TokenRange range = token_range(p, t);
  const int chunk = split_chunk(range.attend, p.num_splits);
  const int begin = split * chunk, end = min(begin + chunk, range.attend);

  if (begin >= end) {  // this split got no rows: an empty partial result
    if (p.num_splits > 1) {
      // Weight 0: the merge skips this split's (unwritten) partial rows.
      if (tid < kMlaWideHeads) p.partial_lse[(int64_t(split) * p.num_tokens + t) * H + h0 + tid] = -INFINITY;
    } else {
      for (int i = tid; i < kMlaWideHeads * kL; i += kThreads)
        p.out[(int64_t(t) * H + h0) * kL + i] = __float2bfloat16(0.0f);
    }
    return;
  }

  const __nv_bfloat16* q = p.q + (int64_t(t) * H + h0) * kD;
  for (int c = tid; c < kMlaWideHeads * kChunksPerRow; c += kThreads)
    cp_async_16(q_s + swizzled(c / kChunksPerRow, c % kChunksPerRow), q + c * 8);

  // Each thread copies every 4th chunk of one latent row and reads that
  // row's slot index a tile ahead (as in the 16-head kernel).
  static_assert(kRows * kLoadersPerRow == kThreads, "row mapping");
  const int32_t* slots = p.kv_slots + range.kv_begin;
  const int load_row = tid / kLoadersPerRow, load_chunk0 = tid % kLoadersPerRow;
  const int num_tiles = (end - begin + kRows - 1) / kRows;
  auto slot_of = [&](int tile) -> int64_t {
    const int j = begin + tile * kRows + load_row;
    return j < end ? int64_t(slots[j]) : int64_t(-1);
  };
  auto load_tile = [&](int64_t slot, int buf) {
    if constexpr (kFp8) {
      const uint8_t* src = p.fp8_cache + (slot >= 0 ? slot : 0) * kSlotBytes;
#pragma unroll
      for (int i = 0; i < (kSlotChunks + kLoadersPerRow - 1) / kLoadersPerRow; ++i) {
        const int c = load_chunk0 + kLoadersPerRow * i;
        // Rows past the split are zeros: values 0 times scale 0.
        if (c < kSlotChunks) cp_async_16(raw_s + load_row * kSlotBytes + c * 16, src + c * 16, slot >= 0 ? 16 : 0);
      }
      return;
    }
    uint8_t* dst = kv_s + buf * kTileBytes;
    const __nv_bfloat16* src = p.cache + (slot >= 0 ? slot : 0) * kD;
#pragma unroll
    for (int i = 0; i < kChunksPerRow / kLoadersPerRow; ++i) {
      const int c = load_chunk0 + kLoadersPerRow * i;
      // Rows past the split are zero-filled: P is 0 there, and 0 · garbage could be NaN.
      cp_async_16(dst + swizzled(load_row, c), src + c * 8, slot >= 0 ? 16 : 0);
    }
  };
  // FP8: this thread's share of the raw tile (its row, every 4th 8-value chunk) into the bf16 tile.
  auto widen_tile = [&]() {
    constexpr Fp8KvLayout layout = kFp8Layout;  // a device-side copy for the helper's reference
    const uint8_t* raw = raw_s + load_row * kSlotBytes;
#pragma unroll 4  // fully unrolled, the loads of all 16 chunks stay live beside the accumulators and spill
    for (int i = 0; i < kL / 8 / kLoadersPerRow; ++i) {
      const int c = load_chunk0 + kLoadersPerRow * i;
      float v[8];
      load_fp8_kv_latent8(raw, layout, c * 8, v);
      *reinterpret_cast<uint4*>(kv_s + swizzled(load_row, c)) =
          make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                     pack_bf16x2(v[6], v[7]));
    }
#pragma unroll
    for (int i = 0; i < kR / 8 / kLoadersPerRow; ++i) {
      const int c = load_chunk0 + kLoadersPerRow * i;
      *reinterpret_cast<uint4*>(kv_s + swizzled(load_row, kL / 8 + c)) =
          *reinterpret_cast<const uint4*>(raw + kFp8Layout.rope_offset() + c * 16);
    }
  };
  load_tile(slot_of(0), 0);
  cp_async_commit();
  int64_t next_slot = slot_of(1);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  // l_run sums this thread's columns of this warpgroup's rows only; reduced at the end.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kMlaLog2e;
  const uint32_t q_addr = sm90::smem_u32(q_s), p_addr = sm90::smem_u32(p_s);

  for (int it = 0; it < num_tiles; ++it) {
    const int buf = kFp8 ? 0 : it & 1;
    if constexpr (kFp8) {
      cp_async_wait<0>();
      __syncthreads();  // the raw tile landed, and every thread is done with the bf16 tile of tile it - 1
      widen_tile();
      sm90::fence_proxy_async_smem();  // wgmma reads what the widening wrote
      __syncthreads();  // the raw tile is free: request the next one
      if (it + 1 < num_tiles) load_tile(next_slot, 0);
      cp_async_commit();
    } else {
      // Tile it - 1's buffer is free (the barrier that ended the last
      // iteration): request tile it + 1 before waiting for tile it, so two
      // tiles are in flight while this one lands.
      if (it + 1 < num_tiles) load_tile(next_slot, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
      sm90::fence_proxy_async_smem();  // wgmma reads what cp.async wrote
      __syncthreads();
    }
    next_slot = slot_of(it + 2);
    const uint32_t kv_addr = sm90::smem_u32(kv_s + buf * kTileBytes);

    // S{64 heads, this warpgroup's 32 rows}.
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
    sm90::fence_registers(s);
    sm90::wgmma_fence();
#pragma unroll
    for (int blk = 0; blk < kColBlocks; ++blk) {
      const uint64_t da = sm90::wgmma_desc(q_addr + blk * kBlockBytes);
      const uint64_t db = sm90::wgmma_desc(kv_addr + blk * kBlockBytes + wg * 32 * 128);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) sm90::wgmma_m64n32k16_bf16(s, da + 2 * kk, db + 2 * kk, 1);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_registers(s);

    const int col0 = begin + it * kRows + wg * 32;  // kv index of this warpgroup's first column
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int col = col0 + (i / 4) * 8 + c2 + (i % 2);
      s[i] = col < end ? s[i] * scale_log2 : -INFINITY;
      mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], s[i]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (lane % 4 == 0) x_s[wg * 64 + row0 + 8 * r] = mx[r];
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // Both warpgroups reach the same maximum; finite, as the tile's first row is valid.
      const float m_new = fmaxf(m_run[r], fmaxf(mx[r], x_s[(1 - wg) * 64 + row0 + 8 * r]));
      alpha[r] = exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const float p0 = exp2f(s[4 * nt] - m_run[0]), p1 = exp2f(s[4 * nt + 1] - m_run[0]);
      const float p2 = exp2f(s[4 * nt + 2] - m_run[1]), p3 = exp2f(s[4 * nt + 3] - m_run[1]);
      sum[0] += p0 + p1;
      sum[1] += p2 + p3;
      const int col = wg * 32 + nt * 8 + c2;  // P tile column (kv row of the tile)
      *reinterpret_cast<uint32_t*>(p_s + swizzled(row0, col / 8) + (col % 8) * 2) = pack_bf16x2(p0, p1);
      *reinterpret_cast<uint32_t*>(p_s + swizzled(row0 + 8, col / 8) + (col % 8) * 2) = pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
    sm90::fence_proxy_async_smem();  // P, written by both warpgroups, is read by wgmma
    __syncthreads();

#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    // O{64 heads, dims [256 wg, +256)} += P{64, 64} · c_kv{64 rows, those dims}.
    sm90::fence_registers(o);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t da = sm90::wgmma_desc(p_addr) + 2 * kk;
      const uint64_t db = sm90::wgmma_desc_mn(kv_addr + 4 * wg * kBlockBytes + kk * 16 * 128, kBlockBytes);
      sm90::wgmma_m64n256k16_bf16<1>(o, da, db, 1);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_registers(o);
    __syncthreads();  // every thread is done with this tile's buffer, P and the exchange
  }
  // Dependents (the split merge) may launch now; they wait for this grid's
  // completion and memory before reading anything.
  grid_dependents_launch();

  // Row sums: the quad's columns, then both warpgroups' halves.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (lane % 4 == 0) {
    x_s[wg * 64 + row0] = l_run[0];
    x_s[wg * 64 + row0 + 8] = l_run[1];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const float l = x_s[row] + x_s[64 + row], inv = 1.0f / l;
    const int64_t th = int64_t(t) * H + h0 + row;
    if (p.num_splits == 1) {
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<__nv_bfloat162*>(p.out + th * kL + wg * 256 + j * 8 + c2) =
            __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    } else {
      const int64_t sth = int64_t(split) * p.num_tokens * H + th;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(p.partial_out + sth * kL + wg * 256 + j * 8 + c2) =
            make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      if (wg == 0 && lane % 4 == 0) p.partial_lse[sth] = m_run[r] + log2f(l);
    }
  }
#else
  __trap();  // built for sm_90a only; the host never picks it elsewhere
#endif
}

}  // namespace

bool mla_absorbed_uses_wide_blocks(int num_heads, int latent_dim, int rope_dim) {
  return latent_dim == kL && rope_dim == kR && num_heads > 0 && num_heads % kMlaWideHeads == 0 &&
         sm90_gemm_supported();
}

namespace {

template <bool kFp8>
void launch(const MlaAbsorbedParams& p, cudaStream_t stream) {
  static bool attribute_set = false;  // once per process and variant
  if (!attribute_set) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(mla_absorbed_sm90_kernel<kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem_bytes<kFp8>())),
                   "mla_attention_absorbed (sm90)");
    attribute_set = true;
  }
  const dim3 grid(p.num_splits, p.num_heads / kMlaWideHeads, p.num_tokens);
  mla_absorbed_sm90_kernel<kFp8><<<grid, kThreads, smem_bytes<kFp8>(), stream>>>(p);
  check_launch("mla_attention_absorbed (sm90)");
}

}  // namespace

void launch_mla_absorbed_sm90(const MlaAbsorbedParams& p, cudaStream_t stream) {
  if (p.fp8_cache) launch<true>(p, stream);
  else launch<false>(p, stream);
}

}  // namespace mlaserve::cuda

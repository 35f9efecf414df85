#include "kernels/cuda/mla_absorbed_sm90.h"

#include <cfloat>
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
constexpr int kRows = 64;  // kv rows a tile; each consumer warpgroup scores 32 of them
constexpr int kStages = 2;  // kv tiles in the ring (Q, two tiles and P fill the SM's 227 KB)
constexpr int kProducerThreads = 128, kConsumerThreads = 256, kThreads = kProducerThreads + kConsumerThreads;
// 128 x 104 + 256 x 200 = 64,512 of the 65,536 registers (setmaxnreg steps of 8).
constexpr int kProducerRegs = 104, kConsumerRegs = 200;
constexpr int kConsumerBarrier = 1;  // named barrier of the two consumer warpgroups
constexpr int kColBlocks = kD / 64;
// A swizzled tile of 64 rows (query heads or kv rows) x 576 bf16: nine
// column blocks of 64 dims, each 64 rows of 128 bytes (grouped_gemm_sm90.cuh).
constexpr int kBlockBytes = 64 * 128, kTileBytes = kColBlocks * kBlockBytes;
constexpr int kChunksPerRow = kD / 8;                   // 16-byte bf16 chunks of a row
constexpr int kLoadersPerRow = kProducerThreads / kRows;  // producer threads sharing a kv row
constexpr Fp8KvLayout kFp8Layout{kL, kR};
constexpr int kSlotBytes = int(kFp8Layout.slot_bytes());
static_assert(kLoadersPerRow == 2, "the bf16 producer: two threads a kv row");
static_assert(32 * 16 == kL && kFp8Layout.num_groups() == 4 && 2 * kR == 8 * 16 &&
                  kFp8Layout.rope_offset() % 16 == 0 && kProducerThreads / 32 * 16 == kRows,
              "the FP8 producer: a warp's 32 x 16 bytes are one row's c_kv (eight lanes a scale group), "
              "eight lanes cover its k_pe, and each of the four warps widens 16 rows");
// Row maxima of the two consumer warpgroups, by tile parity, then the row
// sums, then (FP8 cache) each head's Q scale.
constexpr int kExchangeFloats = 3 * 2 * 64 + 64;
// Q tile, the kv ring, the P tile (one column block), the exchange, the
// barriers (full and empty a stage, Q's); 1024-byte alignment slack.
constexpr size_t kSmemBytes =
    1024 + size_t(1 + kStages) * kTileBytes + kBlockBytes + kExchangeFloats * sizeof(float) + (2 * kStages + 1) * 8;
static_assert(kSmemBytes <= 227 * 1024, "fits one Hopper SM");

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled 64-row tile.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return uint32_t((chunk / 8) * kBlockBytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
}

// One block: 64 heads of one token over one split of its context, in tiles
// of 64 latent rows. Warpgroup 0 is the producer: it gathers each tile's
// rows by slot into a two-stage ring (full / empty mbarriers); bf16 rows by
// cp.async, FP8 slots through registers, widened as they are stored, so the
// consumers never see the raw bytes. The FP8 cache's c_kv dims widen to f16
// (value x scale rounded once: 2^-11 relative, far under e4m3's own
// rounding; two instructions a pair of values, where bf16 took six), and Q's
// c_kv dims and P are f16 to meet them; |c_kv| <= sqrt(L) max|kv_norm| after
// the RMSNorm, far inside f16's range, and each Q row is scaled by a power
// of two into it (undone on the scores). k_pe and Q's rope dims stay bf16. Consumer warpgroup w
// scores kv rows [32w, 32w + 32) of a tile against all 64 heads (wgmma
// m64n32k16, Q and K from shared memory), the two exchange their row maxima,
// each writes its half of P (bf16) to a shared tile, and then warpgroup w
// accumulates output dims [256w, 256w + 256) over all 64 rows (wgmma
// m64n256k16, P from shared memory, the tile's latent part read as the
// MN-major B operand: the same tile serves K and V).
// NOTES: H100, 64 x 8192 x 128 heads, bf16 (perf.md session 18): 383-388
// us (before the producer warpgroup, every thread copying and meeting at
// block barriers: 428-434); the same kernel without the copies 295 us,
// without the MMAs 354, without both 117: the copies (1.2 GB from L2, each
// tile once per 64-head block) now bound it, the consumers' serial scores /
// softmax / products close behind. Nsight Compute: L2 throughput 93%, DRAM
// 53%. FP8 399-406 us since the tile is f16 (session 20; 458-463 widening to
// bf16 at six instructions a pair, the consumers 18% of their time waiting
// for the producer; session 19: a warp reading one row an instruction,
// 502-509, then the next tile's slots prefetched into L2, 464; 562-569 while
// each producer thread read its own row, L1/TEX 76%; 615-620 before the
// producer warpgroup); loading a tile's second pass while the first is
// widened (120 / 192 registers): no change. Measured and dropped (session 18, tests passing): each producer
// warp copying whole rows with its lanes on consecutive chunks (455 us); the
// token's two head blocks in a cluster sharing each tile, either by TMA
// (one 64 x 1 box a row and column block, multicast: 1062 us, the boxes are
// too small) or each copying 32 rows and forwarding them to the other by
// bulk shared-to-shared copies (432 us: half the L2 reads, but a longer
// path a tile with only two stages); the next tile's scores issued behind
// this tile's products (spills at 200-232 registers). Earlier (session 9):
// bulk L2 prefetch of the next tiles (+10%), skipping the rescale when no
// row maximum moved (+3-8%), 48-row FP8 tiles (+20%). Next: a third stage
// (Q takes 72 KB of the 227), which FlashMLA's two-tile schedule also needs.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_absorbed_sm90_kernel(MlaAbsorbedParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* q_s = base;
  uint8_t* kv_s = base + kTileBytes;  // [kStages] tiles
  uint8_t* p_s = kv_s + kStages * kTileBytes;
  float* x_s = reinterpret_cast<float*>(p_s + kBlockBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(x_s + kExchangeFloats);
  uint64_t* empty = full + kStages;
  uint64_t* q_full = empty + kStages;  // FP8: Q's bf16 rows have landed (the consumers convert them)

  const int tid = threadIdx.x, wg = tid / 128;
  const int split = blockIdx.x, h0 = blockIdx.y * kMlaWideHeads, t = blockIdx.z, H = p.num_heads;
  const TokenRange range = token_range(p, t);
  const int chunk = split_chunk(range.attend, p.num_splits, split_min_rows(p.num_tokens, kRows));
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
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // FP8: each producer thread's stores and (noinc) its k_pe copies.
      sm90::mbar_init(&full[s], kFp8 ? 2 * kProducerThreads : kProducerThreads);
      sm90::mbar_init(&empty[s], kConsumerThreads / 32);
    }
    if constexpr (kFp8) sm90::mbar_init(q_full, kProducerThreads);
  }
  __syncthreads();
  const int num_tiles = (end - begin + kRows - 1) / kRows;

  if (wg == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    const __nv_bfloat16* q = p.q + (int64_t(t) * H + h0) * kD;
    for (int c = tid; c < kMlaWideHeads * kChunksPerRow; c += kProducerThreads)
      cp_async_16(q_s + swizzled(c / kChunksPerRow, c % kChunksPerRow), q + c * 8);
    // bf16: the tiles' cp.async arrivals cover Q too. FP8: the consumers
    // convert Q in place as soon as it lands, while tile 0 is widened.
    if constexpr (kFp8) sm90::cp_async_arrive_noinc(q_full);
    // bf16: thread pairs share a kv row, `half` taking every other chunk.
    // FP8: warp w widens rows [16w, 16w + 16); lane l % 16 holds the slot
    // of row 16w + l % 16.
    const int lane = tid % 32, warp = tid / 32;
    const int row = kFp8 ? warp * 16 + lane % 16 : tid / kLoadersPerRow, half = tid % kLoadersPerRow;
    const int32_t* slots = p.kv_slots + range.kv_begin;
    auto slot_of = [&](int tile) -> int {
      const int j = begin + tile * kRows + row;
      return tile < num_tiles && j < end ? slots[j] : -1;
    };
    // Slot indices are read two tiles ahead (into the variable just used),
    // so no tile waits on that load's latency.
    int slot_even = slot_of(0), slot_odd = slot_of(1);
    if constexpr (kFp8) {
      // A warp reads one row's 512 c_kv bytes an instruction (lane l: 16
      // bytes of scale group l / 8), so each load touches four whole lines
      // (a lane per row reading 128 bytes of its own row in eight loads
      // touched 32 lines an instruction: L1-bound). Two passes of 8 rows a
      // tile, the first pass's loads flying while the consumers still use
      // the stage; lane l loads the scale of row l / 4, group l % 4 of the
      // pass (as an f16 pair); k_pe goes to shared memory by cp.async (bf16
      // already).
      const int group = lane / 8, chunk = lane % 8;
      // Tile it's step: its row's slot, the next tile's (prefetched), and
      // returns tile it + 2's.
      auto produce = [&](int it, int this_slot, int next_slot) {
        const int stage = it % kStages;
        uint8_t* dst = kv_s + stage * kTileBytes;
        const int slot_after_next = slot_of(it + 2);
        const uint8_t* cache = p.fp8_cache;
        {
          // The next tile's slots into L2 now, so its loads wait on L2, not DRAM.
          const int sl = __shfl_sync(0xffffffffu, next_slot, lane / 2);
          if (sl >= 0) {
            const uint8_t* bytes = cache + int64_t(sl) * kSlotBytes + (lane % 2) * 384;
#pragma unroll
            for (int k = 0; k < 3; ++k) asm volatile("prefetch.global.L2 [%0];" ::"l"(bytes + 128 * k));
          }
        }
        // Slot of the warp's row r (-1: past the split) and its bytes (slot 0's for those rows).
        auto row_slot = [&](int r) { return __shfl_sync(0xffffffffu, this_slot, r); };
        auto slot_bytes = [&](int sl) { return cache + int64_t(sl >= 0 ? sl : 0) * kSlotBytes; };
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          uint4 raw[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int sl = row_slot(8 * pass + i);
            raw[i] = sl >= 0 ? __ldg(reinterpret_cast<const uint4*>(slot_bytes(sl)) + lane) : make_uint4(0, 0, 0, 0);
          }
          const int scale_slot = row_slot(8 * pass + lane / 4);
          const __half2 scale = __float2half2_rn(
              scale_slot >= 0
                  ? __ldg(reinterpret_cast<const float*>(slot_bytes(scale_slot) + kFp8Layout.scale_offset()) + lane % 4)
                  : 0.0f);
          if (pass == 0) {
            sm90::mbar_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int r = lane / 8 + 4 * i, sl = row_slot(r);
              cp_async_16(dst + swizzled(warp * 16 + r, kL / 8 + chunk),
                          slot_bytes(sl) + kFp8Layout.rope_offset() + 16 * chunk, sl >= 0 ? 16 : 0);
            }
            sm90::cp_async_arrive_noinc(&full[stage]);
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int r = warp * 16 + 8 * pass + i;
            const __half2 row_scale = __shfl_sync(0xffffffffu, scale, 4 * i + group);
            // Lanes 0-3 of a group store their even bf16 chunks first, lanes
            // 4-7 their odd ones: the 32 stores cover all eight 16-byte
            // columns of the swizzled row (four lanes each).
#pragma unroll
            for (int n = 0; n < 2; ++n) {
              const int e = n ^ (chunk / 4);
              *reinterpret_cast<uint4*>(dst + swizzled(r, group * 16 + 2 * chunk + e)) =
                  widen_e4m3x8_f16(e ? make_uint2(raw[i].z, raw[i].w) : make_uint2(raw[i].x, raw[i].y), row_scale);
            }
          }
        }
        sm90::fence_proxy_async_smem();  // wgmma reads what these stores wrote
        sm90::mbar_arrive(&full[stage]);
        return slot_after_next;
      };
      // One call site (the bf16 loop's two unrolled ones spill here); the
      // slots rotate by value (a reference to either of two would put both
      // in local memory).
#pragma unroll 1
      for (int it = 0; it < num_tiles; ++it) {
        const int after_next = produce(it, slot_even, slot_odd);
        slot_even = slot_odd;
        slot_odd = after_next;
      }
    } else {
      auto produce = [&](int it, int& slot) {
        const int stage = it % kStages;
        uint8_t* dst = kv_s + stage * kTileBytes;
        const __nv_bfloat16* src = p.cache + int64_t(slot >= 0 ? slot : 0) * kD;
        const uint32_t src_bytes = slot >= 0 ? 16 : 0;
        slot = slot_of(it + 2);
        sm90::mbar_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
#pragma unroll 4
        for (int i = 0; i < kChunksPerRow / kLoadersPerRow; ++i) {
          const int c = half + kLoadersPerRow * i;
          // Rows past the split are zero-filled: P is 0 there, and 0 · garbage could be NaN.
          cp_async_16(dst + swizzled(row, c), src + c * 8, src_bytes);
        }
        sm90::cp_async_arrive_noinc(&full[stage]);
      };
      for (int it = 0; it < num_tiles; it += 2) {
        produce(it, slot_even);
        if (it + 1 < num_tiles) produce(it + 1, slot_odd);
      }
    }
    return;
  }

  sm90::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, ctid = tid - kProducerThreads, warp = (ctid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c2 = (lane % 4) * 2, row0 = warp * 16 + g;  // this thread's heads: row0, row0 + 8
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  // l_run sums this thread's columns of this warpgroup's rows only; reduced at the end.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kMlaLog2e;
  const uint32_t q_addr = sm90::smem_u32(q_s), p_addr = sm90::smem_u32(p_s);
  // Rows row0 and row0 + 8's score scale: the softmax scale in log2 units,
  // times (FP8 cache) the inverse of the power of two Q's row was scaled by.
  float row_scale[2] = {scale_log2, scale_log2};
  if constexpr (kFp8) {
    // Q in the tile as f16 in the c_kv dims (which meet the cache widened
    // to f16) and bf16 in the rope dims (which meet k_pe as stored), each
    // head row times the power of two that puts its largest |value| in
    // [2^14, 2^15): f16's range then holds any row at full precision.
    // Converted in place from the bf16 rows the producer copied, a quad of
    // threads a row (thread q of the quad: chunks q, q + 4, ...), in two
    // passes over shared memory: the row's maximum, then the conversion.
    float* q_unscale = x_s + 3 * 2 * 64;
    const int q_row = ctid / 4, quarter = ctid % 4;
    constexpr int kQuarterChunks = kChunksPerRow / 4;
    static_assert(kChunksPerRow % 4 == 0 && kConsumerThreads == 4 * kMlaWideHeads, "a quad a Q row");
    sm90::mbar_wait(q_full, 0);
    __nv_bfloat162 max2 = __float2bfloat162_rn(0.0f);
#pragma unroll 6
    for (int i = 0; i < kQuarterChunks; ++i) {
      const uint4 raw = *reinterpret_cast<const uint4*>(q_s + swizzled(q_row, quarter + 4 * i));
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) max2 = __hmax2(max2, __habs2(h[k]));
    }
    float amax = fmaxf(__low2float(max2), __high2float(max2));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int e = 0;
    frexpf(amax, &e);
    const float scale = amax > 0.0f && amax <= FLT_MAX ? ldexpf(1.0f, min(15 - e, 64)) : 1.0f;
#pragma unroll 6
    for (int i = 0; i < kQuarterChunks; ++i) {
      const int chunk = quarter + 4 * i;
      uint4* at = reinterpret_cast<uint4*>(q_s + swizzled(q_row, chunk));
      uint4 raw = *at;
      uint32_t* w = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
        if (chunk < kL / 8) {
          const __half2 h = __floats2half2_rn(f.x * scale, f.y * scale);
          w[k] = *reinterpret_cast<const uint32_t*>(&h);
        } else {
          w[k] = pack_bf16x2(f.x * scale, f.y * scale);
        }
      }
      *at = raw;
    }
    if (quarter == 0) q_unscale[q_row] = 1.0f / scale;
    sm90::fence_proxy_async_smem();  // wgmma reads Q through the async proxy
    sm90::named_barrier_sync(kConsumerBarrier, kConsumerThreads);
    row_scale[0] *= q_unscale[row0];
    row_scale[1] *= q_unscale[row0 + 8];
  }
  // The c_kv dims' operand type (FP8 cache: widened to f16); the rope dims stay bf16.
  constexpr sm90::Mma16 kLatentType = kFp8 ? sm90::Mma16::kF16 : sm90::Mma16::kBf16;
  auto pack_p = [](float a, float b) -> uint32_t {
    if constexpr (kFp8) {
      const __half2 h = __floats2half2_rn(a, b);
      return *reinterpret_cast<const uint32_t*>(&h);
    } else {
      return pack_bf16x2(a, b);
    }
  };

  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % kStages;
    sm90::mbar_wait(&full[stage], (it / kStages) & 1);
    sm90::fence_proxy_async_smem();  // wgmma reads what the producer's copies and stores wrote
    const uint32_t kv_addr = sm90::smem_u32(kv_s + stage * kTileBytes);

    // S{64 heads, this warpgroup's 32 rows}.
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
    sm90::fence_registers(s);
    sm90::wgmma_fence();
#pragma unroll
    for (int blk = 0; blk < kColBlocks; ++blk) {
      const uint64_t da = sm90::wgmma_desc(q_addr + blk * kBlockBytes);
      const uint64_t db = sm90::wgmma_desc(kv_addr + blk * kBlockBytes + cw * 32 * 128);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (blk < kColBlocks - 1)
          sm90::wgmma_m64n32k16<kLatentType>(s, da + 2 * kk, db + 2 * kk, 1);
        else
          sm90::wgmma_m64n32k16<sm90::Mma16::kBf16>(s, da + 2 * kk, db + 2 * kk, 1);
      }
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_registers(s);

    const int col0 = begin + it * kRows + cw * 32;  // kv index of this warpgroup's first column
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int col = col0 + (i / 4) * 8 + c2 + (i % 2);
      s[i] = col < end ? s[i] * row_scale[(i / 2) % 2] : -INFINITY;
      mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], s[i]);
    }
    // Row maxima by tile parity: a warpgroup writes tile it + 2's only after
    // the other has passed tile it + 1's first barrier, long after reading these.
    float* x_tile = x_s + (it % 2) * 128;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (lane % 4 == 0) x_tile[cw * 64 + row0 + 8 * r] = mx[r];
    }
    // Both warpgroups are past this barrier only once both finished tile
    // it - 1's P·V: P may be rewritten.
    sm90::named_barrier_sync(kConsumerBarrier, kConsumerThreads);
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // Both warpgroups reach the same maximum; finite, as the tile's first row is valid.
      const float m_new = fmaxf(m_run[r], fmaxf(mx[r], x_tile[(1 - cw) * 64 + row0 + 8 * r]));
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
      const int col = cw * 32 + nt * 8 + c2;  // P tile column (kv row of the tile)
      *reinterpret_cast<uint32_t*>(p_s + swizzled(row0, col / 8) + (col % 8) * 2) = pack_p(p0, p1);
      *reinterpret_cast<uint32_t*>(p_s + swizzled(row0 + 8, col / 8) + (col % 8) * 2) = pack_p(p2, p3);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
    sm90::fence_proxy_async_smem();  // P, written by both warpgroups, is read by wgmma
    sm90::named_barrier_sync(kConsumerBarrier, kConsumerThreads);

#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    // O{64 heads, dims [256 cw, +256)} += P{64, 64} · c_kv{64 rows, those dims}.
    sm90::fence_registers(o);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t da = sm90::wgmma_desc(p_addr) + 2 * kk;
      const uint64_t db = sm90::wgmma_desc_mn(kv_addr + 4 * cw * kBlockBytes + kk * 16 * 128, kBlockBytes);
      sm90::wgmma_m64n256k16<kLatentType, 1>(o, da, db, 1);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_registers(o);
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(&empty[stage]);  // this warp is done with the stage
  }
  // Dependents (the split merge) may launch now; they wait for this grid's
  // completion and memory before reading anything.
  grid_dependents_launch();

  // Row sums: the quad's columns, then both warpgroups' halves.
  float* l_s = x_s + 2 * 128;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (lane % 4 == 0) {
    l_s[cw * 64 + row0] = l_run[0];
    l_s[cw * 64 + row0 + 8] = l_run[1];
  }
  sm90::named_barrier_sync(kConsumerBarrier, kConsumerThreads);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const float l = l_s[row] + l_s[64 + row], inv = 1.0f / l;
    const int64_t th = int64_t(t) * H + h0 + row;
    if (p.num_splits == 1) {
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<__nv_bfloat162*>(p.out + th * kL + cw * 256 + j * 8 + c2) =
            __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    } else {
      const int64_t sth = int64_t(split) * p.num_tokens * H + th;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(p.partial_out + sth * kL + cw * 256 + j * 8 + c2) =
            make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      if (cw == 0 && lane % 4 == 0) p.partial_lse[sth] = m_run[r] + log2f(l);
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
                                        int(kSmemBytes)),
                   "mla_attention_absorbed (sm90)");
    attribute_set = true;
  }
  const dim3 grid(p.num_splits, p.num_heads / kMlaWideHeads, p.num_tokens);
  mla_absorbed_sm90_kernel<kFp8><<<grid, kThreads, kSmemBytes, stream>>>(p);
  check_launch("mla_attention_absorbed (sm90)");
}

}  // namespace

void launch_mla_absorbed_sm90(const MlaAbsorbedParams& p, cudaStream_t stream) {
  if (p.fp8_cache) launch<true>(p, stream);
  else launch<false>(p, stream);
}

}  // namespace mlaserve::cuda

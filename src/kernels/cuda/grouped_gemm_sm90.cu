#include "kernels/cuda/grouped_gemm_sm90.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/grouped_gemm_sm90.cuh"
#include "kernels/cuda/moe_align.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tma_map.h"

namespace mlaserve::cuda {
namespace {

using sm90::fence_registers;
using sm90::mbar_arrive;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_wait;
using sm90::smem_u32;
using sm90::tma_load_2d;
using sm90::wgmma_desc;

// Every shared-memory tile row is 128 bytes (64 bf16 or 128 e4m3 values of
// K), the width of the 128-byte swizzle; weight tiles load as 64-row pieces.
constexpr int kRowBytes = 128, kPieceRows = 64;

// bf16, 128 x 256 tiles; the consumer warpgroups split the rows (64 x 256
// each, one m64n256k16 per 16 of K). 4 stages of 48 KB.
struct Bf16Rows128 {
  static constexpr bool kFp8 = false, kSplitM = true;
  static constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 64, kStages = 4, kConsumers = 2;
};

// bf16, 64 x 256 tiles; the consumer warpgroups split the columns (64 x 128
// each, m64n128k16): half the padding of experts' row runs. 5 stages of 40 KB.
struct Bf16Rows64 {
  static constexpr bool kFp8 = false, kSplitM = false;
  static constexpr int kBlockM = 64, kBlockN = 256, kBlockK = 64, kStages = 5, kConsumers = 2;
};

// bf16, 192 x 256 tiles walking runs of one to three of an expert's 64-row
// blocks (GemmArgs::row_units, as Fp8Rows192): each weight tile of an expert
// is read once for up to 192 of its rows instead of once per 128-row tile.
// The consumer warpgroups split the columns and each holds all three 64-row
// sets (3 x 64 x 128, 192 accumulators a thread): three warpgroups of 64 x
// 256 would need 128 accumulators a thread, past the 128 registers a
// 512-thread block may start with. 4 stages of 56 KB.
struct Bf16Rows192 {
  static constexpr bool kFp8 = false, kSplitM = false;
  static constexpr int kBlockM = 192, kBlockN = 256, kBlockK = 64, kStages = 4, kConsumers = 2;
};

// fp8, 64 x 256 tiles; the consumer warpgroups split the columns (64 x 128
// each), since the per-block promotion holds two or three accumulator sets
// (partials and totals). 64-row blocks also halve the padding of experts'
// row runs. 5 stages of 40.25 KB. kOverlapPromotion: two partial sets, so
// block k is scaled and added while block k + 1 is on the tensor cores
// (5-7% faster on V3 shapes; needs an even number of K blocks).
template <bool kOverlap>
struct Fp8Tiles {
  static constexpr bool kFp8 = true, kSplitM = false, kOverlapPromotion = kOverlap;
  static constexpr int kBlockM = 64, kBlockN = 256, kBlockK = 128, kStages = 5, kConsumers = 2;
};

// fp8 for dense GEMMs, 128 x 128 tiles; the consumer warpgroups split the
// rows (64 x 128 each, the same wgmma shape): a fifth fewer bytes from L2 per
// product than 64 x 256. 6 stages of 32.5 KB.
template <bool kOverlap>
struct Fp8Rows128 {
  static constexpr bool kFp8 = true, kSplitM = true, kOverlapPromotion = kOverlap;
  static constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 128, kStages = 6, kConsumers = 2;
};

// fp8 for dense GEMMs, 128 x 192 tiles (each consumer warpgroup 64 x 192,
// m64n192k32): a sixth fewer bytes from L2 per product than 128 x 128.
// Partials and totals take 192 registers a thread, so the promotion is
// serial, the warpgroups taking turns on the tensor cores. The fastest own
// tile at M = 4096 on 7 of 8 V3 shapes (H100, perf.md session 19), still
// 8-22% slower than cuBLASLt (kv_a even), so only on request. The plan's
// overlap flag does not apply to it. 5 stages of 40.5 KB.
struct Fp8Rows128Wide {
  static constexpr bool kFp8 = true, kSplitM = true, kOverlapPromotion = false;
  static constexpr int kBlockM = 128, kBlockN = 192, kBlockK = 128, kStages = 5, kConsumers = 2;
};

// fp8, 192 x 128 tiles over three consumer warpgroups (64 x 128 each, one
// partial set: 160 registers a thread). For the MoE a unit is a run of one
// to three of an expert's 64-row blocks (GemmArgs::row_units), so each
// weight tile of an expert crosses from DRAM once for all its rows instead
// of once per 64-row tile; a warpgroup whose rows are past the run skips
// its products. 5 stages of 40.75 KB.
struct Fp8Rows192 {
  static constexpr bool kFp8 = true, kSplitM = true, kOverlapPromotion = false;
  static constexpr int kBlockM = 192, kBlockN = 128, kBlockK = 128, kStages = 5, kConsumers = 3;
};

template <class T>
constexpr int threads_of() {
  return 128 * (1 + T::kConsumers);
}

// 64-row sets each consumer warpgroup holds: all of the tile's rows when
// the warpgroups split the columns, else its own 64.
template <class T>
constexpr int row_sets_of() {
  return T::kSplitM ? 1 : T::kBlockM / 64;
}

template <class T>
constexpr bool serial_fp8_promotion() {
  if constexpr (T::kFp8)
    return !T::kOverlapPromotion;
  else
    return false;
}

static_assert(Fp8Tiles<false>::kBlockM == kSm90Fp8BlockM, "the MoE align step pads to the fp8 row tile");

template <class T>
struct Layout {
  static constexpr int kWarpN = T::kSplitM ? T::kBlockN : T::kBlockN / 2;  // columns per consumer warpgroup
  static constexpr int kAccum = kWarpN / 2;                                // f32 accumulators per thread
  static constexpr int kABytes = T::kBlockM * kRowBytes;
  static constexpr int kWBytes = T::kBlockN * kRowBytes;
  static constexpr int kScaleBytes = T::kFp8 ? T::kBlockM * 4 : 0;
  static constexpr int kStageBytes = kABytes + kWBytes + kScaleBytes;
  // + barriers + slack to align the base to 1024 bytes (the swizzle atom).
  static constexpr int kSmemBytes = T::kStages * kStageBytes + 2 * T::kStages * 8 + 1024;
  static_assert(kScaleBytes % 128 == 0 || kScaleBytes == 0, "scale tiles keep 128-byte alignment");
};

enum class Epilogue {
  kStore,             // out[r, c] = acc
  kSiluInterleaved8,  // weight rows interleave gate/up by 8 (moe_experts.h): out = silu(gate) * up
  kSiluHalves,        // weight rows: gate rows, then up rows at up_offset: out = silu(gate) * up
};

struct GemmArgs {
  const int32_t* block_expert = nullptr;  // group of each kBlockM-row block; null: one group
  const int32_t* rows_in_use = nullptr;   // {1}: rows to compute; null: m
  // Fp8Rows192 MoE: unit i covers row_units[i] % 4 64-row blocks from block
  // row_units[i] / 4, all one expert's (moe_align_kernel); *num_row_units units.
  const int32_t* row_units = nullptr;
  const int32_t* num_row_units = nullptr;
  int m = 0, k = 0;
  int n_out = 0;      // columns of out
  int w_rows = 0;     // rows of one group's weight
  int up_offset = 0;  // kSiluHalves: first up row of a group's weight
  const float* w_scale = nullptr;  // fp8: {groups, w_scale_rows, k / 128}
  int w_scale_rows = 0;
  __nv_bfloat16* out = nullptr;
  int64_t out_ld = 0;
  // Or, for kSiluHalves on the 64 x 256 fp8 tiles (whose 128 output columns
  // are one 1x128 group): the rows quantized as quantize_rows_kernel would
  // quantize out's bf16 rows, e4m3 out_ld bytes apart and the scale of row r,
  // group g at out_scale[g * out_scale_ld + r].
  uint8_t* out_q = nullptr;
  float* out_scale = nullptr;
  int64_t out_scale_ld = 0;
  // ASource::kQuantize: A is bf16 rows x_bf16 + row * x_ld (m <= kSm90QuantizeMaxRows).
  const __nv_bfloat16* x_bf16 = nullptr;
  int64_t x_ld = 0;
  // Gathering kernels (ASource::kGather) read A row m from row gather_ids[m] /
  // gather_div of gather_src (rows gather_ld bytes apart; zeros where
  // gather_ids[m] == gather_sentinel), fp8 scales from
  // gather_scale[kb * gather_scale_ld + that row].
  const int32_t* gather_ids = nullptr;
  int gather_div = 1, gather_sentinel = 0;
  const void* gather_src = nullptr;
  int64_t gather_ld = 0;
  const float* gather_scale = nullptr;
  int64_t gather_scale_ld = 0;
  // Split K (kStore only): each output tile is k_splits work units, unit s
  // covering K blocks [s * kb / k_splits, (s + 1) * kb / k_splits) and
  // storing its f32 sums at partials[(s * m + row) * n_out + col];
  // split_k_sum_kernel adds them in split order.
  int k_splits = 1;
  float* partials = nullptr;
};

// Consecutive tiles walk the columns of a band of band_size row tiles (kBand
// for single CTAs; pairs use bands of one, see sm90_gemm_kernel), so the CTAs
// running at once share a few weight tiles and a few A row blocks in L2.
constexpr int kBand = 16;

__device__ __forceinline__ void tile_coords(int tile, int m_blocks, int n_tiles, int band_size, int& mb, int& nb) {
  const int band = tile / (band_size * n_tiles), in_band = tile % (band_size * n_tiles);
  const int band_rows = min(band_size, m_blocks - band * band_size);
  nb = in_band / band_rows;
  mb = band * band_size + in_band % band_rows;
}

// A CTA's piece of work: output tile (mb, nb), K blocks [kb_begin, kb_end).
// The splits of a tile are adjacent units. row0: the tile's first row;
// group: its weight group; consumers: the consumer warpgroups with rows.
struct WorkUnit {
  int mb, nb, split, kb_begin, kb_end;
  int row0 = 0, group = 0, consumers = 0;
};

__device__ __forceinline__ WorkUnit work_unit(int unit, int m_blocks, int n_tiles, int k_blocks, int k_splits,
                                              int band_size = kBand) {
  WorkUnit u;
  u.split = unit % k_splits;
  tile_coords(unit / k_splits, m_blocks, n_tiles, band_size, u.mb, u.nb);
  u.kb_begin = u.split * k_blocks / k_splits;
  u.kb_end = (u.split + 1) * k_blocks / k_splits;
  return u;
}

template <class T, Epilogue kEpi>
__host__ __device__ constexpr int n_tiles_of(int n_out) {
  return kEpi == Epilogue::kStore ? (n_out + T::kBlockN - 1) / T::kBlockN : n_out / (T::kBlockN / 2);
}

// First row, within its group's weight, of 64-row piece q of column tile nb.
template <class T, Epilogue kEpi>
__device__ __forceinline__ int piece_row(const GemmArgs& args, int nb, int q) {
  if constexpr (kEpi == Epilogue::kSiluHalves)
    return nb * (T::kBlockN / 2) + (q / 2) * kPieceRows + (q % 2) * args.up_offset;
  else
    return nb * T::kBlockN + q * kPieceRows;
}

// Quad (4 lanes) transpose of 32-bit words: lane q holds w_i = its two
// columns (2q, 2q + 1) of 8-column group i; returns, for lane q, group q's
// 8 columns (the words of lanes 0..3). Round r: lane q reads lane
// (q + r) % 4's word for group q. All 32 lanes must call it.
__device__ __forceinline__ uint4 quad_transpose(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int lane) {
  const int q = lane & 3;
  uint32_t got[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int give = (q - r) & 3;  // the group of the lane that reads this one in round r
    const uint32_t send = give == 0 ? w0 : give == 1 ? w1 : give == 2 ? w2 : w3;
    got[r] = __shfl_sync(0xffffffffu, send, (lane & ~3) | ((q + r) & 3));
  }
  // Word p (columns 2p, 2p + 1) came from lane p, in round (p - q) % 4.
  auto word = [&](int p) {
    const int r = (p - q) & 3;
    return r == 0 ? got[0] : r == 1 ? got[1] : r == 2 ? got[2] : got[3];
  };
  return make_uint4(word(0), word(1), word(2), word(3));
}

// Where the A tiles come from:
//  - kTma: TMA boxes of an e4m3 A (and its scales);
//  - kGather: the producer warpgroup copies the A rows itself (cp.async into
//    the swizzled layout, 16 bytes a thread, a warp covering 4 whole rows),
//    so the MoE needs no expert-ordered copy of x; weights still come by TMA;
//  - kQuantize (fp8, at most kSm90QuantizeMaxRows rows, one a half-warp): the producer warpgroup
//    reads bf16 rows and quantizes them 1x128 as fp8_quant.h does, each
//    half-warp one row's 128-wide group of the K block, so a decode linear
//    needs no quantization kernel before it.
enum class ASource { kTma, kGather, kQuantize };

// kCluster 2: CTAs run in clusters of two that take row tiles 2i and 2i + 1
// of the same column tile and K range (a pair unit). When both row tiles
// belong to the same group (always for dense; MoE: the same expert), each
// CTA loads half of every weight tile and the TMA multicasts it into both,
// so a weight tile crosses from L2 once per pair. Each CTA's empty barriers
// then count the consumer warps of both CTAs (a stage is refilled in both
// at once), and a CTA's producer waits for its last stages' releases before
// exiting, so no arrival reaches a CTA that has gone. An odd last row tile
// is paired with a phantom tile past m_blocks whose products are dropped.
// NOTES: the 64-row fp8 MoE tiles read 32 KB of weights for 8 KB of
// activations a stage, and at ~128 rows an expert (V3, 4096 tokens) each
// expert's weights feed 2-3 row tiles: one CTA a tile, gate_up read 13.5 GB
// from DRAM for 7.5 GB of weights (ncu, H200; 3.6 ms), in pairs 11.2 GB
// (3.2 ms). Only the weight stream bounds those tiles, not the tensor cores.
// kClusterSplitK: a dense fp8 tile's K splits run as one cluster of
// k_splits CTAs (split = rank), which add their sums through distributed
// shared memory in the epilogue: no f32 partials in global memory and no sum
// kernel (o_proj at 4 splits on an H100: 49.5 us at 64 rows with them, 41.4
// at one row; perf.md session 24). The grid is one unit a CTA.
template <class T, Epilogue kEpi, ASource kA, int kCluster, bool kClusterSplitK>
__global__ void __launch_bounds__(threads_of<T>(), 1)
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                     const __grid_constant__ CUtensorMap map_a_scale, const GemmArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kCluster == 1 || (kCluster == 2 && kA == ASource::kTma), "pairs take TMA-fed A only");
  static_assert(!kClusterSplitK || (kCluster == 1 && kEpi == Epilogue::kStore && T::kFp8 && T::kConsumers == 2 &&
                                    Layout<T>::kAccum == 64 && T::kStages * Layout<T>::kWBytes >= 65536),
                "cluster split K: dense fp8 tiles of 16 accumulator groups a thread, 64 KB of weight stages");
  static_assert(T::kConsumers == 2 || (T::kConsumers == 3 && T::kSplitM && kCluster == 1 && kA == ASource::kTma),
                "three consumer warpgroups: rows split, one CTA a tile, TMA-fed A");
  constexpr int kSets = row_sets_of<T>();
  static_assert(kSets == 1 || (!T::kFp8 && kCluster == 1 && kA == ASource::kTma),
                "several row sets a warpgroup: bf16 runs of an expert's blocks, TMA-fed A");
  constexpr bool kPair = kCluster == 2;
  constexpr int kThreads = threads_of<T>();
  // The register file split by role: 128 x 40 + 256 x 232, or 128 x 32 + 384 x 160 (= 65536).
  constexpr int kProducerRegs = T::kConsumers == 2 ? 40 : 32, kConsumerRegs = T::kConsumers == 2 ? 232 : 160;
  using L = Layout<T>;
  constexpr int kStages = T::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* a_smem = smem;
  uint8_t* w_smem = a_smem + kStages * L::kABytes;
  float* scale_smem = reinterpret_cast<float*>(w_smem + kStages * L::kWBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(scale_smem) + kStages * L::kScaleBytes);
  uint64_t* empty = full + kStages;

  constexpr bool kGatherA = kA == ASource::kGather, kProducerWrites = kA != ASource::kTma;
  const int warpgroup = threadIdx.x / 128;
  // Cluster split K: [0] counts the other ranks' "my stages are free", [1] the bytes they send.
  __shared__ uint64_t split_bars[2];
  if constexpr (kA == ASource::kQuantize) {
    // Rows past m stay zero (with zero scales): their products are never stored.
    for (int i = threadIdx.x; i < kStages * (L::kABytes + L::kScaleBytes) / 16; i += kThreads) {
      uint8_t* p = i < kStages * L::kABytes / 16 ? a_smem + 16 * i
                                                 : reinterpret_cast<uint8_t*>(scale_smem) + 16 * i - kStages * L::kABytes;
      *reinterpret_cast<uint4*>(p) = make_uint4(0, 0, 0, 0);
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // The TMA thread's arrival, plus every producer thread's when they write A (gather: cp.async; quantize).
      sm90::mbar_init(&full[s], kProducerWrites ? 1 + 128 : 1);
      // One arrival per consumer warp (of both CTAs in pairs).
      sm90::mbar_init(&empty[s], (kPair ? 2 : 1) * T::kConsumers * 4);
    }
    if constexpr (kClusterSplitK) {
      sm90::mbar_init(&split_bars[0], args.k_splits - 1);
      sm90::mbar_init(&split_bars[1], 1);
    }
    sm90::mbar_init_fence();
    sm90::tma_prefetch_map(&map_w);
    if constexpr (kA == ASource::kTma) {
      sm90::tma_prefetch_map(&map_a);
      if constexpr (T::kFp8) sm90::tma_prefetch_map(&map_a_scale);
    }
  }
  if constexpr (kPair || kClusterSplitK)
    sm90::cluster_sync();
  else
    __syncthreads();
  const uint32_t rank = kPair || kClusterSplitK ? sm90::cluster_ctarank() : 0;

  const int rows = args.rows_in_use ? *args.rows_in_use : args.m;
  const int m_blocks = (rows + T::kBlockM - 1) / T::kBlockM;
  // Row tiles (pairs, runs of an expert's blocks) the units walk.
  const int m_tiles = args.row_units ? *args.num_row_units : kPair ? (m_blocks + 1) / 2 : m_blocks;
  const int n_tiles = n_tiles_of<T, kEpi>(args.n_out);
  const int k_blocks = args.k / T::kBlockK, units = m_tiles * n_tiles * args.k_splits;
  const int first_unit = kPair ? blockIdx.x / 2 : blockIdx.x, unit_stride = kPair ? gridDim.x / 2 : gridDim.x;
  // MoE pairs walk row-major (a band of one pair row): each wave of units
  // then streams whole experts' weights, every tile of them once. Measured on
  // the fp8 MoE at 4096 tokens (H200): bands of 1 / 4 / 8 / 16 / 32 pair rows
  // 503 / 499 / 497 / 487 / 470 TFLOP/s. Dense pairs walk bands of kBand row
  // tiles as single CTAs do: row-major, a wave streams the whole weight
  // matrix (117 MB at o_proj) once for every pair row.
  // Group of row tile mb (a phantom tile takes its partner's).
  auto group_of = [&](int mb) { return args.block_expert ? args.block_expert[min(mb, m_blocks - 1)] : 0; };
  // Runs of an expert's blocks walk row-major too: the CTAs running at once
  // then read each weight tile once and share a few A runs in L2.
  auto unit_at = [&](int unit) {
    const int band = args.row_units || (kPair && args.block_expert) ? 1 : kPair ? kBand / 2 : kBand;
    WorkUnit u = work_unit(unit, m_tiles, n_tiles, k_blocks, args.k_splits, band);
    if constexpr (kPair) u.mb = 2 * u.mb + int(rank);
    u.consumers = T::kConsumers;
    if (args.row_units) {
      const int packed = args.row_units[u.mb], block = packed / 4;
      u.row0 = block * kPieceRows;
      u.group = args.block_expert[block];
      u.consumers = packed % 4;
    } else {
      u.row0 = u.mb * T::kBlockM;
      u.group = group_of(u.mb);
      // Warpgroups whose 64 rows are all past m skip their products (a
      // cluster split's ranks exchange every warpgroup's sums, so not there).
      if constexpr (T::kSplitM && !kClusterSplitK) u.consumers = min(T::kConsumers, (rows - u.row0 + 63) / 64);
    }
    return u;
  };
  // Whether the pair of unit u reads one weight tile (see kCluster).
  auto pair_shares_weights = [&](const WorkUnit& u) {
    const int mb0 = u.mb & ~1;
    return kPair && group_of(mb0) == group_of(mb0 + 1);
  };
  // Weight tile rows of unit u's K block kb into stage st: all of them, or
  // (shared) the pieces of this CTA's parity, multicast to both CTAs.
  auto load_weights = [&](int st, const WorkUnit& u, int w_row0, int kb, bool shared) {
#pragma unroll
    for (int q = 0; q < T::kBlockN / kPieceRows; ++q) {
      uint8_t* dst = w_smem + st * L::kWBytes + q * kPieceRows * kRowBytes;
      const int row = w_row0 + piece_row<T, kEpi>(args, u.nb, q);
      if (!shared)
        tma_load_2d(dst, &map_w, &full[st], kb * T::kBlockK, row);
      else if (q % 2 == int(rank))
        sm90::tma_load_2d_multicast(dst, &map_w, &full[st], kb * T::kBlockK, row, 0x3);
    }
  };
  pdl_launch_dependents();

  if (kA == ASource::kQuantize && warpgroup == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    const int hw = threadIdx.x / 16, j = threadIdx.x % 16;  // row hw of the tile; elements 8j..8j+7 of a K block
    // Thread 0 requests the first stages' weights before waiting for the
    // kernel that wrote x (as the TMA producer below); every thread counts them.
    int early = 0;
    if (first_unit < units) {
      const WorkUnit u = unit_at(first_unit);
      early = min(kStages, u.kb_end - u.kb_begin);
      if (threadIdx.x == 0)
        for (int st = 0; st < early; ++st) {
          mbar_arrive_expect_tx(&full[st], L::kWBytes);
          load_weights(st, u, 0, u.kb_begin + st, false);
        }
    }
    pdl_wait();
    const __nv_bfloat16* x_row = args.x_bf16 + int64_t(hw) * args.x_ld + 8 * j;
    const bool real = hw < args.m;
    // Lane j's 8 bytes in the 128B-swizzled row hw: 16-byte chunk j / 2, half j % 2.
    const int a_offset = hw * kRowBytes + ((j / 2) ^ (hw & 7)) * 16 + (j & 1) * 8;
    int stage = 0, issued = 0;
    uint32_t phase = 0;
    // x comes from L2 one K block at a time; two blocks' loads stay in
    // flight so their latency does not pace the stages.
    auto load_x = [&](int kb, int kb_end) {
      Bf16x8 r;
      *reinterpret_cast<uint4*>(&r) = make_uint4(0, 0, 0, 0);
      if (real && kb < kb_end) r = Bf16x8::load(x_row + int64_t(kb) * kFp8Group);
      return r;
    };
    for (int unit = first_unit; unit < units; unit += unit_stride) {
      const WorkUnit u = unit_at(unit);
      Bf16x8 x_cur = load_x(u.kb_begin, u.kb_end), x_next = load_x(u.kb_begin + 1, u.kb_end);
      for (int kb = u.kb_begin; kb < u.kb_end; ++kb, ++issued) {
        float v[8];
        x_cur.to_float(v);
        x_cur = x_next;
        x_next = load_x(kb + 2, u.kb_end);
        if (issued >= early) {
          mbar_wait(&empty[stage], phase ^ 1);
          if (threadIdx.x == 0) {
            mbar_arrive_expect_tx(&full[stage], L::kWBytes);
            load_weights(stage, u, 0, kb, false);
          }
        }
        const QuantizedGroupPart part = quantize_group_16lanes(v);  // the whole warp together
        if (real) {
          *reinterpret_cast<uint2*>(a_smem + stage * L::kABytes + a_offset) = part.q;
          if (j == 0) scale_smem[stage * T::kBlockM + hw] = part.scale;
          sm90::fence_proxy_async_smem();  // the wgmma reads these bytes through the async proxy
        }
        mbar_arrive(&full[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }
  if (kGatherA && warpgroup == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    pdl_wait();  // the row ids and x come from earlier kernels
    // Thread t copies 16-byte chunk t % 8 of rows t / 8 + 16 i.
    constexpr int kRowsPerThread = T::kBlockM / 16;
    const int chunk = threadIdx.x % 8, row0 = threadIdx.x / 8;
    const uint8_t* src_base = static_cast<const uint8_t*>(args.gather_src) + chunk * 16;
    int stage = 0;
    uint32_t phase = 0;
    for (int unit = first_unit; unit < units; unit += unit_stride) {
      const WorkUnit u = unit_at(unit);
      const int w_row0 = u.group * args.w_rows;
      int src_row[kRowsPerThread];  // -1: pad row
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int id = args.gather_ids[u.row0 + row0 + 16 * i];
        src_row[i] = id == args.gather_sentinel ? -1 : id / args.gather_div;
      }
      for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
        mbar_wait(&empty[stage], phase ^ 1);
        if (threadIdx.x == 0) {
          mbar_arrive_expect_tx(&full[stage], L::kWBytes);
          load_weights(stage, u, w_row0, kb, false);
        }
        const uint32_t a_dst = smem_u32(a_smem + stage * L::kABytes) + ((chunk ^ (row0 & 7)) * 16);
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          const int r = row0 + 16 * i;  // r % 8 == row0 % 8: the same swizzled chunk
          const bool real = src_row[i] >= 0;
          const int64_t src_row_i = real ? src_row[i] : 0;
          sm90::cp_async_16(a_dst + r * kRowBytes, src_base + src_row_i * args.gather_ld + kb * kRowBytes,
                            real ? 16 : 0);
          if constexpr (T::kFp8) {
            if (chunk == 0)
              sm90::cp_async_4(smem_u32(scale_smem + stage * T::kBlockM + r),
                               args.gather_scale + int64_t(kb) * args.gather_scale_ld + src_row_i, real ? 4 : 0);
          }
        }
        sm90::cp_async_arrive_noinc(&full[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }
  if (warpgroup == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    // A dense GEMM's weights depend on no earlier kernel: the first unit's
    // first stages of weights are requested before waiting for the kernel
    // that wrote A, so that wait overlaps the weight stream's start (PDL).
    int early = 0;
    if (!args.block_expert && first_unit < units) {
      const WorkUnit u = unit_at(first_unit);
      early = min(kStages, u.kb_end - u.kb_begin);
      for (int st = 0; st < early; ++st) {
        mbar_arrive_expect_tx(&full[st], L::kStageBytes);
        load_weights(st, u, 0, u.kb_begin + st, kPair);
      }
    }
    pdl_wait();
    int stage = 0, issued = 0;
    uint32_t phase = 0;
    for (int unit = first_unit; unit < units; unit += unit_stride) {
      const WorkUnit u = unit_at(unit);
      const int w_row0 = u.group * args.w_rows;
      const bool shared = pair_shares_weights(u);
      for (int kb = u.kb_begin; kb < u.kb_end; ++kb, ++issued) {
        if (issued >= early) {
          mbar_wait(&empty[stage], phase ^ 1);
          mbar_arrive_expect_tx(&full[stage], L::kStageBytes);
          load_weights(stage, u, w_row0, kb, shared);
        }
        tma_load_2d(a_smem + stage * L::kABytes, &map_a, &full[stage], kb * T::kBlockK, u.row0);
        if constexpr (T::kFp8) tma_load_2d(scale_smem + stage * T::kBlockM, &map_a_scale, &full[stage], u.row0, kb);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    if constexpr (kPair) {
      // The partner's consumers arrive on these barriers: wait until every
      // stage's last fill was released by both CTAs before this CTA exits.
      for (int i = 0; i < kStages; ++i) {
        mbar_wait(&empty[stage], phase ^ 1);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }

  sm90::setmaxnreg_inc<kConsumerRegs>();
  const int wg = warpgroup - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // The loop's shared addresses as 32-bit shared-window offsets, and the
  // wgmma descriptors' low words (sm90::kWgmmaDescHi is the high one): stage
  // st's tiles are kABytes / kWBytes further on, 16 bytes a unit.
  const uint32_t a_desc = sm90::wgmma_desc_lo(smem_u32(a_smem) + (T::kSplitM ? wg * 64 * kRowBytes : 0));
  const uint32_t w_desc = sm90::wgmma_desc_lo(smem_u32(w_smem) + (T::kSplitM ? 0 : wg * L::kWarpN * kRowBytes));
  const uint32_t full_s = smem_u32(full), empty_s = smem_u32(empty), scale_s = smem_u32(scale_smem);
  pdl_wait();  // the epilogue overwrites what earlier kernels may still read
  // Releases a stage to the producer (in pairs: to both CTAs' producers), once a warp.
  auto release = [&](int st) {
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(empty_s + 8 * st);
      if constexpr (kPair) sm90::mbar_arrive_cluster(&empty[st], rank ^ 1);
    }
  };
  // Serial promotion on warpgroups that split a tile's rows: they take turns
  // issuing each K block's products, warpgroup w after w - 1 (named barrier
  // 2 + w), so the others promote while one's products run. A warpgroup with
  // no rows in a unit still takes its turns. (Column-split 64 x 256 tiles
  // measured slower with turns.)
  constexpr bool kOrderedIssue = serial_fp8_promotion<T>() && T::kSplitM;
  int turns = 0;
  auto take_turn = [&] {
    if constexpr (kOrderedIssue)
      if (wg != 0 || turns > 0) sm90::named_barrier_sync(2 + wg, 256);
  };
  auto pass_turn = [&] {
    if constexpr (kOrderedIssue) {
      sm90::named_barrier_arrive(2 + (wg + 1) % T::kConsumers, 256);
      ++turns;
    }
  };
  int stage = 0;
  uint32_t phase = 0;
  int epilogues = 0;  // units this warpgroup has stored (the quantizing epilogue's buffer parity)
  for (int unit = first_unit; unit < units; unit += unit_stride) {
    const WorkUnit u = unit_at(unit);
    const int mb = u.mb, nb = u.nb;
    if (T::kSplitM && wg >= u.consumers) {
      // No rows of this warpgroup in the unit: it only passes the stages on.
      for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
        mbar_wait(full_s + 8 * stage, phase);
        take_turn();
        pass_turn();
        release(stage);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      continue;
    }
    // Row sets with rows in this unit (a run of fewer blocks than the tile leaves the last ones out).
    const int sets = kSets == 1 ? 1 : u.consumers;
    float acc_sets[kSets][L::kAccum];
    float(&acc)[L::kAccum] = acc_sets[0];
#pragma unroll
    for (int h = 0; h < kSets; ++h)
#pragma unroll
      for (int i = 0; i < L::kAccum; ++i) acc_sets[h][i] = 0.0f;

    if constexpr (!T::kFp8) {
      // Each K block's products stay in flight while the next block's are
      // issued; a stage is released once the products reading it are done.
      int prev_stage = 0;
#pragma unroll
      for (int h = 0; h < kSets; ++h) fence_registers(acc_sets[h]);
      // One K block's products for the first kN row sets (straight-line
      // wgmmas: a branch between them makes ptxas fence each one).
      auto issue = [&]<int kN>(uint32_t da, uint32_t dw) {
        sm90::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < T::kBlockK / 16; ++kk) {
          const uint64_t w = sm90::wgmma_desc_of(dw + 2 * kk);
#pragma unroll
          for (int h = 0; h < kN; ++h) {
            // Set h's rows start 64 rows (8 KB, 512 descriptor units) further on.
            const uint64_t a = sm90::wgmma_desc_of(da + 2 * kk + h * (64 * kRowBytes >> 4));
            if constexpr (L::kWarpN == 256)
              sm90::wgmma_m64n256k16<sm90::Mma16::kBf16>(acc_sets[h], a, w, 1);
            else
              sm90::wgmma_m64n128k16_bf16(acc_sets[h], a, w, 1);
          }
        }
        sm90::wgmma_commit();
      };
      static_assert(kSets == 1 || kSets == 3, "one or three row sets");
      for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
        mbar_wait(full_s + 8 * stage, phase);
        if constexpr (kProducerWrites) sm90::fence_proxy_async_smem();
        const uint32_t da = a_desc + stage * (L::kABytes >> 4), dw = w_desc + stage * (L::kWBytes >> 4);
        if constexpr (kSets == 1) {
          issue.template operator()<1>(da, dw);
        } else {
          if (sets == 1)
            issue.template operator()<1>(da, dw);
          else if (sets == 2)
            issue.template operator()<2>(da, dw);
          else
            issue.template operator()<3>(da, dw);
        }
        sm90::wgmma_wait<1>();
        if (kb > u.kb_begin) release(prev_stage);
        prev_stage = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int h = 0; h < kSets; ++h) fence_registers(acc_sets[h]);
      if (u.kb_end > u.kb_begin) release(prev_stage);
    } else {
      // Per 128-wide K block: partial = A_q · W_qᵀ on the tensor cores, then
      // acc += partial * a_scale(row) * w_scale(piece), in f32.
      const int group = u.group;
      const int scale_ld = args.k / 128;
      constexpr int kPieces = L::kWarpN / kPieceRows;  // this warpgroup's 64-row weight pieces
      const float* w_scale_piece[kPieces];
#pragma unroll
      for (int h = 0; h < kPieces; ++h) {
        const int piece = (T::kSplitM ? 0 : kPieces * wg) + h;
        const int row_block = min(piece_row<T, kEpi>(args, nb, piece) / 128, args.w_scale_rows - 1);
        w_scale_piece[h] = args.w_scale + (int64_t(group) * args.w_scale_rows + row_block) * scale_ld;
      }
      const int r0 = (T::kSplitM ? wg * 64 : 0) + warp * 16 + lane / 4;  // row within the A tile
      auto issue = [&](float (&part)[L::kAccum], int st) {
        sm90::wgmma_fence();
        const uint32_t da = a_desc + st * (L::kABytes >> 4), dw = w_desc + st * (L::kWBytes >> 4);
#pragma unroll
        for (int kk = 0; kk < T::kBlockK / 32; ++kk) {
          const uint64_t a = sm90::wgmma_desc_of(da + 2 * kk), w = sm90::wgmma_desc_of(dw + 2 * kk);
          if constexpr (L::kWarpN == 192)
            sm90::wgmma_m64n192k32_e4m3(part, a, w, kk > 0 ? 1 : 0);
          else
            sm90::wgmma_m64n128k32_e4m3(part, a, w, kk > 0 ? 1 : 0);
        }
        sm90::wgmma_commit();
      };
      // After the products of `part` are done: read the stage's activation
      // scales, release the stage, add the scaled partial.
      auto promote = [&](float (&part)[L::kAccum], int st, const float (&sw)[kPieces]) {
        fence_registers(part);
        const uint32_t sa = scale_s + 4 * (st * T::kBlockM + r0);
        const float sa0 = sm90::ld_shared_f32(sa), sa1 = sm90::ld_shared_f32(sa + 32);
        release(st);
#pragma unroll
        for (int j = 0; j < L::kAccum / 4; ++j) {
          const float w = sw[j / 8];  // 8-column group j lies in piece j / 8
          const float s0 = sa0 * w, s1 = sa1 * w;
          acc[4 * j + 0] += part[4 * j + 0] * s0;
          acc[4 * j + 1] += part[4 * j + 1] * s0;
          acc[4 * j + 2] += part[4 * j + 2] * s1;
          acc[4 * j + 3] += part[4 * j + 3] * s1;
        }
      };
      // Waits for the next stage (and this warpgroup's turn) and starts its
      // products into `part`; the weight scales of its K block are loaded
      // first (used after the products).
      auto start_block = [&](float (&part)[L::kAccum], int kb, float (&sw)[kPieces]) {
#pragma unroll
        for (int h = 0; h < kPieces; ++h) sw[h] = __ldg(w_scale_piece[h] + kb);
        mbar_wait(full_s + 8 * stage, phase);
        if constexpr (kProducerWrites) sm90::fence_proxy_async_smem();
        const int st = stage;
        take_turn();
        issue(part, st);
        pass_turn();
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
        return st;
      };
      if constexpr (T::kOverlapPromotion) {
        // K blocks in pairs (an even number, >= 2, per unit; the host picks
        // the serial variant otherwise). Each promotion runs while the other
        // partial set is on the tensor cores, and no products are in flight
        // across the loop's back edge (ptxas serializes every wgmma otherwise).
        float part_a[L::kAccum], part_b[L::kAccum], sw_a[kPieces], sw_b[kPieces];
        int st_a = start_block(part_a, u.kb_begin, sw_a);
        int st_b = start_block(part_b, u.kb_begin + 1, sw_b);
        sm90::wgmma_wait<1>();
        promote(part_a, st_a, sw_a);
        sm90::wgmma_wait<0>();
        for (int kb = u.kb_begin + 2; kb < u.kb_end; kb += 2) {
          st_a = start_block(part_a, kb, sw_a);
          promote(part_b, st_b, sw_b);  // block kb - 1, done before the back edge
          st_b = start_block(part_b, kb + 1, sw_b);
          sm90::wgmma_wait<1>();
          promote(part_a, st_a, sw_a);
          sm90::wgmma_wait<0>();
        }
        promote(part_b, st_b, sw_b);
      } else {
        float part[L::kAccum], sw[kPieces];
        for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
          const int st = start_block(part, kb, sw);
          sm90::wgmma_wait<0>();
          promote(part, st, sw);
        }
      }
    }

    if (kPair && mb >= m_blocks) continue;  // a phantom tile: products dropped

    // Epilogue straight from the accumulators: thread holds rows r, r + 8
    // and column pairs 8j + 2(lane % 4) of each 8-column group j; each
    // output group of 8 columns gets one bf16x2 word per lane of the quad.
    constexpr int kGroups = kEpi == Epilogue::kStore ? L::kAccum / 4 : L::kAccum / 8;
    const int row = u.row0 + (T::kSplitM ? wg * 64 : 0) + warp * 16 + lane / 4;
    const int col0 = nb * T::kBlockN + (T::kSplitM ? 0 : wg * L::kWarpN);  // first accumulator column
    const int out_col0 = kEpi == Epilogue::kStore ? col0 : col0 / 2;
    const int quad = lane % 4;
    if constexpr (kEpi == Epilogue::kSiluHalves && T::kFp8 && !T::kSplitM) {
      if (args.out_q) {
        // Each warpgroup holds 64 of the tile's 128 output columns: a row's
        // amax over its quad, then over both warpgroups through shared
        // memory (two buffers by unit parity: a warpgroup one unit ahead
        // writes the other), then quantize_group_16lanes' arithmetic on the
        // bf16 values the other epilogue would store.
        static_assert(L::kWarpN == 128 && T::kConsumers == 2, "two halves of a 1x128 group");
        __shared__ float half_amax[2][2][64];
        constexpr int kHalf = L::kAccum / 8;
        float val[2][kHalf][2];
        float amax[2] = {0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int i = 0; i < kHalf; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float g = acc[4 * i + 2 * h + e], up = acc[4 * (i + kHalf) + 2 * h + e];
              val[h][i][e] = __bfloat162float(__float2bfloat16(g / (1.0f + __expf(-g)) * up));
              amax[h] = fmaxf(amax[h], fabsf(val[h][i][e]));
            }
        const int tile_row = warp * 16 + lane / 4;
        float(&buf)[2][64] = half_amax[epilogues++ & 1];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
          amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
          if (quad == 0) buf[wg][tile_row + 8 * h] = amax[h];
        }
        sm90::named_barrier_sync(1, 256);  // both consumer warpgroups
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = row + 8 * h;
          if (r >= args.m) continue;
          const float sc = fp8_group_scale(fmaxf(buf[0][tile_row + 8 * h], buf[1][tile_row + 8 * h]));
          const float inv = 1.0f / sc;
          uint8_t* q_row = args.out_q + int64_t(r) * args.out_ld + out_col0;
#pragma unroll
          for (int i = 0; i < kHalf; ++i)
            *reinterpret_cast<__nv_fp8x2_storage_t*>(q_row + 8 * i + 2 * quad) =
                pack_e4m3x2(val[h][i][0] * inv, val[h][i][1] * inv);
          if (wg == 0 && quad == 0) args.out_scale[int64_t(nb) * args.out_scale_ld + r] = sc;
        }
        continue;
      }
    }
    if constexpr (kClusterSplitK) {
      // Rank d adds 8-column groups [d G, (d + 1) G) of every thread's
      // accumulators (G = 16 / splits): each CTA sends the other ranks their
      // groups, into their weight stages (idle once every rank's products
      // are done), then adds the ranks' sums in rank order (as
      // split_k_sum_kernel adds splits) and stores its groups. Every CTA
      // waits for all the bytes it is sent, so none exits while another
      // still writes to it.
      constexpr int kAllGroups = L::kAccum / 4;
      const int splits = args.k_splits, per_rank = kAllGroups / splits, ct = threadIdx.x - 128;
      const uint32_t recv = smem_u32(w_smem), ready_s = smem_u32(&split_bars[0]), xchg_s = smem_u32(&split_bars[1]);
      // Group g's sums from rank w land at slot (w, g - owner's first group), 16 bytes a consumer thread.
      auto slot = [&](int w, int g_in_rank) { return uint32_t(((w * per_rank + g_in_rank) * 256 + ct) * 16); };
      sm90::named_barrier_sync(1, 256);  // both consumer warpgroups are done with the stages
      if (ct == 0) {
        mbar_arrive_expect_tx(&split_bars[1], uint32_t((splits - 1) * per_rank * 256 * 16));
        for (int r = 0; r < splits; ++r)
          if (r != int(rank)) sm90::mbar_arrive_remote_release(sm90::cluster_map(ready_s, r));
      }
      sm90::mbar_wait<true>(ready_s, 0);
#pragma unroll
      for (int g = 0; g < kAllGroups; ++g) {
        const int owner = (g * splits) / kAllGroups;
        if (owner != int(rank))
          sm90::st_async_16(sm90::cluster_map(recv + slot(int(rank), g - owner * per_rank), owner),
                            make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]),
                            sm90::cluster_map(xchg_s, owner));
      }
      sm90::mbar_wait<true>(xchg_s, 0);
      const int n_left = args.n_out - col0;
#pragma unroll
      for (int g0 = 0; g0 < kAllGroups; g0 += 4) {
        if ((g0 * splits) / kAllGroups != int(rank)) continue;  // per_rank is 4 or 8: whole quads of groups
        float4 sum[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int g = g0 + i;
          const float4 own = make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]);
          for (int w = 0; w < splits; ++w) {
            float4 v = own;
            if (w != int(rank)) {
              const uint32_t a = recv + slot(w, g - int(rank) * per_rank);
              asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                           : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                           : "r"(a));
            }
            if (w == 0) {
              sum[i] = v;
            } else {
              sum[i].x += v.x;
              sum[i].y += v.y;
              sum[i].z += v.z;
              sum[i].w += v.w;
            }
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t word[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const __nv_bfloat162 packed = h == 0 ? __floats2bfloat162_rn(sum[i].x, sum[i].y)
                                                 : __floats2bfloat162_rn(sum[i].z, sum[i].w);
            word[i] = *reinterpret_cast<const uint32_t*>(&packed);
          }
          const uint4 chunk = quad_transpose(word[0], word[1], word[2], word[3], lane);
          const int r = row + 8 * h;
          if (r < args.m && (g0 + quad) * 8 < n_left)
            *reinterpret_cast<uint4*>(args.out + int64_t(r) * args.out_ld + col0 + (g0 + quad) * 8) = chunk;
        }
      }
      continue;
    }
    if constexpr (kEpi == Epilogue::kStore) {
      if (args.partials) {
        // Split K: this unit's f32 sums; split_k_sum_kernel adds the splits.
        float* part_out = args.partials + int64_t(u.split) * args.m * args.n_out;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = row + 8 * h;
          if (r >= args.m) continue;
#pragma unroll
          for (int j = 0; j < kGroups; ++j) {
            const int c = col0 + 8 * j + 2 * quad;
            if (c < args.n_out)
              *reinterpret_cast<float2*>(part_out + int64_t(r) * args.n_out + c) =
                  make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
          }
        }
        continue;
      }
    }
    // Each row set's rows (a unit's sets past its run have none).
#pragma unroll
    for (int set = 0; set < kSets; ++set) {
      if (set > 0 && set >= sets) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t word[kGroups];
#pragma unroll
        for (int i = 0; i < kGroups; ++i) {
          float v[2];
          if constexpr (kEpi == Epilogue::kStore) {
            v[0] = acc_sets[set][4 * i + 2 * h];
            v[1] = acc_sets[set][4 * i + 2 * h + 1];
          } else {
            // Gate and up of the same output columns are both in this thread:
            // groups 2i / 2i+1 (interleaved by 8) or i / i + half (halves).
            const int gj = kEpi == Epilogue::kSiluInterleaved8 ? 2 * i : i;
            const int uj = kEpi == Epilogue::kSiluInterleaved8 ? 2 * i + 1 : i + L::kAccum / 8;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float g = acc_sets[set][4 * gj + 2 * h + e], u = acc_sets[set][4 * uj + 2 * h + e];
              v[e] = g / (1.0f + __expf(-g)) * u;
            }
          }
          const __nv_bfloat162 packed = __floats2bfloat162_rn(v[0], v[1]);
          word[i] = *reinterpret_cast<const uint32_t*>(&packed);
        }
        const int r = row + 64 * set + 8 * h;
        __nv_bfloat16* out_row = args.out + int64_t(r) * args.out_ld + out_col0;
        const int n_left = args.n_out - out_col0;  // output columns of this tile that exist
        // Quad transposes of 4 groups: lane q stores group 4g + q whole (16
        // bytes; 4-byte stores measured up to 10% slower on fp8 shapes).
#pragma unroll
        for (int g = 0; g < kGroups; g += 4) {
          const uint4 chunk = quad_transpose(word[g], word[g + 1], word[g + 2], word[g + 3], lane);
          if (r < args.m && (g + quad) * 8 < n_left) *reinterpret_cast<uint4*>(out_row + (g + quad) * 8) = chunk;
        }
      }
    }
  }
  // The last warpgroup's last turn signal has no turn of warpgroup 0 after it: take it here.
  if (kOrderedIssue && wg == 0 && turns > 0) sm90::named_barrier_sync(2, 256);
#else
  __trap();  // built for sm_90a only; the host never launches it elsewhere
#endif
}

// --- host side ----------------------------------------------------------

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    MLA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found),
                   "sm90 gemm: driver entry point");
    MLA_CUDA_REQUIRE(found == cudaDriverEntryPointSuccess && fn, "sm90 gemm: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A tensor of `rank` dimensions (dims[0] innermost; byte_strides[i] the step
// of dimension i + 1) loaded in boxes of `box` elements.
CUtensorMap encode_tensor_map(const void* base, CUtensorMapDataType type, int rank, const uint64_t* dims,
                              const uint64_t* byte_strides, const uint32_t* box, bool swizzle_128b, const char* what) {
  MLA_CUDA_REQUIRE(rank >= 1 && rank <= 5, std::string("tensor map for ") + what + ": rank 1 to 5");
  CUtensorMap map;
  cuuint64_t d[5], st[4];
  cuuint32_t b[5], element_strides[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    element_strides[i] = 1;
    if (i + 1 < rank) st[i] = byte_strides[i];
  }
  const CUresult r = tensor_map_encoder()(
      &map, type, cuuint32_t(rank), const_cast<void*>(base), d, st, b, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MLA_CUDA_REQUIRE(r == CUDA_SUCCESS, std::string("cuTensorMapEncodeTiled failed for ") + what + " (error " +
                                          std::to_string(int(r)) + ")");
  return map;
}

// Row-major {outer, inner} tensor, rows row_bytes apart, loaded in
// {box_outer, box_inner} boxes; swizzled boxes are one 128-byte row wide.
CUtensorMap tensor_map(const void* base, CUtensorMapDataType type, uint64_t inner, uint64_t outer, uint64_t row_bytes,
                       uint32_t box_inner, uint32_t box_outer, bool swizzle_128b, const char* what) {
  const uint64_t dims[2] = {inner, outer}, strides[1] = {row_bytes};
  const uint32_t box[2] = {box_inner, box_outer};
  return encode_tensor_map(base, type, 2, dims, strides, box, swizzle_128b, (std::string("sm90 gemm ") + what).c_str());
}

CUtensorMap bf16_tile_map(const __nv_bfloat16* base, int64_t rows, int64_t cols, uint32_t box_rows, const char* what) {
  return tensor_map(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, cols, rows, cols * 2, kRowBytes / 2, box_rows, true, what);
}
CUtensorMap fp8_tile_map(const uint8_t* base, int64_t rows, int64_t cols, uint32_t box_rows, const char* what) {
  return tensor_map(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, cols, rows, cols, kRowBytes, box_rows, true, what);
}
// Activation scales scale[kb * ld + row]: box of block_m rows of one kb.
CUtensorMap scale_map(const float* base, int64_t ld, int64_t k_blocks, uint32_t block_m) {
  return tensor_map(base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, ld, k_blocks, ld * 4, block_m, 1, false,
                    "activation scales");
}

int sm_count() {
  int device = 0, sms = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device), "sm90 gemm");
  MLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "sm90 gemm");
  return sms;
}

// The kernel variant, its dynamic shared memory allowed once.
template <class T, Epilogue kEpi, ASource kA, int kCluster, bool kClusterSplitK>
auto gemm_kernel(const char* op) {
  auto kernel = sm90_gemm_kernel<T, kEpi, kA, kCluster, kClusterSplitK>;
  static const bool attribute_set = [&] {
    MLA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<T>::kSmemBytes), op);
    return true;
  }();
  (void)attribute_set;
  return kernel;
}

template <class T, Epilogue kEpi, ASource kA = ASource::kTma, int kCluster = 1, bool kClusterSplitK = false>
void launch_gemm(const CUtensorMap& map_a, const CUtensorMap& map_w, const CUtensorMap& map_a_scale,
                 const GemmArgs& args, int max_m_blocks, cudaStream_t stream, const char* op) {
  auto kernel = gemm_kernel<T, kEpi, kA, kCluster, kClusterSplitK>(op);
  constexpr int smem = Layout<T>::kSmemBytes;
  const int max_m_tiles = (max_m_blocks + kCluster - 1) / kCluster;
  const int max_units = max_m_tiles * n_tiles_of<T, kEpi>(args.n_out) * args.k_splits;
  if constexpr (kClusterSplitK) {
    // One unit a CTA, a tile's splits one cluster.
    if (max_units <= 0) return;
    DependentLaunchConfig config(dim3(max_units), dim3(threads_of<T>()), smem, stream, unsigned(args.k_splits));
    MLA_CUDA_CHECK(cudaLaunchKernelEx(config.get(), kernel, map_a, map_w, map_a_scale, args), op);
  } else if constexpr (kCluster == 1) {
    const int grid = std::min(sm_count(), max_units);
    if (grid <= 0) return;
    launch_dependent(kernel, dim3(grid), dim3(threads_of<T>()), smem, stream, map_a, map_w, map_a_scale, args);
  } else {
    DependentLaunchConfig config(dim3(kCluster * sm_count()), dim3(threads_of<T>()), smem, stream, kCluster);
    // The grid is persistent: only as many pairs as fit on the GPU at once
    // (the GPCs' SM counts, not the SM count, bound them).
    static const int resident_pairs = [&] {
      int clusters = 0;
      MLA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, config.get()), op);
      return std::max(clusters, 1);
    }();
    const int grid = kCluster * std::min(resident_pairs, max_units);
    if (grid <= 0) return;
    config.get()->gridDim = dim3(grid);
    MLA_CUDA_CHECK(cudaLaunchKernelEx(config.get(), kernel, map_a, map_w, map_a_scale, args), op);
  }
  check_launch(op);
}

// out[i] = bf16(sum over the splits of partials[s * count + i]), the splits
// added in order so the result does not depend on scheduling.
__global__ void split_k_sum_kernel(const float* partials, int splits, int64_t count, __nv_bfloat16* out) {
  pdl_enter();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < count; i += stride) {
    float4 sum = *reinterpret_cast<const float4*>(partials + i);
    for (int sp = 1; sp < splits; ++sp) {
      const float4 v = *reinterpret_cast<const float4*>(partials + sp * count + i);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x, sum.y), hi = __floats2bfloat162_rn(sum.z, sum.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(out + i) = packed;
  }
}

// dst[m] = src row sorted_ids[m] / top_k (zeros for pads), m < *rows_in_use.
// One warp per row.
__global__ void gather_rows_kernel(const __nv_bfloat16* src, const int32_t* sorted_ids, int top_k, int sentinel,
                                   const int32_t* rows_in_use, int width, __nv_bfloat16* dst) {
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (row >= *rows_in_use) return;
  const int id = sorted_ids[row];
  const __nv_bfloat16* s = id == sentinel ? nullptr : src + int64_t(id / top_k) * width;
  for (int d = (threadIdx.x % 32) * 8; d < width; d += 256) {
    Bf16x8 v;
    if (s) {
      v = Bf16x8::load(s + d);
    } else {
      *reinterpret_cast<uint4*>(&v) = make_uint4(0, 0, 0, 0);
    }
    v.store(dst + row * width + d);
  }
}

// q[row], scale[kb * scale_ld + row] = 1x128 quantization of the bf16 row s
// (null: zeros) for each row = row_of(i), i < copies, by one warp, each
// half-warp one 128-wide group at a time (quantized once, written to every row).
template <typename RowOf>
__device__ __forceinline__ void quantize_row(const __nv_bfloat16* s, RowOf row_of, int copies, int width, uint8_t* q,
                                             float* scale, int64_t scale_ld) {
  const int lane = threadIdx.x % 32, half = lane / 16, j = lane % 16, groups = width / kFp8Group;
  for (int g0 = 0; g0 < groups; g0 += 2) {
    const int g = g0 + half;
    float v[8] = {};
    if (s && g < groups) Bf16x8::load(s + g * kFp8Group + j * 8).to_float(v);
    const QuantizedGroupPart part = quantize_group_16lanes(v);  // both halves call it together
    if (g >= groups) continue;
    for (int i = 0; i < copies; ++i) {
      const int64_t row = row_of(i);
      *reinterpret_cast<uint2*>(q + row * width + g * kFp8Group + j * 8) = part.q;
      if (j == 0) scale[g * scale_ld + row] = part.scale;
    }
  }
}

// Row m < *rows_in_use (or < rows without rows_in_use) of q / scale is the
// quantized row m of src. One warp per row.
__global__ void quantize_rows_kernel(const __nv_bfloat16* src, const int32_t* rows_in_use, int rows, int width,
                                     uint8_t* q, float* scale, int64_t scale_ld) {
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (row >= (rows_in_use ? *rows_in_use : rows)) return;
  quantize_row(src + row * width, [row](int) { return row; }, 1, width, q, scale, scale_ld);
}

// The MoE's A in expert order: rows position[t * per_token + i] of q / scale
// are the quantized x row of token t; pad rows (sorted_ids[m] == sentinel,
// m < *rows_in_use) are zeros. One warp per token quantizes its row once and
// writes it to each of its slots' rows; warps past the tokens zero the pads.
__global__ void scatter_quantize_kernel(const __nv_bfloat16* x, const int32_t* position, int per_token,
                                        int num_tokens, const int32_t* sorted_ids, int sentinel,
                                        const int32_t* rows_in_use, int width, uint8_t* q, float* scale,
                                        int64_t scale_ld) {
  const int64_t w = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (w < num_tokens) {
    const int32_t* rows = position + w * per_token;
    quantize_row(x + w * width, [rows](int i) { return int64_t(rows[i]); }, per_token, width, q, scale, scale_ld);
    return;
  }
  const int64_t row = w - num_tokens;
  if (row < *rows_in_use && sorted_ids[row] == sentinel)
    quantize_row(nullptr, [row](int) { return row; }, 1, width, q, scale, scale_ld);
}

// Workspace pieces, carved from one allocation (null base: size only).
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename E>
  E* take(size_t count) {
    char* r = base_ ? base_ + offset_ : nullptr;
    offset_ += (count * sizeof(E) + 255) / 256 * 256;
    return reinterpret_cast<E*>(r);
  }
  size_t bytes() const { return offset_; }

 private:
  char* base_;
  size_t offset_ = 0;
};

struct MoeRows {
  MoeSlots slots;
  int slot_count, total_experts, block_m, max_blocks, max_rows;
};

MoeRows moe_rows(const Sm90MoeParams& p, int block_m) {
  MoeRows r;
  r.slots = MoeSlots{p.topk_ids, p.topk_weights, p.top_k, p.num_shared, p.num_experts};
  r.slot_count = p.num_tokens * r.slots.per_token();
  r.total_experts = p.num_experts + p.num_shared;
  r.block_m = block_m;
  // Each expert's run adds at most one partly filled block.
  r.max_blocks = (r.slot_count + block_m - 1) / block_m + std::min(r.total_experts, r.slot_count);
  r.max_rows = r.max_blocks * block_m;
  return r;
}

struct AlignedRows {
  int32_t *sorted_ids, *block_expert, *rows_in_use, *position, *row_units, *num_row_units;
};

AlignedRows carve_align(Carver& c, const MoeRows& r) {
  AlignedRows a;
  a.sorted_ids = c.take<int32_t>(r.max_rows);
  a.block_expert = c.take<int32_t>(r.max_blocks);
  a.rows_in_use = c.take<int32_t>(1);
  a.position = c.take<int32_t>(r.slot_count);
  a.row_units = c.take<int32_t>(r.max_blocks);
  a.num_row_units = c.take<int32_t>(1);
  return a;
}

// unit_blocks > 0: also cut each expert's run into units of at most that many blocks (Fp8Rows192).
void align(const MoeRows& r, const AlignedRows& a, int unit_blocks, cudaStream_t stream, const char* op) {
  const size_t smem = sizeof(int32_t) * ((unit_blocks ? 4 : 3) * r.total_experts + 1);
  moe_align_kernel<<<1, 1024, smem, stream>>>(r.slots, r.slot_count, r.total_experts, r.block_m, r.max_rows,
                                          a.sorted_ids, a.block_expert, a.rows_in_use, a.position, unit_blocks,
                                          unit_blocks ? a.row_units : nullptr, a.num_row_units);
  check_launch(op);
}

struct Bf16MoeWorkspace {
  AlignedRows rows;
  __nv_bfloat16 *x_sorted, *act, *down;
};

// gather: the GEMM gathers x itself (no x_sorted).
Bf16MoeWorkspace carve_bf16(void* base, const MoeRows& r, int hidden, int inter, bool gather, size_t* bytes) {
  Carver c(base);
  Bf16MoeWorkspace w;
  w.rows = carve_align(c, r);
  w.x_sorted = gather ? nullptr : c.take<__nv_bfloat16>(size_t(r.max_rows) * hidden);
  w.act = c.take<__nv_bfloat16>(size_t(r.max_rows) * inter);
  w.down = c.take<__nv_bfloat16>(size_t(r.max_rows) * hidden);
  if (bytes) *bytes = c.bytes();
  return w;
}

struct Fp8MoeWorkspace {
  AlignedRows rows;
  uint8_t *x_q, *act_q;
  float *x_scale, *act_scale;
  __nv_bfloat16 *act, *down;
};

// gather: x is quantized per token ({T, D}, scales {D/128, T}), not per slot
// in expert order ({max_rows, D}).
Fp8MoeWorkspace carve_fp8(void* base, const MoeRows& r, int num_tokens, int hidden, int inter, bool gather,
                          size_t* bytes) {
  Carver c(base);
  Fp8MoeWorkspace w;
  w.rows = carve_align(c, r);
  const size_t x_rows = gather ? size_t(num_tokens) : size_t(r.max_rows);
  w.x_q = c.take<uint8_t>(x_rows * hidden);
  w.x_scale = c.take<float>(x_rows * (hidden / kFp8Group));
  w.act = c.take<__nv_bfloat16>(size_t(r.max_rows) * inter);
  w.act_q = c.take<uint8_t>(size_t(r.max_rows) * inter);
  w.act_scale = c.take<float>(size_t(r.max_rows) * (inter / kFp8Group));
  w.down = c.take<__nv_bfloat16>(size_t(r.max_rows) * hidden);
  if (bytes) *bytes = c.bytes();
  return w;
}

void check_moe_shape(const Sm90MoeParams& p, const char* op) {
  MLA_CUDA_REQUIRE(p.num_experts > 0 && p.top_k > 0 && p.top_k <= p.num_experts && p.num_shared >= 0 &&
                       p.top_k + p.num_shared <= 16 && p.num_tokens >= 0,
                   std::string(op) + ": top_k " + std::to_string(p.top_k) + " must be in [1, experts " +
                       std::to_string(p.num_experts) + "] and top_k + shared " + std::to_string(p.num_shared) +
                       " at most 16");
  MLA_CUDA_REQUIRE(p.hidden > 0 && p.hidden % 256 == 0 && p.inter > 0 && p.inter % 128 == 0,
                   std::string(op) + ": hidden " + std::to_string(p.hidden) + " must be a multiple of 256 and inter " +
                       std::to_string(p.inter) + " of 128");
  MLA_CUDA_REQUIRE(sm90_gemm_supported(), std::string(op) + ": needs a compute capability 9.0 (Hopper) GPU");
}

// The measured best variants (bench_grouped_gemm on an H200, docs/sm90_gemm.md).
// bf16 rows: runs of an expert's blocks (192) once experts average 192 rows
// (H100, v2-lite, perf.md session 21: 2,048 tokens 654-655 against 773-779
// us, 4,096 1,098-1,099 against 1,124-1,129; 1,024 even); below, the tile that
// pads each expert's mean row count least, 128 on a tie (more efficient
// tiles); v2-lite: 64 below ~1024 tokens.
int bf16_block_m(const Sm90MoeParams& p) {
  if (p.variant.bf16_block_m) return p.variant.bf16_block_m;
  const int64_t slots = int64_t(p.num_tokens) * (p.top_k + p.num_shared);
  const int64_t mean_rows = (slots + p.num_experts + p.num_shared - 1) / (p.num_experts + p.num_shared);
  if (mean_rows >= Bf16Rows192::kBlockM) return Bf16Rows192::kBlockM;
  const int64_t padded128 = (mean_rows + 127) / 128 * 128, padded64 = (mean_rows + 63) / 64 * 64;
  return padded64 < padded128 ? 64 : 128;
}
// Measured on an H200 (docs/sm90_gemm.md): the producer's gather is 1-7%
// faster for bf16 at v2-lite widths at every size. fp8 at V3 widths on an
// H100 (perf.md session 8), the gathering 64-row kernel against runs of an
// expert's blocks fed by TMA: 4.12 / 4.16 / 4.21 / 4.26 / 4.33 ms against
// 4.30 / 4.34 / 4.35 / 4.38 / 4.38 at 512 / 768 / 1024 / 1280 / 1536 tokens,
// 5.33 against 4.57 at 2048.
constexpr int kFp8GatherMaxTokens = 1536;
bool gathers_in_producer(const Sm90MoeParams& p, bool fp8) {
  if (p.variant.gather_in_producer >= 0) return p.variant.gather_in_producer != 0;
  return !fp8 || p.num_tokens <= kFp8GatherMaxTokens;
}

// Pairs of CTAs sharing weight tiles (kCluster 2), for the kernels fed by
// TMA: on by default where measured faster. H200, bench_grouped_gemm,
// whole op (perf.md session 5): fp8 MoE V3 477 -> 492 TFLOP/s at 4096
// tokens (two runs each), 331-344 -> 346-367 at 2048 (1024: even). Dense
// fp8 at M = 4096 lost 0-11% on the large shapes in pairs and the bf16 MoE
// at 4096 moved within +-3% (those kernels are not bound by the weight
// stream from L2), so there only on request.
bool pairs_row_tiles(const Sm90GemmVariant& v, bool by_default) {
  return v.cluster_m == 2 || (v.cluster_m == 0 && by_default);
}

// Three consumer warpgroups over runs of up to three of an expert's 64-row
// blocks (Fp8Rows192), for the TMA-fed fp8 MoE (past kFp8GatherMaxTokens).
// H100, bench_grouped_gemm, V3 routed experts (perf.md session 8), against
// TMA-fed 64-row tiles one CTA a tile / in pairs: 4096 tokens 5.35 ms
// against 6.07 / 6.47; 2048: 4.58 against 5.72 / 5.23; 1024: 4.37 against
// 4.52 / 4.34.
bool fp8_moe_runs(const Sm90MoeParams& p) {
  const int v = p.variant.fp8_moe_block_m;
  MLA_CUDA_REQUIRE(v == 0 || v == 64 || v == 192, "sm90 fp8 moe: fp8_moe_block_m must be 0, 64 or 192");
  return v != 64;
}

// The overlapped promotion runs K blocks in pairs.
bool fp8_overlapped(const Sm90GemmVariant& v, int k) {
  const int k_blocks = k / kFp8Group;
  return v.fp8_overlap_promotion != 0 && k_blocks >= 2 && k_blocks % 2 == 0;
}

// Runs of an expert's blocks (Bf16Rows192): the align step pads to 64-row
// blocks and cuts the runs into units; A comes by TMA.
template <class T>
constexpr bool bf16_runs() {
  return row_sets_of<T>() > 1;
}

// The rows the align step lays out and whether gate_up gathers x in its
// producer, for a bf16 tile of block_m rows (the workspace size and the run
// read both from here).
MoeRows bf16_moe_rows(const Sm90MoeParams& p, int block_m) {
  return moe_rows(p, block_m == Bf16Rows192::kBlockM ? kPieceRows : block_m);
}
bool bf16_gathers_in_producer(const Sm90MoeParams& p, int block_m) {
  return block_m != Bf16Rows192::kBlockM && gathers_in_producer(p, false);
}

// A TMA-fed bf16 GEMM, one CTA a tile or (pairs) clusters of two sharing weight tiles.
template <class T, Epilogue kEpi>
void launch_bf16_tma(bool pairs, const CUtensorMap& map_a, const CUtensorMap& map_w, const GemmArgs& g,
                     int max_m_blocks, cudaStream_t stream, const char* op) {
  const CUtensorMap unused{};
  if constexpr (!bf16_runs<T>()) {
    if (pairs) {
      launch_gemm<T, kEpi, ASource::kTma, 2>(map_a, map_w, unused, g, max_m_blocks, stream, op);
      return;
    }
  }
  launch_gemm<T, kEpi>(map_a, map_w, unused, g, max_m_blocks, stream, op);
}

template <class T>
void run_bf16_moe(const Sm90MoeParams& p, void* workspace, cudaStream_t stream) {
  constexpr bool kRuns = bf16_runs<T>();
  const MoeRows r = bf16_moe_rows(p, T::kBlockM);
  const bool gather = bf16_gathers_in_producer(p, T::kBlockM);
  const Bf16MoeWorkspace w = carve_bf16(workspace, r, p.hidden, p.inter, gather, nullptr);
  align(r, w.rows, kRuns ? row_sets_of<T>() : 0, stream, "sm90 moe align");
  if (!gather) {
    gather_rows_kernel<<<r.max_rows / 8, 256, 0, stream>>>(p.x, w.rows.sorted_ids, r.slots.per_token(),
                                                           r.slot_count, w.rows.rows_in_use, p.hidden, w.x_sorted);
    check_launch("sm90 moe gather");
  }

  const auto* w_gate_up = static_cast<const __nv_bfloat16*>(p.w_gate_up);
  const auto* w_down = static_cast<const __nv_bfloat16*>(p.w_down);
  GemmArgs g;
  g.block_expert = w.rows.block_expert;
  g.rows_in_use = w.rows.rows_in_use;
  if (kRuns) {
    g.row_units = w.rows.row_units;
    g.num_row_units = w.rows.num_row_units;
  }
  g.m = r.max_rows;
  g.k = p.hidden;
  g.n_out = p.inter;
  g.w_rows = 2 * p.inter;
  g.out = w.act;
  g.out_ld = p.inter;
  const bool pairs = !kRuns && pairs_row_tiles(p.variant, false);
  const CUtensorMap map_gate_up =
      bf16_tile_map(w_gate_up, int64_t(r.total_experts) * 2 * p.inter, p.hidden, kPieceRows, "gate_up weights");
  if (gather) {
    g.gather_ids = w.rows.sorted_ids;
    g.gather_div = r.slots.per_token();
    g.gather_sentinel = r.slot_count;
    g.gather_src = p.x;
    g.gather_ld = int64_t(p.hidden) * 2;
    const CUtensorMap unused{};
    if constexpr (!kRuns)  // (runs never gather in the producer)
      launch_gemm<T, Epilogue::kSiluInterleaved8, ASource::kGather>(unused, map_gate_up, unused, g, r.max_blocks,
                                                                    stream, "sm90 moe gate_up (gathering)");
  } else {
    launch_bf16_tma<T, Epilogue::kSiluInterleaved8>(
        pairs, bf16_tile_map(w.x_sorted, r.max_rows, p.hidden, T::kBlockM, "gathered x"), map_gate_up, g,
        r.max_blocks, stream, "sm90 moe gate_up");
  }

  g.k = p.inter;
  g.n_out = p.hidden;
  g.w_rows = p.hidden;
  g.out = w.down;
  g.out_ld = p.hidden;
  const CUtensorMap map_act = bf16_tile_map(w.act, r.max_rows, p.inter, T::kBlockM, "activations");
  const CUtensorMap map_down =
      bf16_tile_map(w_down, int64_t(r.total_experts) * p.hidden, p.inter, kPieceRows, "down weights");
  launch_bf16_tma<T, Epilogue::kStore>(pairs, map_act, map_down, g, r.max_blocks, stream, "sm90 moe down");

  moe_combine_kernel<<<p.num_tokens, 128, 0, stream>>>(w.down, w.rows.position, r.slots, p.addend, p.hidden, p.out);
  check_launch("sm90 moe combine");
}

// The fp8 kernel variant for a GEMM with this K (args.row_units: Fp8Rows192).
template <Epilogue kEpi, ASource kA = ASource::kTma>
void launch_fp8_gemm(const Sm90GemmVariant& v, const CUtensorMap& map_a, const CUtensorMap& map_w,
                     const CUtensorMap& map_a_scale, const GemmArgs& args, int max_m_blocks, cudaStream_t stream,
                     const char* op) {
  const bool overlap = fp8_overlapped(v, args.k);
  if constexpr (kA == ASource::kTma) {
    if (args.row_units) {
      launch_gemm<Fp8Rows192, kEpi>(map_a, map_w, map_a_scale, args, max_m_blocks, stream, op);
      return;
    }
    if (pairs_row_tiles(v, true)) {
      if (overlap)
        launch_gemm<Fp8Tiles<true>, kEpi, kA, 2>(map_a, map_w, map_a_scale, args, max_m_blocks, stream, op);
      else
        launch_gemm<Fp8Tiles<false>, kEpi, kA, 2>(map_a, map_w, map_a_scale, args, max_m_blocks, stream, op);
      return;
    }
  }
  if (overlap)
    launch_gemm<Fp8Tiles<true>, kEpi, kA>(map_a, map_w, map_a_scale, args, max_m_blocks, stream, op);
  else
    launch_gemm<Fp8Tiles<false>, kEpi, kA>(map_a, map_w, map_a_scale, args, max_m_blocks, stream, op);
}

void run_fp8_moe(const Sm90MoeParams& p, void* workspace, cudaStream_t stream) {
  const MoeRows r = moe_rows(p, kSm90Fp8BlockM);
  const bool gather = gathers_in_producer(p, true);
  const bool runs = !gather && fp8_moe_runs(p);
  const int a_box = runs ? Fp8Rows192::kBlockM : kSm90Fp8BlockM;  // rows of the A tiles TMA loads
  const Fp8MoeWorkspace w = carve_fp8(workspace, r, p.num_tokens, p.hidden, p.inter, gather, nullptr);
  align(r, w.rows, runs ? Fp8Rows192::kConsumers : 0, stream, "sm90 fp8 moe align");
  if (gather) {
    quantize_rows_kernel<<<(p.num_tokens + 7) / 8, 256, 0, stream>>>(p.x, nullptr, p.num_tokens, p.hidden, w.x_q,
                                                                     w.x_scale, p.num_tokens);
    check_launch("sm90 fp8 moe quantize x");
  } else {
    scatter_quantize_kernel<<<(p.num_tokens + r.max_rows + 7) / 8, 256, 0, stream>>>(
        p.x, w.rows.position, r.slots.per_token(), p.num_tokens, w.rows.sorted_ids, r.slot_count,
        w.rows.rows_in_use, p.hidden, w.x_q, w.x_scale, r.max_rows);
    check_launch("sm90 fp8 moe scatter+quantize");
  }

  const auto* w_gate_up = static_cast<const uint8_t*>(p.w_gate_up);
  const auto* w_down = static_cast<const uint8_t*>(p.w_down);
  GemmArgs g;
  g.block_expert = w.rows.block_expert;
  g.rows_in_use = w.rows.rows_in_use;
  if (runs) {
    g.row_units = w.rows.row_units;
    g.num_row_units = w.rows.num_row_units;
  }
  g.m = r.max_rows;
  g.k = p.hidden;
  g.n_out = p.inter;
  g.w_rows = 2 * p.inter;
  g.up_offset = p.inter;
  g.w_scale = p.w_gate_up_scale;
  g.w_scale_rows = 2 * p.inter / kFp8Group;
  g.out = w.act;
  g.out_ld = p.inter;
  if (!runs) {  // the 64 x 256 tiles write the activations' FP8 rows themselves
    g.out_q = w.act_q;
    g.out_scale = w.act_scale;
    g.out_scale_ld = r.max_rows;
  }
  const CUtensorMap map_gate_up =
      fp8_tile_map(w_gate_up, int64_t(r.total_experts) * 2 * p.inter, p.hidden, kPieceRows, "gate_up weights");
  if (gather) {
    const CUtensorMap unused{};
    g.gather_ids = w.rows.sorted_ids;
    g.gather_div = r.slots.per_token();
    g.gather_sentinel = r.slot_count;
    g.gather_src = w.x_q;
    g.gather_ld = p.hidden;
    g.gather_scale = w.x_scale;
    g.gather_scale_ld = p.num_tokens;
    launch_fp8_gemm<Epilogue::kSiluHalves, ASource::kGather>(p.variant, unused, map_gate_up, unused, g, r.max_blocks, stream,
                                                 "sm90 fp8 moe gate_up (gathering)");
  } else {
    launch_fp8_gemm<Epilogue::kSiluHalves>(p.variant, fp8_tile_map(w.x_q, r.max_rows, p.hidden, a_box, "quantized x"),
                                           map_gate_up, scale_map(w.x_scale, r.max_rows, p.hidden / kFp8Group, a_box),
                                           g, r.max_blocks, stream, "sm90 fp8 moe gate_up");
  }
  if (runs) {  // the run tiles' 64 output columns are half a group: quantized in a pass
    quantize_rows_kernel<<<r.max_rows / 8, 256, 0, stream>>>(w.act, w.rows.rows_in_use, 0, p.inter, w.act_q,
                                                             w.act_scale, r.max_rows);
    check_launch("sm90 fp8 moe act quantize");
  }

  g.k = p.inter;
  g.n_out = p.hidden;
  g.w_rows = p.hidden;
  g.up_offset = 0;
  g.out_q = nullptr;
  g.out_scale = nullptr;
  g.w_scale = p.w_down_scale;
  g.w_scale_rows = p.hidden / kFp8Group;
  g.out = w.down;
  g.out_ld = p.hidden;
  launch_fp8_gemm<Epilogue::kStore>(
      p.variant, fp8_tile_map(w.act_q, r.max_rows, p.inter, a_box, "quantized activations"),
      fp8_tile_map(w_down, int64_t(r.total_experts) * p.hidden, p.inter, kPieceRows, "down weights"),
      scale_map(w.act_scale, r.max_rows, p.inter / kFp8Group, a_box), g, r.max_blocks, stream,
      "sm90 fp8 moe down");

  moe_combine_kernel<<<p.num_tokens, 128, 0, stream>>>(w.down, w.rows.position, r.slots, p.addend, p.hidden, p.out);
  check_launch("sm90 fp8 moe combine");
}

// Rows from which a dense fp8 GEMM at decode rows may take 128 x 192 tiles
// (plan_dense_fp8).
constexpr int kWideDecodeMinRows = 48;

// How a dense fp8 GEMM runs: tile rows, K splits (f32 partials and a sum
// kernel, or cluster_splits: one cluster a tile), promotion.
struct DenseFp8Plan {
  int block_m = 128, block_n = 128, k_splits = 1;
  bool cluster_splits = false, overlap = false;
  size_t workspace_bytes = 0;
};

// CTAs the GPU holds at once in clusters of `splits` (2 or 4) of the
// cluster split-K kernel (one CTA an SM; the GPCs' SM counts bound clusters).
int resident_split_ctas(int splits) {
  auto query = [](int size) {
    using T = Fp8Tiles<false>;
    const char* op = "sm90 fp8 gemm (cluster split K)";
    auto kernel = gemm_kernel<T, Epilogue::kStore, ASource::kTma, 1, true>(op);
    DependentLaunchConfig config(dim3(size * sm_count()), dim3(threads_of<T>()), Layout<T>::kSmemBytes, nullptr,
                                 unsigned(size));
    int clusters = 0;
    MLA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, config.get()), op);
    return clusters * size;
  };
  static const int pairs = query(2), quads = query(4);
  return splits == 2 ? pairs : quads;
}

// NOTES: decode-sized M leaves a few dozen output tiles for 132 SMs, so K
// is split into more work units. The plan takes the split count of least
// estimated time, in K blocks of one weight tile at an SM's fair share of
// the bandwidth: full waves of units at that share; a last partial wave of
// r units runs faster, each SM streaming up to twice its share (~60 GB/s:
// 28 SMs read o_proj in 56 us, 56 in 35); one block's turn-around a unit an
// SM; and the f32 partials (written and read once, weighted twice: stored 8
// bytes a thread). It ranks every measured case (H200, BM_Fp8Sm90Splits,
// device runs 7-8) as measured, e.g. one token: o_proj {7168, 16384} 55.9 /
// 35.3 / 32.0 / 35.2 us at 1 / 2 / 4 / 8 splits, q_b {24576, 1536} 12.1 /
// 13.0 / 14.5 at 1 / 2 / 4, dense gate_up {36864, 7168} 80.4 at 1 against
// 70.3 at 8; 64 tokens: dense gate_up 87.8 / 93.2 / 98.4 at 1 / 2 / 4.
// Cluster splits (partials false) have no partials but a fixed 2.5 blocks:
// a CTA waits for the cluster's slowest before it leaves its SM to the next
// kernel, and clusters take whole groups of free SMs (H100, session 24: at
// one row 2.6-3.5 us slower than partials at 4 splits on o_proj, dense down
// and q_a + kv_a; at 64 rows o_proj 46.2 us against 47.7 at 2 splits and
// 49.5 at 4 with partials, at 128 rows 51.7 against 54.1).
double dense_fp8_cost(int64_t tiles, int k_blocks, int splits, int64_t m, int64_t n, int64_t sms,
                      double tile_load_bytes, bool partials = true) {
  const int64_t units = tiles * splits, waves = units / sms, rest = units % sms;
  const double unit_blocks = double((k_blocks + splits - 1) / splits);
  double t = double(waves) * unit_blocks;
  if (rest > 0) t += unit_blocks / std::min(2.0, double(sms) / double(rest));
  t += double((units + sms - 1) / sms);
  if (splits > 1) t += partials ? 2.0 * (2.0 * splits * m * n * 4) / (tile_load_bytes * double(sms)) : 2.5;
  return t;
}

DenseFp8Plan plan_dense_fp8(const Sm90Fp8GemmParams& p) {
  DenseFp8Plan plan;
  plan.block_m = p.variant.fp8_block_m ? p.variant.fp8_block_m : (p.m <= 64 ? 64 : 128);
  MLA_CUDA_REQUIRE(plan.block_m == 64 || plan.block_m == 128 || plan.block_m == 192,
                   "fp8_gemm_sm90: fp8_block_m must be 64, 128 or 192");
  MLA_CUDA_REQUIRE(p.variant.fp8_block_n == 0 || p.variant.fp8_block_n == 128 ||
                       (p.variant.fp8_block_n == 192 && plan.block_m == 128),
                   "fp8_gemm_sm90: fp8_block_n must be 128, or 192 with 128-row tiles");
  plan.block_n = plan.block_m == 64 ? 256 : p.variant.fp8_block_n == 192 ? 192 : 128;
  const int block_n = plan.block_n, k_blocks = p.k / kFp8Group;
  const int64_t tiles = int64_t((p.m + plan.block_m - 1) / plan.block_m) * ((p.n + block_n - 1) / block_n);
  // Cluster splits: 2 or 4 of them (whole quads of a thread's 16 accumulator
  // groups a rank), tiles of 64 or 128 rows and 128 columns a warpgroup,
  // and (for the plan) every cluster resident at once.
  const int cluster_mode = p.variant.fp8_cluster_splits;
  MLA_CUDA_REQUIRE(cluster_mode >= -1 && cluster_mode <= 1, "fp8_gemm_sm90: fp8_cluster_splits must be -1, 0 or 1");
  auto cluster_fits = [&](int splits) {
    return (splits == 2 || splits == 4) && splits <= k_blocks && block_n != 192 && plan.block_m != 192;
  };
  auto one_wave = [&](int splits) { return tiles * splits <= resident_split_ctas(splits); };
  if (p.variant.fp8_k_splits > 0) {
    plan.k_splits = std::min(p.variant.fp8_k_splits, k_blocks);
    MLA_CUDA_REQUIRE(cluster_mode != 1 || plan.k_splits == 1 || cluster_fits(plan.k_splits),
                     "fp8_gemm_sm90: cluster splits take 2 or 4 K splits on 64 x 256 or 128 x 128 tiles");
    const bool by_plan = cluster_mode == 0 && cluster_fits(plan.k_splits) && one_wave(plan.k_splits);
    plan.cluster_splits = plan.k_splits > 1 && (cluster_mode == 1 || by_plan);
  } else {
    const int64_t sms = sm_count();
    const double tile_load_bytes = double(block_n) * kFp8Group;
    double best = dense_fp8_cost(tiles, k_blocks, 1, p.m, p.n, sms, tile_load_bytes);
    for (int splits = 2; cluster_mode != 1 && splits <= std::min(k_blocks, 64); ++splits) {
      const double cost = dense_fp8_cost(tiles, k_blocks, splits, p.m, p.n, sms, tile_load_bytes);
      if (cost < best) {
        best = cost;
        plan.k_splits = splits;
      }
    }
    for (int splits : {2, 4}) {
      if (cluster_mode == -1 || !cluster_fits(splits) || !one_wave(splits)) continue;
      const double cost = dense_fp8_cost(tiles, k_blocks, splits, p.m, p.n, sms, tile_load_bytes, false);
      if (cost <= best) {
        best = cost;
        plan.k_splits = splits;
        plan.cluster_splits = true;
      }
    }
  }
  // From 48 rows an unsplit grid of 64 x 256 tiles that leaves a quarter of
  // the SMs idle (q_b {24576, 1536}: 96 tiles) runs faster as one wave of
  // 128 x 192 tiles (128; the second warpgroup has no rows): q_b 14.0 / 14.2
  // us against 14.4 / 15.7 at 48 / 64 rows, while at 8-32 rows the 64 x 256
  // tiles take 8-16% less (H200, perf.md session 35).
  if (p.variant.fp8_block_m == 0 && p.variant.fp8_block_n == 0 && p.variant.fp8_k_splits == 0 &&
      plan.block_m == 64 && plan.k_splits == 1 && p.m >= kWideDecodeMinRows) {
    const int64_t sms = sm_count(), wide_tiles = (p.n + 191) / 192;
    if (4 * tiles <= 3 * sms && wide_tiles <= sms) {
      plan.block_m = 128;
      plan.block_n = 192;
    }
  }
  plan.overlap = plan.k_splits == 1 && plan.block_m != 192 && plan.block_n != 192 && fp8_overlapped(p.variant, p.k);
  if (plan.k_splits > 1 && !plan.cluster_splits)
    plan.workspace_bytes = size_t(plan.k_splits) * p.m * p.n * sizeof(float);
  return plan;
}

// A dense kernel variant for the plan: A (e4m3) and its scales loaded by
// TMA, or (a_bf16) bf16 rows quantized by the producer warpgroup.
void launch_dense_fp8(const Sm90Fp8GemmParams& p, const DenseFp8Plan& plan, GemmArgs& g, int m_blocks,
                      cudaStream_t stream) {
  const CUtensorMap map_w = fp8_tile_map(p.w, p.n, p.k, kPieceRows, "w");
  if (p.a_bf16) {
    MLA_CUDA_REQUIRE(p.m <= kSm90QuantizeMaxRows && plan.block_m == 64,
                     "fp8_gemm_sm90: quantizing in the GEMM takes at most " +
                         std::to_string(kSm90QuantizeMaxRows) +
                         " rows and 64-row tiles (m " + std::to_string(p.m) + ")");
    g.x_bf16 = p.a_bf16;
    g.x_ld = p.a_bf16_ld;
    const CUtensorMap unused{};
    if (plan.cluster_splits)
      launch_gemm<Fp8Tiles<false>, Epilogue::kStore, ASource::kQuantize, 1, true>(
          unused, map_w, unused, g, m_blocks, stream, "sm90 fp8 gemm (quantizing, cluster split K)");
    else if (plan.overlap)
      launch_gemm<Fp8Tiles<true>, Epilogue::kStore, ASource::kQuantize>(unused, map_w, unused, g, m_blocks, stream,
                                                                        "sm90 fp8 gemm (quantizing)");
    else
      launch_gemm<Fp8Tiles<false>, Epilogue::kStore, ASource::kQuantize>(unused, map_w, unused, g, m_blocks, stream,
                                                                         "sm90 fp8 gemm (quantizing)");
    return;
  }
  const CUtensorMap map_a = fp8_tile_map(p.a, p.m, p.k, plan.block_m, "a");
  const CUtensorMap map_scale = scale_map(p.a_scale, p.a_scale_ld, p.k / kFp8Group, plan.block_m);
  if (plan.cluster_splits) {
    if (plan.block_m == 128)
      launch_gemm<Fp8Rows128<false>, Epilogue::kStore, ASource::kTma, 1, true>(
          map_a, map_w, map_scale, g, m_blocks, stream, "sm90 fp8 gemm (cluster split K)");
    else
      launch_gemm<Fp8Tiles<false>, Epilogue::kStore, ASource::kTma, 1, true>(
          map_a, map_w, map_scale, g, m_blocks, stream, "sm90 fp8 gemm (cluster split K)");
    return;
  }
  // Pairs only where a phantom tile (odd m_blocks) wastes little.
  const bool pairs = plan.k_splits == 1 && m_blocks >= 4 && pairs_row_tiles(p.variant, false);
  if (plan.block_n == 192) {
    if (pairs)
      launch_gemm<Fp8Rows128Wide, Epilogue::kStore, ASource::kTma, 2>(map_a, map_w, map_scale, g, m_blocks, stream,
                                                                      "sm90 fp8 gemm (128 x 192, pairs)");
    else
      launch_gemm<Fp8Rows128Wide, Epilogue::kStore>(map_a, map_w, map_scale, g, m_blocks, stream,
                                                    "sm90 fp8 gemm (128 x 192)");
    return;
  }
  if (plan.block_m == 128 && pairs) {
    if (plan.overlap)
      launch_gemm<Fp8Rows128<true>, Epilogue::kStore, ASource::kTma, 2>(map_a, map_w, map_scale, g, m_blocks, stream,
                                                                        "sm90 fp8 gemm (pairs)");
    else
      launch_gemm<Fp8Rows128<false>, Epilogue::kStore, ASource::kTma, 2>(map_a, map_w, map_scale, g, m_blocks,
                                                                         stream, "sm90 fp8 gemm (pairs)");
    return;
  }
  if (plan.block_m == 192)
    launch_gemm<Fp8Rows192, Epilogue::kStore>(map_a, map_w, map_scale, g, m_blocks, stream, "sm90 fp8 gemm (192 rows)");
  else if (plan.block_m == 128 && plan.overlap)
    launch_gemm<Fp8Rows128<true>, Epilogue::kStore>(map_a, map_w, map_scale, g, m_blocks, stream, "sm90 fp8 gemm");
  else if (plan.block_m == 128)
    launch_gemm<Fp8Rows128<false>, Epilogue::kStore>(map_a, map_w, map_scale, g, m_blocks, stream, "sm90 fp8 gemm");
  else if (plan.overlap)
    launch_gemm<Fp8Tiles<true>, Epilogue::kStore>(map_a, map_w, map_scale, g, m_blocks, stream, "sm90 fp8 gemm");
  else
    launch_gemm<Fp8Tiles<false>, Epilogue::kStore>(map_a, map_w, map_scale, g, m_blocks, stream, "sm90 fp8 gemm");
}

void run_fp8_gemm(const Sm90Fp8GemmParams& p, cudaStream_t stream) {
  const DenseFp8Plan plan = plan_dense_fp8(p);
  MLA_CUDA_REQUIRE(plan.workspace_bytes == 0 || p.workspace,
                   "fp8_gemm_sm90: a split-K plan needs the workspace of fp8_gemm_sm90_workspace_bytes()");
  GemmArgs g;
  g.m = p.m;
  g.k = p.k;
  g.n_out = p.n;
  g.w_rows = p.n;
  g.w_scale = p.w_scale;
  g.w_scale_rows = (p.n + kFp8Group - 1) / kFp8Group;
  g.out = p.out;
  g.out_ld = p.n;
  g.k_splits = plan.k_splits;
  g.partials = plan.k_splits > 1 && !plan.cluster_splits ? static_cast<float*>(p.workspace) : nullptr;
  launch_dense_fp8(p, plan, g, (p.m + plan.block_m - 1) / plan.block_m, stream);
  if (g.partials && !p.defer_split_sum) {
    const int64_t count = int64_t(p.m) * p.n;
    const int blocks = int(std::min<int64_t>((count / 4 + 255) / 256, 4 * sm_count()));
    launch_dependent(split_k_sum_kernel, dim3(blocks), dim3(256), 0, stream, static_cast<const float*>(g.partials),
                     plan.k_splits, count, p.out);
    check_launch("sm90 fp8 gemm split-K sum");
  }
}

}  // namespace

bool sm90_gemm_supported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

size_t moe_experts_sm90_workspace_bytes(const Sm90MoeParams& p) {
  size_t bytes = 0;
  const int block_m = bf16_block_m(p);
  carve_bf16(nullptr, bf16_moe_rows(p, block_m), p.hidden, p.inter, bf16_gathers_in_producer(p, block_m), &bytes);
  return bytes;
}

void moe_experts_sm90(const Sm90MoeParams& p, void* workspace, cudaStream_t stream) {
  check_moe_shape(p, "moe_experts_sm90");
  const int block_m = bf16_block_m(p);
  MLA_CUDA_REQUIRE(block_m == 192 || block_m == 128 || block_m == 64,
                   "moe_experts_sm90: bf16_block_m must be 192, 128 or 64, not " + std::to_string(block_m));
  if (p.num_tokens == 0) return;
  if (block_m == 192)
    run_bf16_moe<Bf16Rows192>(p, workspace, stream);
  else if (block_m == 128)
    run_bf16_moe<Bf16Rows128>(p, workspace, stream);
  else
    run_bf16_moe<Bf16Rows64>(p, workspace, stream);
}

size_t fp8_moe_experts_sm90_workspace_bytes(const Sm90MoeParams& p) {
  size_t bytes = 0;
  carve_fp8(nullptr, moe_rows(p, kSm90Fp8BlockM), p.num_tokens, p.hidden, p.inter, gathers_in_producer(p, true),
            &bytes);
  return bytes;
}

void fp8_moe_experts_sm90(const Sm90MoeParams& p, void* workspace, cudaStream_t stream) {
  check_moe_shape(p, "fp8_moe_experts_sm90");
  MLA_CUDA_REQUIRE(p.w_gate_up_scale && p.w_down_scale, "fp8_moe_experts_sm90: weight scales missing");
  if (p.num_tokens == 0) return;
  // One variant for both projections (K = hidden, then inter).
  run_fp8_moe(p, workspace, stream);
}

size_t fp8_gemm_sm90_workspace_bytes(const Sm90Fp8GemmParams& p) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % kFp8Group != 0) return 0;
  return plan_dense_fp8(p).workspace_bytes;
}

int fp8_gemm_sm90_partial_splits(const Sm90Fp8GemmParams& p) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % kFp8Group != 0) return 0;
  const DenseFp8Plan plan = plan_dense_fp8(p);
  return plan.k_splits > 1 && !plan.cluster_splits ? plan.k_splits : 0;
}

std::string fp8_gemm_sm90_plan(const Sm90Fp8GemmParams& p) {
  const DenseFp8Plan plan = plan_dense_fp8(p);
  std::string s = std::to_string(plan.block_m) + "x" + std::to_string(plan.block_n);
  if (plan.k_splits > 1)
    s += ", " + std::to_string(plan.k_splits) + " splits" + (plan.cluster_splits ? " in clusters" : " + sum kernel");
  return s;
}

void fp8_gemm_sm90(const Sm90Fp8GemmParams& p, cudaStream_t stream) {
  const bool scales_fit = p.a_bf16 ? p.a_bf16_ld >= p.k && p.a_bf16_ld % 8 == 0
                                    : p.a_scale_ld % 4 == 0 && p.a_scale_ld >= p.m;
  MLA_CUDA_REQUIRE(p.m >= 0 && p.n > 0 && p.n % 8 == 0 && p.k > 0 && p.k % kFp8Group == 0 && scales_fit,
                   "fp8_gemm_sm90: needs n % 8 == 0, k % 128 == 0 and a_scale_ld >= m a multiple of 4 (bf16 a: "
                   "rows of at least k, 16-byte aligned) (m " +
                       std::to_string(p.m) + ", n " + std::to_string(p.n) + ", k " + std::to_string(p.k) + ")");
  MLA_CUDA_REQUIRE(sm90_gemm_supported(), "fp8_gemm_sm90: needs a compute capability 9.0 (Hopper) GPU");
  if (p.m == 0) return;
  run_fp8_gemm(p, stream);
}

CUtensorMap bf16_swizzled_tensor_map(const void* base, int rank, const uint64_t* dims, const uint64_t* byte_strides,
                                     const uint32_t* box, const char* what) {
  MLA_CUDA_REQUIRE(rank >= 2 && box[0] == kRowBytes / 2, std::string("tensor map for ") + what +
                                                             ": rank 2 or more and 64-value boxes");
  return encode_tensor_map(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, dims, byte_strides, box, true, what);
}

}  // namespace mlaserve::cuda

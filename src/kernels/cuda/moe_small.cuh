#pragma once
// The small-batch (decode) MoE path shared by the bf16 and block-FP8 expert
// stacks: two launches of weight-streaming GEMV kernels over the assignment
// slots of moe_align.cuh, no align step.
//   1. gate_up: one block per (slot, column tile). The block of an expert's
//      first slot computes act[slot, cols] = silu(x[t] · gate) * (x[t] · up)
//      for every slot of that expert (one per token), reading its weight rows
//      once; blocks of its later slots exit. act is bf16 {T * slots, I}.
//   2. down + combine: one block per (tile of output rows, slot) reads that
//      tile of the expert's rows once for all its slots into per-slot parts;
//      the tile's last block adds each token's parts in slot order: out is
//      written once, deterministically, with no float atomics.
// Activations stay bf16 (x) / f32 (sums) on both stacks: FP8 weights are
// dequantized in registers (16 values and one 128x128 block scale a chunk).
//
// Both kernels are programmatic dependents (pdl.cuh): each launches during
// the previous kernel's tail and waits before reading the routing. With one
// token on bf16 stacks they may instead route from the router's logits
// themselves (SmallMoeArgs::route, Backend::moe_route_experts): the decode
// chain then ends when it has written the logits. Its post-attention norm
// may be pending too (route.norm): gate_up then forms x from the residual
// row and the parts of its sum of squares, so the chain needs no exchange
// for the norm.
// NOTES: decode is bound by streaming expert weights, so every lane keeps 16
// 16-byte weight loads in flight (ld.global.nc.L1::no_allocate: read once,
// kept out of L1, where x and act, which every warp re-reads, stay), and the
// grids have thousands of small blocks so every SM streams until the end.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/moe_align.cuh"
#include "kernels/cuda/moe_route_token.cuh"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/pdl.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kSmallGateUpWarps = 4, kSmallDownWarps = 8;
// gate_up columns a warp owns at one token: half the default's, so twice the
// blocks (v2-lite: 176 per slot instead of 88) spread the slots' weight
// stream over more SMs. One token, 2 against 4 columns (perf.md session 14):
// v2-lite bf16 (BM_MoeFused) 42.0 against 45.7 us on an H200, 56.2 against
// 58.0 on an H100; V3 block-FP8 (BM_Fp8Moe) 143.8 against 150.7 us (H100).
// At 4 tokens 4 columns stay faster (126.5 against 129.7 us, H200).
constexpr int kSmallGateUpColsOneToken = 2;
constexpr int kSmallMaxSlotsPerToken = 16;
// Experts a lane holds when the kernels route (route_token's kRoutePerLane):
// up to 64 routed experts, V2-Lite's.
constexpr int kSmallRoutePerLane = 2;

// n (a multiple of 8) bf16 values at p as f32: global memory through the
// read-only path, or shared memory (kShared).
template <int kN, bool kShared = false>
__device__ __forceinline__ void load_bf16_as_f32(const __nv_bfloat16* p, float (&f)[kN]) {
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    const uint4* chunk = reinterpret_cast<const uint4*>(p) + i;
    Bf16x8 b;
    *reinterpret_cast<uint4*>(&b) = kShared ? *chunk : __ldg(chunk);
    float t[8];
    b.to_float(t);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[8 * i + j] = t[j];
  }
}

// One token's x formed from a pending norm (PendingNormParams) into shared
// memory by the warps of a gate_up block from first_warp on (those that do
// not route): the parts summed by each warp in pending_norm_scale's order,
// 16-byte chunks normed with rms_norm's arithmetic, all loads in flight at
// once. So the x of a routed block is formed while its warp 0 routes.
constexpr int kMaxPendingWidth = 2048;
constexpr int kPendingChunksPerThread = (kMaxPendingWidth / 8 + 32 * (kSmallGateUpWarps - 1) - 1) /
                                        (32 * (kSmallGateUpWarps - 1));
__device__ void form_pending_x(const PendingNormParams& n, __nv_bfloat16* x, int first_warp) {
  const int t = threadIdx.x - 32 * first_warp, stride = blockDim.x - 32 * first_warp;
  float parts[kNormPartsPerLane];
  request_norm_parts(n, parts);
  uint4 row[kPendingChunksPerThread], weight[kPendingChunksPerThread];
#pragma unroll
  for (int j = 0; j < kPendingChunksPerThread; ++j) {
    const int c = t + j * stride;
    if (c * 8 < n.width) {
      row[j] = __ldcg(reinterpret_cast<const uint4*>(n.row) + c);
      weight[j] = __ldg(reinterpret_cast<const uint4*>(n.weight) + c);
    }
  }
  const float scale = pending_norm_scale(n, parts);
#pragma unroll
  for (int j = 0; j < kPendingChunksPerThread; ++j) {
    const int c = t + j * stride;
    if (c * 8 < n.width) {
      float r[8], g[8];
      bf16x8_to_float(row[j], r);
      bf16x8_to_float(weight[j], g);
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = r[i] * scale * g[i];
      Bf16x8::from_float(r).store(x + c * 8);
    }
  }
}

// bf16 stacks (moe_experts.h): gate_up {X, 2I, D} interleaved by 8 rows,
// down {X, D, I}.
struct Bf16Stacks {
  static constexpr int kElems = 8;  // weights per 16-byte chunk
  // One token: the down kernel requests its first weights before its PDL
  // wait (v2-lite bs 1, H100: 2.48 against 2.51 ms a step).
  static constexpr bool kEarlyDownWeights = true;
  // One token: the shared experts' gate_up blocks request their first
  // weights before the PDL wait (v2-lite bs 1, H100, two calls: 2.343
  // against 2.357 ms a step, 2.351 against 2.378). It takes the kernel from
  // 80 to 127 registers; capping it at 80 (6 blocks an SM) spills: 2.70.
  static constexpr bool kEarlySharedGateUp = true;
  // One token: the kernels may route from the router's logits (the decode
  // chain's tail posts them).
  static constexpr bool kRoutesFromLogits = true;
  const __nv_bfloat16 *gate_up, *down;

  __device__ const uint8_t* gate_up_row(int e, int col, bool up, int I, int D) const {
    const int64_t row = (col / 8) * 16 + (up ? 8 : 0) + col % 8;
    return reinterpret_cast<const uint8_t*>(gate_up + (int64_t(e) * 2 * I + row) * D);
  }
  __device__ const uint8_t* down_row(int e, int d, int I, int D) const {
    return reinterpret_cast<const uint8_t*>(down + (int64_t(e) * D + d) * I);
  }
  __device__ float gate_up_scale(int, int, bool, int, int, int) const { return 1.0f; }
  __device__ float down_scale(int, int, int, int, int) const { return 1.0f; }
  __device__ static float dot(uint4 w, const float (&x)[kElems]) {
    float f[kElems];
    bf16x8_to_float(w, f);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kElems; ++i) acc = fmaf(f[i], x[i], acc);
    return acc;
  }
};

// Block-FP8 stacks (fp8_moe.h): gate_up {X, 2I, D} e4m3 (gate rows, then up
// rows) with scales {X, 2I/128, D/128}; down {X, D, I} with {X, D/128, I/128}.
struct Fp8Stacks {
  static constexpr int kElems = 16;
  // Not here: the early round's registers take the FP8 down kernel from 128
  // to 174 and an SM from two blocks to one (v3-slice bs 1, H100: 1.87
  // against 1.84 ms a step).
  static constexpr bool kEarlyDownWeights = false;
  // One token: the shared expert's blocks request their first weights while
  // moe_select routes (it lets the MoE launch at its start). 96 -> 126
  // registers, five blocks an SM to four, yet v3-slice bs 1 (H200, three
  // rounds) 1.282 against 1.287 ms a step without the host round trip
  // (within the spread with it: 1.299-1.313 against 1.302-1.305).
  static constexpr bool kEarlySharedGateUp = true;
  // Nothing posts logits for it: the decode chain runs at V2-Lite's widths.
  static constexpr bool kRoutesFromLogits = false;
  const uint8_t *gate_up, *down;
  const float *gate_up_scale_, *down_scale_;

  __device__ const uint8_t* gate_up_row(int e, int col, bool up, int I, int D) const {
    return gate_up + (int64_t(e) * 2 * I + (up ? I : 0) + col) * D;
  }
  __device__ const uint8_t* down_row(int e, int d, int I, int D) const { return down + (int64_t(e) * D + d) * I; }
  // Scale of the 128x128 block holding chunk kc of the row.
  __device__ float gate_up_scale(int e, int col, bool up, int kc, int I, int D) const {
    const int row_block = (e * 2 * I + (up ? I : 0) + col) / 128;
    return __ldg(gate_up_scale_ + int64_t(row_block) * (D / 128) + kc / 8);
  }
  __device__ float down_scale(int e, int d, int kc, int I, int D) const {
    const int row_block = (e * D + d) / 128;
    return __ldg(down_scale_ + int64_t(row_block) * (I / 128) + kc / 8);
  }
  __device__ static float dot(uint4 w, const float (&x)[kElems]) { return e4m3x16_dot(w, x); }
};

template <typename Stacks>
struct SmallMoeArgs {
  Stacks w;
  const __nv_bfloat16* x;  // {T, D}
  MoeSlots slots;
  // route.logits set (one token, Stacks::kRoutesFromLogits): blocks that need
  // the routing form it from the logits; the routing outputs (route's
  // topk_ids / topk_weights, which slots names too) receive it.
  MoeRouteParams route;
  int num_tokens, hidden, inter;
  __nv_bfloat16* act;       // {T * slots_per_token, I}
  float* part;              // {T * slots_per_token, D}: weight * down(act) of each slot
  unsigned* tile_arrivals;  // {down tiles}: zeroed by gate_up, counted by down
  int down_tiles;
  __nv_bfloat16* out;       // {T, D}
};

// Whether gate_up forms x from a pending norm (one token, routed from the
// logits, route.norm set) instead of reading it. Stacks that never route
// from logits compile the path away (it took FP8's one-token gate_up from 96
// to 128 registers, five blocks an SM to four: v3-slice bs 1 1.6% slower).
template <typename Stacks>
__host__ __device__ bool forms_pending_x(const SmallMoeArgs<Stacks>& a, int max_tok) {
  return Stacks::kRoutesFromLogits && max_tok == 1 && a.route.logits && a.route.norm.parts;
}

// One token's routing as a block forms it from the router's logits (warp 0
// runs route_token on what the kernel before wrote, ~1,000 blocks each
// reading the same 64 logits from L2).
struct BlockRoute {
  int32_t ids[kMaxTopK];
  float weights[kMaxTopK];
  float sel[32 * kSmallRoutePerLane];
  bool group_kept[32];

  // Whether the kernels route from the logits (one token, Stacks that do,
  // a.route.logits set); if so and slot0 is a routed slot, forms the routing
  // (publish: also writes it to route's outputs).
  template <typename Stacks, int kMaxTok>
  __device__ bool form(const SmallMoeArgs<Stacks>& a, int slot0, bool publish) {
    if constexpr (Stacks::kRoutesFromLogits && kMaxTok == 1) {
      if (!a.route.logits) return false;
      if (slot0 >= a.slots.top_k) return true;  // a shared expert's slot
      if (threadIdx.x < 32) {
        MoeRouteParams p = a.route;
        p.topk_ids = ids;
        p.topk_weights = weights;
        route_token<kSmallRoutePerLane>(p, 0, sel, group_kept);
        if (publish && threadIdx.x < p.top_k) {  // the lanes route_token's outputs came from
          a.route.topk_ids[threadIdx.x] = ids[threadIdx.x];
          a.route.topk_weights[threadIdx.x] = weights[threadIdx.x];
        }
      }
      __syncthreads();
      return true;
    } else {
      return false;
    }
  }
  // The slot's expert and weight: from the block's routing where form
  // returned true (routed), else as MoeSlots reads them.
  __device__ int expert(const MoeSlots& s, int slot, bool routed) const {
    return routed && slot < s.top_k ? ids[slot] : s.expert(slot);
  }
  __device__ float weight(const MoeSlots& s, int slot, bool routed) const {
    return routed && slot < s.top_k ? weights[slot] : s.weight(slot);
  }
};

// The slots of blockIdx's expert that its block computes: every slot of
// that expert (one per token, at most kMaxTok) when slot0 is the first of
// them, none when an earlier slot has it (that block does the work), only
// slot0 when a token chose the expert twice. Writes s_slot and s_n.
template <int kMaxTok>
__device__ __forceinline__ void gather_expert_slots(const MoeSlots& slots, int slot0, int total, int* s_slot,
                                                    int* s_n) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if constexpr (kMaxTok == 1) {
    if (threadIdx.x == 0) s_slot[0] = slot0, *s_n = 1;
  } else if (warp == 0) {
    const int expert = slots.expert(slot0);
    int n = 0;
    bool later = false;
    for (int base = 0; base < total; base += 32) {
      const int i = base + lane;
      const bool match = i < total && slots.expert(i) == expert;
      const unsigned mask = __ballot_sync(0xffffffffu, match);
      later |= __any_sync(0xffffffffu, match && i < slot0);
      const int pos = n + __popc(mask & ((1u << lane) - 1));
      if (match && pos < kMaxTok) s_slot[pos] = i;
      n += __popc(mask);
    }
    __syncwarp();
    if (lane == 0) {
      if (n > kMaxTok) {
        s_slot[0] = slot0;
        *s_n = 1;
      } else {
        *s_n = later ? 0 : n;
      }
    }
  }
  __syncthreads();
}

// Block (column tile blockIdx.x, slot blockIdx.y); each warp owns kCols
// columns (a gate and an up row each).
template <typename Stacks, int kMaxTok, int kCols>
__global__ void __launch_bounds__(kSmallGateUpWarps * 32) moe_small_gate_up_kernel(SmallMoeArgs<Stacks> a) {
  constexpr int kE = Stacks::kElems, kUnroll = 8 / kCols;
  __shared__ int s_slot[kMaxTok];
  __shared__ int s_n;
  __shared__ BlockRoute s_route;
  extern __shared__ __align__(16) __nv_bfloat16 s_x[];  // {D}: x formed from a pending norm
  const int per_token = a.slots.per_token(), total = a.num_tokens * per_token;
  // With one token (Stacks::kEarlySharedGateUp) the shared slots come first
  // (a rotation of the slots): their experts are known without the routing,
  // so their blocks request the first round of weights before the wait,
  // while the kernel before finishes (the decode chain's last blocks, or
  // moe_select's routing).
  constexpr bool kEarlyShared = Stacks::kEarlySharedGateUp && kMaxTok == 1;
  const int slot0 = kEarlyShared ? (int(blockIdx.y) + a.slots.top_k) % total : int(blockIdx.y);
  const bool early = kEarlyShared && slot0 % per_token >= a.slots.top_k;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col0 = (blockIdx.x * kSmallGateUpWarps + warp) * kCols;
  const int D = a.hidden, I = a.inter, chunks = D / kE;
  const uint8_t* row[kCols][2];
  auto set_rows = [&](int expert) {
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) row[c][h] = a.w.gate_up_row(expert, min(col0 + c, I - 1), h == 1, I, D);
  };
  uint4 wv[kCols][2][kUnroll];
  auto load_round = [&](int k0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kc = k0 + u * 32 + lane;
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          wv[c][h][u] = kc < chunks ? load_streamed_16(row[c][h] + int64_t(kc) * 16) : make_uint4(0, 0, 0, 0);
    }
  };
  if (early && col0 < I) {
    set_rows(a.slots.num_experts + slot0 % per_token - a.slots.top_k);
    load_round(0);
  }
  // The routing and x come from the kernel before. The down kernel may
  // launch only after this wait: it may read the routing before its own.
  pdl_wait();
  pdl_launch_dependents();
  // One token whose norm is pending (the decode chain's): x is formed once
  // into shared memory, by the warps that do not route (the loop forming
  // each chunk it read made the step 5% slower).
  const bool pending = forms_pending_x(a, kMaxTok);
  const int routing_warps = slot0 % per_token < a.slots.top_k ? 1 : 0;
  if (pending && warp >= routing_warps) form_pending_x(a.route.norm, s_x, routing_warps);
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < a.down_tiles; i += blockDim.x) a.tile_arrivals[i] = 0;
  // The routed slots' blocks route; the block of slot 0's first column tile
  // publishes the routing.
  const bool routes = s_route.form<Stacks, kMaxTok>(a, slot0, slot0 == 0 && blockIdx.x == 0);
  const int expert = s_route.expert(a.slots, slot0, routes);
  // s_x is read after gather's __syncthreads.
  gather_expert_slots<kMaxTok>(a.slots, slot0, total, s_slot, &s_n);
  const int n = s_n;
  if (n == 0 || col0 >= a.inter) return;

  int slot[kMaxTok];
  const __nv_bfloat16* xrow[kMaxTok];
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) {
    slot[t] = t < n ? s_slot[t] : slot0;
    xrow[t] = pending ? s_x : a.x + int64_t(slot[t] / per_token) * D;
  }
  if (!early) set_rows(expert);

  float acc[kCols][2][kMaxTok] = {};
  for (int k0 = 0; k0 < chunks; k0 += 32 * kUnroll) {
    if (!early || k0 > 0) load_round(k0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kc = k0 + u * 32 + lane;
      if (kc >= chunks) break;
      float scale[kCols][2];
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) scale[c][h] = a.w.gate_up_scale(expert, min(col0 + c, I - 1), h == 1, kc, I, D);
#pragma unroll
      for (int t = 0; t < kMaxTok; ++t) {
        if (t >= n) break;
        float xf[kE];
        if (pending)
          load_bf16_as_f32<kE, true>(xrow[t] + kc * kE, xf);
        else
          load_bf16_as_f32(xrow[t] + int64_t(kc) * kE, xf);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
          for (int h = 0; h < 2; ++h) acc[c][h][t] = fmaf(Stacks::dot(wv[c][h][u], xf), scale[c][h], acc[c][h][t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) {
    if (t >= n) break;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float g = warp_sum(acc[c][0][t]), u = warp_sum(acc[c][1][t]);
      if (lane == 0 && col0 + c < I)
        a.act[int64_t(slot[t]) * I + col0 + c] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
    }
  }
}

// Block (row tile blockIdx.x, slot blockIdx.y): the tile's kRowsPerWarp *
// kSmallDownWarps rows of the slot's expert, which are contiguous in the
// stack, streamed once for every slot of that expert (gather_expert_slots);
// each warp owns kRowsPerWarp rows, its lanes kUnroll 16-byte chunks of each
// per round. part[slot, rows] = weight(slot) * (act[slot] · row). The last
// block of a tile to finish adds the tile's parts of each token in slot
// order: out is written once, deterministically, with no float atomics.
// (Blocks over whole experts' rows keep every lane loading; the per-row
// walk over all experts it replaces left most lanes idle, I being short.)
template <typename Stacks, int kMaxTok, int kRowsPerWarp>
__global__ void __launch_bounds__(kSmallDownWarps * 32) moe_small_down_kernel(SmallMoeArgs<Stacks> a) {
  constexpr int kE = Stacks::kElems, kUnroll = 16 / kRowsPerWarp, kTileRows = kSmallDownWarps * kRowsPerWarp;
  __shared__ int s_slot[kMaxTok];
  __shared__ int s_n;
  __shared__ bool s_last;
  __shared__ BlockRoute s_route;
  // Early: the routing is complete (gate_up waited for it before letting
  // this kernel launch), so the block's first round of weights is requested
  // during gate_up's tail; act needs the wait.
  constexpr bool kEarly = Stacks::kEarlyDownWeights && kMaxTok == 1;
  const int slot0 = blockIdx.y, per_token = a.slots.per_token(), T = a.num_tokens, total = T * per_token;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int D = a.hidden, I = a.inter, chunks = I / kE;
  const int d0 = blockIdx.x * kTileRows, r0 = d0 + warp * kRowsPerWarp;
  if constexpr (!kEarly) pdl_enter();
  // Routing from the logits: the kernel that wrote them completed before
  // gate_up's wait returned, and this grid launched after that.
  const bool routes = s_route.form<Stacks, kMaxTok>(a, slot0, false);
  gather_expert_slots<kMaxTok>(a.slots, slot0, total, s_slot, &s_n);
  const int n = s_n;
  const bool works = n > 0 && r0 < D;
  const int expert = works ? s_route.expert(a.slots, slot0, routes) : 0;
  const uint8_t* row[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) row[r] = a.w.down_row(expert, min(r0 + r, D - 1), I, D);
  uint4 wv[kRowsPerWarp][kUnroll];
  // Round k0's 16-byte chunks of the warp's rows.
  auto load_round = [&](int k0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kc = k0 + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        wv[r][u] = kc < chunks ? load_streamed_16(row[r] + int64_t(kc) * 16) : make_uint4(0, 0, 0, 0);
    }
  };
  if constexpr (kEarly) {
    if (works) load_round(0);
    pdl_enter();
  }

  if (works) {
    int slot[kMaxTok];
    float weight[kMaxTok];
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
      slot[t] = t < n ? s_slot[t] : slot0;
      weight[t] = s_route.weight(a.slots, slot[t], routes);
    }
    float acc[kRowsPerWarp][kMaxTok] = {};
    for (int k0 = 0; k0 < chunks; k0 += 32 * kUnroll) {
      if (!kEarly || k0 > 0) load_round(k0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int kc = k0 + u * 32 + lane;
        if (kc >= chunks) break;
        float scale[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) scale[r] = a.w.down_scale(expert, min(r0 + r, D - 1), kc, I, D);
#pragma unroll
        for (int t = 0; t < kMaxTok; ++t) {
          if (t >= n) break;
          float af[kE];
          load_bf16_as_f32(a.act + int64_t(slot[t]) * I + int64_t(kc) * kE, af);
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) acc[r][t] = fmaf(Stacks::dot(wv[r][u], af), scale[r], acc[r][t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
      if (t >= n) break;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float v = warp_sum(acc[r][t]);
        if (lane == 0 && r0 + r < D) a.part[int64_t(slot[t]) * D + r0 + r] = weight[t] * v;
      }
    }
  }

  // Arrive at the tile; the last of its gridDim.y blocks sums the parts.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's parts are visible before its arrival
    s_last = atomicAdd(a.tile_arrivals + blockIdx.x, 1u) == gridDim.y - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < T * kTileRows; i += blockDim.x) {
    const int t = i / kTileRows, d = d0 + i % kTileRows;
    if (d >= D) continue;
    float sum = 0.0f;
    for (int j = 0; j < per_token; ++j) sum += __ldcg(a.part + int64_t(t * per_token + j) * D + d);
    a.out[int64_t(t) * D + d] = __float2bfloat16(sum);
  }
}

constexpr size_t small_moe_round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Output rows a down block covers.
constexpr int small_down_tile_rows(int down_rows_per_warp) { return kSmallDownWarps * down_rows_per_warp; }

// Workspace of the small path: act, the per-slot parts, the tile counters.
inline size_t small_moe_workspace_bytes(int tokens, int per_token, int hidden, int inter, int down_rows_per_warp) {
  const size_t slots = size_t(tokens) * per_token, tiles = (hidden + small_down_tile_rows(down_rows_per_warp) - 1) /
                                                          small_down_tile_rows(down_rows_per_warp);
  return small_moe_round_up(slots * inter * 2) + small_moe_round_up(slots * hidden * 4) + tiles * 4;
}

template <typename Stacks, int kMaxTok>
void launch_small_moe(SmallMoeArgs<Stacks> a, int gate_up_cols, int down_rows_per_warp, void* workspace,
                      cudaStream_t stream, const char* op) {
  const int slots = a.num_tokens * a.slots.per_token();
  const int tile_rows = small_down_tile_rows(down_rows_per_warp);
  auto* ws = static_cast<uint8_t*>(workspace);
  a.act = reinterpret_cast<__nv_bfloat16*>(ws);
  ws += small_moe_round_up(size_t(slots) * a.inter * 2);
  a.part = reinterpret_cast<float*>(ws);
  ws += small_moe_round_up(size_t(slots) * a.hidden * 4);
  a.tile_arrivals = reinterpret_cast<unsigned*>(ws);
  a.down_tiles = (a.hidden + tile_rows - 1) / tile_rows;

  const int cols_per_block = kSmallGateUpWarps * gate_up_cols;
  const dim3 gate_up_grid((a.inter + cols_per_block - 1) / cols_per_block, slots);
  const int gate_up_threads = kSmallGateUpWarps * 32, down_threads = kSmallDownWarps * 32;
  const auto gate_up_kernel = gate_up_cols == 1   ? moe_small_gate_up_kernel<Stacks, kMaxTok, 1>
                              : gate_up_cols == 2 ? moe_small_gate_up_kernel<Stacks, kMaxTok, 2>
                              : gate_up_cols == 4 ? moe_small_gate_up_kernel<Stacks, kMaxTok, 4>
                                                  : nullptr;
  MLA_CUDA_REQUIRE(gate_up_kernel, std::string(op) + ": gate_up columns per warp must be 1, 2 or 4");
  const size_t x_bytes = forms_pending_x(a, kMaxTok) ? sizeof(__nv_bfloat16) * a.hidden : 0;
  launch_dependent(gate_up_kernel, gate_up_grid, gate_up_threads, x_bytes, stream, a);
  check_launch(op);
  const dim3 down_grid(a.down_tiles, slots);
  const auto down_kernel = down_rows_per_warp == 2   ? moe_small_down_kernel<Stacks, kMaxTok, 2>
                           : down_rows_per_warp == 4 ? moe_small_down_kernel<Stacks, kMaxTok, 4>
                           : down_rows_per_warp == 8 ? moe_small_down_kernel<Stacks, kMaxTok, 8>
                                                     : nullptr;
  MLA_CUDA_REQUIRE(down_kernel, std::string(op) + ": down rows per warp must be 2, 4 or 8");
  launch_dependent(down_kernel, down_grid, down_threads, 0, stream, a);
  check_launch(op);
}

// Both launches for T <= 8 tokens (kernels instantiated for 1, 2, 4, 8);
// workspace holds small_moe_workspace_bytes.
template <typename Stacks>
void run_small_moe(const SmallMoeArgs<Stacks>& a, int gate_up_cols, int down_rows_per_warp, void* workspace,
                   cudaStream_t stream, const char* op) {
  MLA_CUDA_REQUIRE(a.num_tokens >= 1 && a.num_tokens <= 8 && a.slots.per_token() <= kSmallMaxSlotsPerToken &&
                       a.hidden % Stacks::kElems == 0 && a.inter % Stacks::kElems == 0,
                   std::string(op) + ": the small path takes 1 to 8 tokens of at most 16 slots");
  if (gate_up_cols == 0) gate_up_cols = a.num_tokens == 1 ? kSmallGateUpColsOneToken : 4;
  if (a.num_tokens <= 1) launch_small_moe<Stacks, 1>(a, gate_up_cols, down_rows_per_warp, workspace, stream, op);
  else if (a.num_tokens <= 2) launch_small_moe<Stacks, 2>(a, gate_up_cols, down_rows_per_warp, workspace, stream, op);
  else if (a.num_tokens <= 4) launch_small_moe<Stacks, 4>(a, gate_up_cols, down_rows_per_warp, workspace, stream, op);
  else launch_small_moe<Stacks, 8>(a, gate_up_cols, down_rows_per_warp, workspace, stream, op);
}

}  // namespace
}  // namespace mlaserve::cuda

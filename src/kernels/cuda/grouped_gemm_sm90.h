#pragma once
// Hopper (sm_90a) grouped GEMMs for the MoE experts and block-FP8 linears:
// wgmma tensor-core products fed by TMA bulk-tensor loads into a multi-stage
// shared-memory ring (mbarrier full/empty pairs), one producer warpgroup and
// two (three for 192-row tiles) consumer warpgroups, persistent over the
// output tiles.
//
//   bf16: 128 x 256 tiles (each consumer warpgroup 64 x 256) or 64 x 256
//         (each 64 x 128), K blocks of 64.
//   fp8:  64 x 256 tiles (MoE; each consumer warpgroup 64 x 128), 128 x 128
//         (dense; each 64 x 128), 128 x 192 (dense; each 64 x 192) or
//         192 x 128 (three consumer warpgroups; MoE: runs of an expert's
//         blocks), K blocks of 128; e4m3 x e4m3 wgmma
//         accumulates one 128-wide K block, then the f32 totals add it times
//         (activation scale of the row) x (weight scale of the 128 x 128
//         block), DeepSeek's 1x128 / 128x128 scheme; that promotion runs
//         while the next K block is on the tensor cores (128 x 128 and
//         64 x 256), or, where registers allow one partial set only, while
//         the other warpgroups' products are (they take turns issuing).
//
// MoE entry points: align the slots by expert (each expert's run padded to
// the tile's row count), gate_up with the x rows gathered by the producer
// warpgroup (cp.async; TMA loads only rectangles) and SiLU-and-mul fused in
// the epilogue, down, and the weighted combine. The fp8 path quantizes x per
// token first; gate_up's epilogue on the 64 x 256 tiles writes the
// activations' FP8 rows itself (the 192 x 128 run tiles: a pass after it).
//
// Only for compute capability 9.0 (sm90_gemm_supported()); the callers keep
// their portable paths for other GPUs and for short (decode) batches, where
// padding every expert to 128 or 64 rows wastes the work. Measured on an
// H200 (docs/sm90_gemm.md, perf.md session 5): the bf16 path beats
// moe_experts()' grouped mma.sync path from 64 tokens at v2-lite (328 vs
// 344 us), 1.8x at 4096; the fp8 path beats fp8_moe_experts()' grouped path
// from 16 tokens of V3 (1.17 vs 1.21 ms; 1.8x at 512, 9x at 4096).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/moe_batch.h"

namespace mlaserve::cuda {

// True when the current device is a Hopper GPU (compute capability 9.0).
bool sm90_gemm_supported();

// Row tile of the fp8 path; the MoE align step pads each expert's run to it.
constexpr int kSm90Fp8BlockM = 64;

// Kernel variants (the benchmark and the tests sweep them); zero / negative
// values pick the measured best.
struct Sm90GemmVariant {
  // bf16 MoE: 128: 128 x 256 tiles; 64: 64 x 256 tiles (less padding per expert); 192: runs of one to
  // three of an expert's 64-row blocks on three consumer warpgroups (192 x 256 tiles, x copied into
  // expert order first); 0: by shape
  int bf16_block_m = 0;
  int fp8_overlap_promotion = -1;  // 1: block k is scaled and added while block k + 1 multiplies; 0: in turn
  // dense fp8 only: 64 (64 x 256 tiles), 128 (128 x 128, overlapped) or 192 (192 x 128, three consumer
  // warpgroups); 0: 64 up to 64 rows, else 128
  int fp8_block_m = 0;
  // MoE gate_up: 1: the GEMM's producer warpgroup gathers x rows (cp.async; fp8: x quantized per token
  // first); 0: x is first copied (bf16) or quantized (fp8) into expert order, loaded by TMA;
  // -1: 1 for bf16, for fp8 up to 1536 tokens.
  int gather_in_producer = -1;
  int fp8_k_splits = 0;  // dense fp8 only: K ranges per output tile (see fp8_cluster_splits); 0: by shape
  // Where A comes by TMA and K is not split: 2: CTAs in clusters of two take row tiles 2i, 2i + 1 and,
  // when both are one group's (dense: always; MoE: the same expert), load each weight tile once for
  // both (TMA multicast); 1: one CTA a tile; 0: the measured default (2 for the fp8 MoE, else 1).
  int cluster_m = 0;
  // fp8 MoE whose A comes by TMA (gather_in_producer 0): 64: 64 x 256 tiles; 192: units of one to
  // three of an expert's 64-row blocks on three consumer warpgroups (192 x 128 tiles), so each of
  // the expert's weight tiles is read once for all its rows; 0: 192 (measured faster).
  int fp8_moe_block_m = 0;
  // dense fp8 on 128-row tiles: 128 (128 x 128 tiles) or 192 (128 x 192, serial promotion); 0: 128
  int fp8_block_n = 0;
  // dense fp8 split K: 1: a tile's 2 or 4 splits run as one cluster and add their sums in distributed
  // shared memory; -1: f32 partials in global memory, then a sum kernel; 0: by the plan
  int fp8_cluster_splits = 0;
};

// MoE experts of one layer. Slots: each token has top_k + num_shared slots;
// slot j < top_k is routed expert topk_ids[t, j] with weight topk_weights[t, j],
// slot top_k + i is shared expert i, stacked after the routed ones as expert
// num_experts + i, with weight 1. out[t] = addend[t] (if given) + sum over
// the token's slots of weight * down(silu(gate(x[t])) * up(x[t])).
// Weights stacked over the num_experts + num_shared experts:
//   bf16: gate_up {E + S, 2I, D} interleaved by 8 rows (moe_experts.h's
//         gate_up_row()), down {E + S, D, I};
//   fp8:  gate_up {E + S, 2I, D} e4m3, gate rows then up rows, scales
//         {E + S, 2I/128, D/128}; down {E + S, D, I}, scales {E + S, D/128, I/128}.
// hidden % 256 == 0, inter % 128 == 0, top_k + num_shared <= 16.
struct Sm90MoeParams : MoeBatch {
  const void* w_gate_up = nullptr;   // __nv_bfloat16 (bf16 path) or e4m3 bytes (fp8 path)
  const void* w_down = nullptr;
  const float* w_gate_up_scale = nullptr;  // fp8 path only
  const float* w_down_scale = nullptr;     // fp8 path only
  const __nv_bfloat16* addend = nullptr;   // {T, D} or null
  Sm90GemmVariant variant;
};

// bf16 weights, 128 x 256 or 64 x 256 tiles.
size_t moe_experts_sm90_workspace_bytes(const Sm90MoeParams& p);
void moe_experts_sm90(const Sm90MoeParams& p, void* workspace, cudaStream_t stream);

// Block-FP8 weights: up to 1536 tokens 64 x 256 tiles with x gathered by the
// producer; above, x quantized into expert order and runs of an expert's
// 64-row blocks on 192 x 128 tiles (fp8_moe_block_m); x is quantized 1x128,
// the activations 1x128 in the gate_up epilogue (64 x 256 tiles) or after it.
size_t fp8_moe_experts_sm90_workspace_bytes(const Sm90MoeParams& p);
void fp8_moe_experts_sm90(const Sm90MoeParams& p, void* workspace, cudaStream_t stream);

// --- dense block-FP8 GEMM: out{M, N} = (a * a_scale) · (w * w_scale)ᵀ in bf16.
// a {M, K} e4m3 with scales a_scale[kb * a_scale_ld + row] (fp8_quant.h's
// layout, a_scale_ld % 4 == 0), w {N, K} e4m3 with w_scale {ceil(N/128), K/128}.
// K % 128 == 0, N % 8 == 0. Tiles: 64 x 256 up to 64 rows, 128 x 128 above.
// Decode-sized M splits K across the SMs, so the weights stream from every
// SM: a tile's 2 or 4 splits run as one cluster adding their sums through
// distributed shared memory, or (other counts, or more clusters than fit at
// once) they store f32 partial sums in the workspace that a second kernel
// adds; either way in split order. M = 1 works (the TMA zero-fills the tile's missing
// rows). Launched with PDL: the first weight tiles load while the kernel
// that wrote a is still finishing.
constexpr int kSm90QuantizeMaxRows = 8;
struct Sm90Fp8GemmParams {
  const uint8_t* a = nullptr;
  const float* a_scale = nullptr;
  int64_t a_scale_ld = 0;
  const uint8_t* w = nullptr;
  const float* w_scale = nullptr;
  __nv_bfloat16* out = nullptr;
  // Or, for at most kSm90QuantizeMaxRows rows: bf16 a {M, K} (rows a_bf16_ld
  // apart), quantized 1x128 inside the GEMM exactly as fp8_quant.h does, so
  // a decode linear runs no quantization kernel; a and a_scale are unused.
  const __nv_bfloat16* a_bf16 = nullptr;
  int64_t a_bf16_ld = 0;
  int m = 0, n = 0, k = 0;
  void* workspace = nullptr;  // fp8_gemm_sm90_workspace_bytes(): the split-K partial sums
  // Where the plan stores f32 partials (fp8_gemm_sm90_partial_splits > 0):
  // leave them in the workspace, at [(s * m + row) * n + col], for the
  // consumer to add in split order (out is not written).
  bool defer_split_sum = false;
  Sm90GemmVariant variant;
};
size_t fp8_gemm_sm90_workspace_bytes(const Sm90Fp8GemmParams& p);
// The K splits whose f32 partials the plan stores in the workspace (then
// adds with a sum kernel), or 0 (one split, or splits summed in clusters).
int fp8_gemm_sm90_partial_splits(const Sm90Fp8GemmParams& p);
void fp8_gemm_sm90(const Sm90Fp8GemmParams& p, cudaStream_t stream);
// How fp8_gemm_sm90 runs p, e.g. "64x256, 4 splits in clusters" (benchmark labels).
std::string fp8_gemm_sm90_plan(const Sm90Fp8GemmParams& p);

}  // namespace mlaserve::cuda

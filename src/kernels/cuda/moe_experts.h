#pragma once
// Fused MoE expert computation over all experts of a layer: the routed ones
// and the shared ones, folded in as num_shared extra experts (stacked after
// the routed ones) that every token selects with weight 1.0. Three paths,
// chosen by shape (moe_path): Small up to kMoeSmallMaxTokens tokens, Sm90
// (grouped_gemm_sm90.h, Hopper only) from kMoeSm90MinTokens, Grouped between
// and wherever the others do not apply:
//
// Grouped:
//   1. align: group the assignment slots (moe_align.cuh) by expert, each
//      expert's run padded to the GEMM's row block, plus each slot's position;
//   2. gate_up: one grouped GEMM over every active expert (tensor cores),
//      rows gathered from x by token, SiLU-and-mul in its epilogue;
//   3. down: one grouped GEMM over the activated rows;
//   4. combine: out[t] = sum over the token's slots of weight * y[pos(slot)].
// Small (decode, T <= kMoeSmallMaxTokens; moe_small.cuh, shared with the FP8
// path): two launches of weight-streaming GEMV kernels, no align step:
//   1. gate_up: one block per (slot, column tile); the first slot of each
//      expert gathers all the slots that share it (others exit), so each
//      expert's weights are read once; SiLU-and-mul fused; act{slots, I};
//   2. down + combine: one block per (tile of output rows, slot) reads that
//      tile of the slot's expert once for all its slots; the tile's last
//      block adds each token's slots in slot order, so out is written once,
//      in a fixed order (deterministic, no float atomics).
//
// Expert weights are stacked at load time: gate_up {E + S, 2I, D} and down
// {E + S, D, I}. gate_up interleaves gate and up rows in groups of 8 (rows
// 16j .. 16j+7 are gate rows 8j .. 8j+7, rows 16j+8 .. 16j+15 the up rows of
// the same columns; gate_up_row() gives the mapping), so one thread's
// accumulators hold both halves of each SiLU-and-mul pair.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/moe_batch.h"
#include "kernels/cuda/moe_router.h"

namespace mlaserve::cuda {

// Sm90: grouped_gemm_sm90.h's wgmma/TMA kernels (Hopper, prefill-sized
// batches; Auto takes it from kMoeSm90MinTokens tokens when the widths fit).
enum class MoePath { Auto, Grouped, Small, Sm90 };

// Launch shape of the small path (benchmarks sweep it; Auto uses the default).
struct MoeSmallTuning {
  // Intermediate columns (a gate and an up row each) per warp: 1, 2, 4; 0: by
  // batch (kSmallGateUpColsOneToken for one token, else 4).
  int gate_up_cols_per_warp = 0;
  int down_rows_per_warp = 8;     // output rows one warp owns (a down block: 8 warps): 2, 4, 8
};

struct MoeExpertsParams : MoeBatch {
  const __nv_bfloat16* w_gate_up = nullptr;  // {E + S, 2I, D}, gate/up interleaved by 8 rows
  const __nv_bfloat16* w_down = nullptr;     // {E + S, D, I}
  MoePath path = MoePath::Auto;
  MoeSmallTuning tuning;
  // route.logits set (where moe_routes_in_kernels): the small path's kernels
  // route the token from these logits themselves and write the routing to
  // route's topk_ids / topk_weights (topk_ids / topk_weights above must name
  // the same buffers) instead of reading it; with route.norm set, x is
  // formed from route.norm's row instead of read (x is not written).
  MoeRouteParams route;
};

// Row of the stacked gate_up matrix holding gate (is_up false) or up row i.
constexpr int64_t gate_up_row(int64_t i, bool is_up) { return (i / 8) * 16 + (is_up ? 8 : 0) + i % 8; }

// Largest batch the small path takes, and the most slots (top_k + shared) a
// token may have there. bf16 at v2-lite widths on an H200 (BM_MoeFused):
// small vs grouped 49 vs 68 us at 1 token, 76 vs 84 at 2, 133 vs 132 at 4,
// 306 vs 210 at 8, so bf16 stops at 4 (the tiled down kernel since took the
// small path to 44 / 69 / 124 us at 1 / 2 / 4). FP8 at V3 widths (BM_Fp8Moe): 129 vs
// 188 us at 1 token, 1235 vs 784 at 8 (2-4 not measured), so it stops at 4 too.
constexpr int kMoeSmallMaxTokens = 4, kFp8MoeSmallMaxTokens = 4, kMoeSmallMaxSlots = 16;
// Smallest batch Auto sends to the Hopper kernels (bf16 stacks). H200,
// v2-lite widths with the 2 shared experts (BM_MoeFused, perf.md session 5),
// grouped mma.sync path vs Hopper kernels: 32 tokens 321 vs 326 us, 64: 344
// vs 328, 96: 365 vs 336, 128: 399 vs 336, 256: 400 vs 341 (1.8x at 4096).
constexpr int kMoeSm90MinTokens = 64;

// The path a batch takes (shape-only, so graph-capturable decisions).
MoePath moe_path(const MoeExpertsParams& p);
// Whether p's kernels can route from logits (MoeExpertsParams::route): one
// token on the small path, at most 64 routed experts.
bool moe_routes_in_kernels(const MoeExpertsParams& p);
// The grouped GEMM's row block: 16 when experts see few rows, 64 otherwise.
int moe_block_m(int num_tokens, int slots_per_token, int num_experts);
// Workspace for the path of this shape (the pointers in p are not read).
size_t moe_workspace_bytes(const MoeExpertsParams& p);

// Runs the op; `workspace` holds moe_workspace_bytes(p) bytes.
void moe_experts(const MoeExpertsParams& p, void* workspace, cudaStream_t stream);

// The grouped GEMM alone, for benchmarks: c[m, :N] = a[row(m), :K] · w[e(m)]ᵀ.
struct GroupedGemmParams {
  const __nv_bfloat16* a = nullptr;
  const int32_t* sorted_ids = nullptr;  // {max rows}: assignment slot, or the pad sentinel
  const int32_t* block_expert = nullptr;  // {max blocks}
  const int32_t* num_padded = nullptr;    // {1}: rows in use
  const __nv_bfloat16* w = nullptr;       // {E, N, K}
  __nv_bfloat16* c = nullptr;             // {max rows, N}
  int n = 0, k = 0, slots_per_token = 1, pad_sentinel = 0, max_blocks = 0;
  bool gather_a = false;  // a row = sorted_ids[m] / slots_per_token (x by token), else a row = m;
                          // gather_a also fuses SiLU-and-mul (c is {max rows, N / 2})
};

}  // namespace mlaserve::cuda

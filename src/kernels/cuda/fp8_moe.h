#pragma once
// Fused MoE experts in block FP8 (DeepSeek-V3 checkpoints as shipped), the
// shared experts folded in as num_shared extra experts stacked after the
// routed ones (assignment slots as in moe_align.cuh):
//   1. quantize x per token per 128 channels (fp8_quant.h);
//   2. align: group the assignment slots by expert, each expert's run
//      padded to block_m rows (one GEMM row chunk never mixes experts);
//   3. gate_up: ONE grouped block-scaled FP8 GEMM launch over every active
//      expert (fp8_gemm.h, rows gathered from x_q by token);
//   4. SiLU-and-mul fused with the 1x128 quantization of its output;
//   5. down: ONE grouped FP8 GEMM launch over the activated rows;
//   6. combine: out[t] = sum over the token's slots of weight * y[pos(slot)]
//      (weight 1 for the shared experts), f32 sums.
// Batches of at most kFp8MoeSmallMaxTokens tokens take the small path instead
// (moe_small.cuh, as the bf16 experts do): two GEMV launches that dequantize
// the FP8 weights in registers against bf16 activations (no activation
// quantization, no align step).
// NOTES: the grouped GEMM is fp8_gemm.h's kernel: near the bandwidth limit
// while experts see <= 8 rows (decode), conversion-bound beyond (prefill;
// docs/fp8.md has the numbers and what would fix it).
// Expert weights are stacked at load time: gate_up {E + S, 2I, D} e4m3 (gate
// rows then up rows) with scales {E + S, 2I/128, D/128}, down {E + S, D, I}
// with scales {E + S, D/128, I/128}. D and I multiples of 128.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/moe_experts.h"

namespace mlaserve::cuda {

struct Fp8MoeParams : MoeBatch {
  const uint8_t* w_gate_up = nullptr;
  const float* w_gate_up_scale = nullptr;
  const uint8_t* w_down = nullptr;
  const float* w_down_scale = nullptr;
  MoePath path = MoePath::Auto;
  MoeSmallTuning tuning;
};

// Smallest batch Auto sends to the Hopper kernels (grouped_gemm_sm90.h).
// Measured at V3 widths on an H200 (docs/sm90_gemm.md, perf.md session 5),
// grouped path vs Hopper kernels (medians): 6 tokens 0.58 ms vs 0.60, 8:
// 0.72 vs 0.73, 12: 0.99 vs 0.97, 16: 1.21 vs 1.17, 32: 1.92 vs 1.81, 48:
// 2.31 vs 2.18, 64: 2.62 vs 2.49, 96: 2.89 vs 2.76, 128: 3.03 vs 2.87, 256:
// 4.06 vs 2.95, 512: 5.35 vs 2.99. They cross near 10.
// Both stream all expert weights; the grouped path is conversion-bound once
// rows pass decode sizes. (v3-slice decode at bs 96 took 9.0 ms a step on
// the grouped path against 8.5 at bs 128 on these kernels.)
constexpr int kFp8MoeSm90MinTokens = 16;

// The path a batch takes (shape-only).
MoePath fp8_moe_path(const Fp8MoeParams& p);

// Rows per GEMM chunk: about the rows an active expert sees (8 in decode,
// 128 in long prefill). Shape-only, so decode steps stay graph-capturable.
int fp8_moe_block_m(int num_tokens, int slots_per_token, int num_experts);
// Workspace for this shape (the pointers in p are not read).
size_t fp8_moe_workspace_bytes(const Fp8MoeParams& p);
void fp8_moe_experts(const Fp8MoeParams& p, void* workspace, cudaStream_t stream);

}  // namespace mlaserve::cuda

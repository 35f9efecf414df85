#pragma once
// Fused MoE expert computation over all routed experts of a layer:
//   1. align: group the (token, k) assignments by expert, each expert's run
//      padded to the GEMM's row block, plus each assignment's sorted position;
//   2. gate_up: one grouped GEMM over every active expert (tensor cores),
//      rows gathered from x by token, SiLU-and-mul in its epilogue;
//   3. down: one grouped GEMM over the activated rows;
//   4. combine: out[t] = sum_j w[t, j] * y[pos(t, j)] (+ an optional addend,
//      the shared experts' output).
// Expert weights are stacked at load time: gate_up {E, 2I, D} and down
// {E, D, I}. gate_up interleaves gate and up rows in groups of 8 (rows
// 16j .. 16j+7 are gate rows 8j .. 8j+7, rows 16j+8 .. 16j+15 the up rows of
// the same columns; gate_up_row() gives the mapping), so one thread's
// accumulators hold both halves of each SiLU-and-mul pair.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mlaserve::cuda {

struct MoeExpertsParams {
  const __nv_bfloat16* x = nullptr;        // {T, D}
  const __nv_bfloat16* w_gate_up = nullptr;  // {E, 2I, D}, gate/up interleaved by 8 rows
  const __nv_bfloat16* w_down = nullptr;   // {E, D, I}
  const int32_t* topk_ids = nullptr;       // {T, k}
  const float* topk_weights = nullptr;     // {T, k}
  const __nv_bfloat16* addend = nullptr;   // {T, D} or null, added to the output
  int num_tokens = 0, hidden = 0, inter = 0, num_experts = 0, top_k = 0;
  __nv_bfloat16* out = nullptr;  // {T, D}
};

// Row of the stacked gate_up matrix holding gate (is_up false) or up row i.
constexpr int64_t gate_up_row(int64_t i, bool is_up) { return (i / 8) * 16 + (is_up ? 8 : 0) + i % 8; }

// The row block of the grouped GEMM for a batch: 16 when experts see few
// rows (decode), 64 otherwise. Depends on the shape only (graph-safe).
int moe_block_m(int num_tokens, int top_k, int num_experts);
size_t moe_workspace_bytes(int num_tokens, int top_k, int num_experts, int hidden, int inter);

// Runs steps 1-4; `workspace` holds moe_workspace_bytes(...) bytes.
void moe_experts(const MoeExpertsParams& p, void* workspace, cudaStream_t stream);

// The grouped GEMM alone, for benchmarks: c[m, :N] = a[row(m), :K] · w[e(m)]ᵀ.
struct GroupedGemmParams {
  const __nv_bfloat16* a = nullptr;
  const int32_t* sorted_ids = nullptr;  // {max rows}: assignment index t*k + j, or the pad sentinel
  const int32_t* block_expert = nullptr;  // {max blocks}
  const int32_t* num_padded = nullptr;    // {1}: rows in use
  const __nv_bfloat16* w = nullptr;       // {E, N, K}
  __nv_bfloat16* c = nullptr;             // {max rows, N}
  int n = 0, k = 0, top_k = 1, pad_sentinel = 0, max_blocks = 0;
  bool gather_a = false;  // a row = sorted_ids[m] / top_k (x by token), else a row = m;
                          // gather_a also fuses SiLU-and-mul (c is {max rows, N / 2})
};

}  // namespace mlaserve::cuda

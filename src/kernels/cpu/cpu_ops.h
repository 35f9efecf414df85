#pragma once
// The CPU reference ops behind CpuBackend, as free functions over host f32
// activations (the backend class only checks shapes and dispatches).
#include <cstdint>

#include "kernels/backend.h"

namespace mlaserve::cpu {

// n elements of a weight-like tensor (F32, BF16, F16) from element `offset`, as f32.
void to_f32(const Tensor& t, int64_t offset, int64_t n, float* out);

// Rows [n0, n1) of a linear weight {N, K} as f32 into out{n1 - n0, K};
// block-FP8 rows are multiplied by their 128x128 block's scale_inv.
void weight_rows_f32(const Weight& w, int64_t n0, int64_t n1, float* out);

// out{T, N} = x{T, K} · Wᵀ (row strides: x ldx, out ldo), f32 accumulation.
void linear(const float* x, int64_t ldx, int64_t T, const Weight& w, float* out, int64_t ldo);

void mla_prepare(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots, const Tensor& inv_freq,
                 float cos_sin_scale);

void mla_attention_absorbed(const Tensor& q, const Tensor& cache, const ForwardBatch& batch, float scale,
                            Tensor out);
void mla_attention_expanded(const Tensor& q, const Tensor& kv, const Tensor& k_pe, const ForwardBatch& batch,
                            float scale, Tensor out);

void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor topk_ids,
               Tensor topk_weights);
void moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids,
                 const Tensor& topk_weights, Tensor out);

}  // namespace mlaserve::cpu

#pragma once
// The dense MLP half of a block. (A MoE block's half is two backend ops,
// moe_select and moe_experts, which DeepseekModel::run_block calls itself:
// at decode batch 1 the selection may come from the attention op.)
#include "kernels/backend.h"
#include "model/layer_weights.h"

namespace mlaserve {

// out{T, D} = down(silu(gate(h)) * up(h)), h from `in`; the norm and the
// SiLU run inside the ops that feed the projections (Backend::rms_norm_linears,
// silu_and_mul_linear), so an FP8 backend quantizes h and the SiLU output as
// it forms them.
void dense_mlp(Backend& backend, const MlpWeights& w, const ResidualNorm& in, Tensor out);

}  // namespace mlaserve

#pragma once
// The dense MLP half of a block. (A MoE block's half is two backend ops,
// moe_select and moe_experts, which DeepseekModel::run_block calls itself:
// at decode batch 1 the selection may come from the attention op.)
#include "kernels/backend.h"
#include "model/layer_weights.h"

namespace mlaserve {

// out{T, D} = down(silu(gate(h)) * up(h))
void dense_mlp(Backend& backend, const MlpWeights& w, const Tensor& h, Tensor out);

}  // namespace mlaserve

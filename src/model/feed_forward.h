#pragma once
// The MLP half of a block: dense SwiGLU MLP or the MoE (routed experts plus
// always-on shared experts).
#include "kernels/backend.h"
#include "model/layer_weights.h"

namespace mlaserve {

// out{T, D} = down(silu(gate(h)) * up(h))
void dense_mlp(Backend& backend, const MlpWeights& w, const Tensor& h, Tensor out);

// out{T, D} = sum over the routed top-k of weight * expert(h) + shared(h), in
// one moe_experts call (the experts were loaded with the shared ones).
void moe_block(Backend& backend, const MoeWeights& w, const Tensor& h, Tensor out);

}  // namespace mlaserve

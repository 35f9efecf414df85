#pragma once
// The weights of one DeepSeek decoder block (and of the MTP block), loaded
// from a checkpoint onto a backend under their Hugging Face names.
#include <optional>
#include <string>

#include "io/checkpoint.h"
#include "kernels/backend.h"

namespace mlaserve {

struct MlaWeights {
  // q_proj (or q_a_proj) and kv_a_proj_with_mqa both read the block input, so
  // where their rows stack (same dtype and in_features; block-FP8 also needs
  // the q part to fill whole 128-row scale blocks) they load as one Weight,
  // rows [q part | kv_a part], run as one GEMM (SGLang's
  // fused_qkv_a_proj_with_mqa); the separate ones are then left empty.
  std::optional<Weight> fused_qkv_a_proj;        // {Nq + L + R, D}
  std::optional<Weight> q_proj;                  // q_lora_rank null (V2-Lite), unless fused
  std::optional<Weight> q_a_proj;                // q_lora_rank set, unless fused
  std::optional<Weight> q_b_proj;                // q_lora_rank set
  Tensor q_a_layernorm;
  std::optional<Weight> kv_a_proj_with_mqa;      // {L + R, D}, unless fused
  Tensor kv_a_layernorm;                         // {L}
  Weight kv_b_proj;                              // {H * (Dn + Dv), L}
  // kv_b_proj split per head for the absorbed form: block-FP8 as the
  // checkpoint stores it where the per-head parts are whole 128-row blocks
  // and the backend keeps FP8 weights (half the bytes a decode step reads),
  // with W_UK transposed per head so both products read whole weight rows;
  // otherwise dequantized, in the backend's activation dtype (f32 on the
  // CPU, bf16 on CUDA).
  Weight w_uk;                                   // {H, Dn, L}, or FP8 {H, L, Dn}
  Weight w_uv;                                   // {H, Dv, L}
  bool w_uk_transposed() const { return w_uk.is_fp8(); }
  Weight o_proj;                                 // {D, H * Dv}
};

// A dense SwiGLU MLP. Where gate_proj and up_proj rows stack (see
// load_stacked_linear), they load as one weight {2I, D} and run as one GEMM;
// otherwise separately.
struct MlpWeights {
  std::optional<Weight> gate_up_proj;            // [gate rows | up rows]
  std::optional<Weight> gate_proj, up_proj;      // unless stacked
  Weight down_proj;
};

struct MoeWeights {
  Weight router;                                 // gate.weight {E, D}
  Tensor chain_router_fold;                      // Backend::mla_chain_router_fold's (or undefined)
  Tensor score_correction_bias;                  // noaux_tc only, else undefined
  ExpertWeights experts;                         // routed and shared experts (moe_experts sums both)
  RouterParams routing;
};

struct DecoderLayerWeights {
  Tensor input_layernorm, post_attention_layernorm;
  MlaWeights attn;
  std::optional<MlpWeights> mlp;                 // dense layers
  std::optional<MoeWeights> moe;                 // MoE layers
};

// The NextN block: enorm(embed(next token)) and hnorm(hidden) concatenated,
// eh_proj, a decoder block, then shared_head (norm + head).
struct MtpWeights {
  Tensor embed_tokens, enorm, hnorm;
  Weight eh_proj;                                // {D, 2D}
  DecoderLayerWeights block;
  Tensor shared_head_norm;
  Weight shared_head;                            // {V, D}
};

// A linear weight `prefix`.weight (with `prefix`.weight_scale_inv when FP8).
Weight load_linear(const Checkpoint& ckpt, Backend& backend, const std::string& prefix);
// Any other tensor by full name, checked against the expected shape.
Tensor load_param(const Checkpoint& ckpt, Backend& backend, const std::string& name, const Shape& shape);

// Block `index` under "model.layers.{index}." (the MTP block too).
DecoderLayerWeights load_decoder_layer(const Checkpoint& ckpt, Backend& backend, int index);
MtpWeights load_mtp(const Checkpoint& ckpt, Backend& backend, int index);

}  // namespace mlaserve

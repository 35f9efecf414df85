// The tensor names and shapes of a DeepSeek checkpoint, exactly as the
// Hugging Face releases spell them. Which weights are FP8 follows
// DeepSeek-V3's release: every linear layer of the decoder blocks (and of the
// V3.2 indexer's wq_b and wk) is FP8 with weight_scale_inv; embeddings, norms,
// the router gate, e_score_correction_bias (F32), lm_head, the MTP eh_proj
// and shared head, and the indexer's weights_proj stay high precision.
#include "io/checkpoint.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mlaserve {
namespace {

class ExpectedList {
 public:
  void linear(const std::string& name, int64_t out, int64_t in) { v_.push_back({name, {out, in}, true}); }
  void high_precision(const std::string& name, Shape shape, DType dtype = DType::BF16) {
    v_.push_back({name, std::move(shape), false, dtype});
  }
  std::vector<ExpectedTensor> take() { return std::move(v_); }

 private:
  std::vector<ExpectedTensor> v_;
};

void add_attention(ExpectedList& out, const std::string& p, const ModelConfig& c) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  if (c.q_lora_rank) {
    out.linear(p + "q_a_proj.weight", *c.q_lora_rank, D);
    out.high_precision(p + "q_a_layernorm.weight", {*c.q_lora_rank});
    out.linear(p + "q_b_proj.weight", H * c.qk_head_dim(), *c.q_lora_rank);
  } else {
    out.linear(p + "q_proj.weight", H * c.qk_head_dim(), D);
  }
  out.linear(p + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, D);
  out.high_precision(p + "kv_a_layernorm.weight", {c.kv_lora_rank});
  out.linear(p + "kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  out.linear(p + "o_proj.weight", D, H * c.v_head_dim);
  if (c.architecture == Architecture::DeepseekV32) {
    MLA_CHECK(c.q_lora_rank.has_value(), "DeepseekV32 needs q_lora_rank: its indexer reads the q latent");
    const std::string ip = p + "indexer.";
    out.linear(ip + "wq_b.weight", int64_t(c.index_n_heads) * c.index_head_dim, *c.q_lora_rank);
    out.linear(ip + "wk.weight", c.index_head_dim, D);
    out.high_precision(ip + "k_norm.weight", {c.index_head_dim});
    out.high_precision(ip + "k_norm.bias", {c.index_head_dim});
    out.high_precision(ip + "weights_proj.weight", {c.index_n_heads, D});
  }
}

void add_mlp(ExpectedList& out, const std::string& p, int64_t D, int64_t inter) {
  out.linear(p + "gate_proj.weight", inter, D);
  out.linear(p + "up_proj.weight", inter, D);
  out.linear(p + "down_proj.weight", D, inter);
}

void add_decoder_block(ExpectedList& out, int layer, const ModelConfig& c) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  const int64_t D = c.hidden_size;
  out.high_precision(p + "input_layernorm.weight", {D});
  add_attention(out, p + "self_attn.", c);
  out.high_precision(p + "post_attention_layernorm.weight", {D});
  if (c.is_moe_layer(layer)) {
    out.high_precision(p + "mlp.gate.weight", {c.n_routed_experts, D});
    if (c.topk_method == "noaux_tc") out.high_precision(p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}, DType::F32);
    for (int e = 0; e < c.n_routed_experts; ++e) add_mlp(out, fmt::format("{}mlp.experts.{}.", p, e), D, c.moe_intermediate_size);
    if (c.n_shared_experts > 0) {
      add_mlp(out, p + "mlp.shared_experts.", D, int64_t(c.n_shared_experts) * c.moe_intermediate_size);
    }
  } else {
    add_mlp(out, p + "mlp.", D, c.intermediate_size);
  }
}

}  // namespace

std::string scale_inv_name(const std::string& weight_name) { return weight_name + "_scale_inv"; }

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  ExpectedList out;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  out.high_precision("model.embed_tokens.weight", {V, D});
  for (int i = 0; i < c.num_hidden_layers; ++i) add_decoder_block(out, i, c);
  // MTP (NextN) layers follow the main stack, each a full decoder block plus
  // its own embedding, input norms, projection and output head.
  for (int i = c.num_hidden_layers; i < c.num_hidden_layers + c.num_nextn_predict_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    out.high_precision(p + "embed_tokens.weight", {V, D});
    out.high_precision(p + "enorm.weight", {D});
    out.high_precision(p + "hnorm.weight", {D});
    out.high_precision(p + "eh_proj.weight", {D, 2 * D});
    add_decoder_block(out, i, c);
    out.high_precision(p + "shared_head.norm.weight", {D});
    out.high_precision(p + "shared_head.head.weight", {V, D});
  }
  out.high_precision("model.norm.weight", {D});
  if (!c.tie_word_embeddings) out.high_precision("lm_head.weight", {V, D});
  return out.take();
}

}  // namespace mlaserve

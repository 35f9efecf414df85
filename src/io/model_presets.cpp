#include "io/model_presets.h"

#include "core/error.h"

namespace mlaserve {
namespace {

RopeScaling yarn(double mscale, double mscale_all_dim) {
  RopeScaling s;
  s.type = "yarn";
  s.factor = 40.0;
  s.original_max_position_embeddings = 4096;
  s.beta_fast = 32.0;
  s.beta_slow = 1.0;
  s.mscale = mscale;
  s.mscale_all_dim = mscale_all_dim;
  return s;
}

// DeepSeek-V3's routing and RoPE with the given widths left for the caller.
ModelConfig v3_base() {
  ModelConfig c;
  c.architecture = Architecture::DeepseekV3;
  c.architecture_name = "DeepseekV3ForCausalLM";
  c.model_type = "deepseek_v3";
  c.vocab_size = 129280;  // the real DeepSeek-V3 tokenizer's vocabulary
  c.max_position_embeddings = 163840;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.rope_scaling = yarn(1.0, 1.0);
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.topk_method = "noaux_tc";
  c.scoring_func = "sigmoid";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.moe_layer_freq = 1;
  return c;
}

// Small widths for tests: the 129280-row embedding tables dominate the file
// (four of them with MTP), so hidden stays at 32; intermediate sizes above
// 128 and not multiples of it give FP8 checkpoints several full and partial
// 128x128 blocks in both dimensions.
ModelConfig tiny_v3() {
  ModelConfig c = v3_base();
  c.hidden_size = 32;
  c.intermediate_size = 320;
  c.moe_intermediate_size = 160;
  c.num_hidden_layers = 3;
  c.num_nextn_predict_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.q_lora_rank = 48;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 16;
  c.n_group = 4;
  c.topk_group = 2;
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  return c;
}

ModelConfig tiny_v2() {
  ModelConfig c = tiny_v3();
  c.architecture = Architecture::DeepseekV2;
  c.architecture_name = "DeepseekV2ForCausalLM";
  c.model_type = "deepseek_v2";
  c.q_lora_rank.reset();
  c.topk_method = "group_limited_greedy";
  c.scoring_func = "softmax";
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.0;
  c.n_shared_experts = 2;
  c.num_nextn_predict_layers = 0;
  c.rope_scaling = yarn(0.707, 0.707);  // as DeepSeek-V2-Lite
  return c;
}

ModelConfig tiny_v32() {
  ModelConfig c = tiny_v3();
  c.architecture = Architecture::DeepseekV32;
  c.architecture_name = "DeepseekV32ForCausalLM";
  c.model_type = "deepseek_v32";
  c.index_n_heads = 4;
  c.index_head_dim = 32;
  c.index_topk = 8;  // small, so short test sequences already take the sparse path
  return c;
}

// DeepSeek-V3 architecture at DeepSeek-V2-Lite's width (15.8 B parameters).
ModelConfig v2_lite() {
  ModelConfig c = v3_base();
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.num_hidden_layers = 27;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 16;
  c.q_lora_rank.reset();
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 64;
  c.num_experts_per_tok = 6;
  c.n_shared_experts = 2;
  c.n_group = 1;
  c.topk_group = 1;
  c.first_k_dense_replace = 1;
  c.rope_scaling = yarn(0.707, 0.707);
  return c;
}

// Full DeepSeek-V3 width with 1 dense + 3 MoE layers: per-layer time x 61
// estimates the whole model. No MTP layer unless asked for (--mtp-layers).
ModelConfig v3_slice() {
  ModelConfig c = v3_base();
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 128;
  c.num_key_value_heads = 128;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 8;
  c.n_shared_experts = 1;
  c.n_group = 8;
  c.topk_group = 4;
  c.first_k_dense_replace = 1;
  return c;
}

}  // namespace

QuantizationConfig deepseek_fp8_quantization() {
  QuantizationConfig q;
  q.quant_method = "fp8";
  q.fmt = "e4m3";
  q.activation_scheme = "dynamic";
  q.weight_block_n = 128;
  q.weight_block_k = 128;
  return q;
}

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"tiny", "V3 architecture, q LoRA, noaux_tc, yarn, 1 MTP layer; hidden 32, 3 layers", tiny_v3(), false},
      {"tiny-v2", "V2 architecture: no q LoRA, softmax, group_limited_greedy; hidden 32, 3 layers", tiny_v2(), false},
      {"tiny-v32", "V3.2 architecture with the DSA indexer; hidden 32, 3 layers", tiny_v32(), false},
      {"v2-lite", "V3 architecture at DeepSeek-V2-Lite width, 27 layers (15.8 B params)", v2_lite(), false},
      {"v3-slice", "full DeepSeek-V3 width, 1 dense + 3 MoE layers, block FP8", v3_slice(), true},
  };
  return presets;
}

const ModelPreset& find_model_preset(const std::string& name) {
  std::string known;
  for (const ModelPreset& p : model_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  fail("unknown model preset '{}' (known: {})", name, known);
}

}  // namespace mlaserve

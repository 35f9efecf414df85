#pragma once
// Hugging Face config.json of DeepseekV2/V3/V32ForCausalLM as one typed
// struct: every field the forward pass, the KV cache and the chat layer need.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mlaserve {

enum class Architecture { DeepseekV2, DeepseekV3, DeepseekV32 };

struct RopeScaling {
  std::string type;  // "yarn" (the only scaling DeepSeek ships); empty = none
  double factor = 1.0;
  int original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct QuantizationConfig {
  std::string quant_method;  // "fp8"
  std::string fmt;           // "e4m3"
  std::string activation_scheme;  // "dynamic"
  int weight_block_n = 128, weight_block_k = 128;
  // "ue8m0" (V3.1, V3.2): activation scales are powers of two; empty: plain f32.
  std::string scale_fmt;
};

struct ModelConfig {
  Architecture architecture = Architecture::DeepseekV3;
  std::string architecture_name;  // as in config.json, e.g. "DeepseekV3ForCausalLM"
  std::string model_type;         // "deepseek_v3"

  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;       // dense MLP
  int moe_intermediate_size = 0;   // each routed / shared expert
  int num_hidden_layers = 0;
  int num_nextn_predict_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  std::optional<int> bos_token_id, eos_token_id;

  // MLA
  std::optional<int> q_lora_rank;  // null: q_proj directly (V2-Lite)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  // MoE
  std::string topk_method;   // greedy | group_limited_greedy | noaux_tc
  std::string scoring_func;  // softmax | sigmoid
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int n_group = 1;
  int topk_group = 1;
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;

  // V3.2 DSA indexer
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;

  std::optional<QuantizationConfig> quantization_config;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Width of one token's latent-cache row: c_kv then roped k_pe.
  int kv_cache_width() const { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe_layer(int layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
};

// Throws mlaserve::Error naming the field (and the file) when something is
// missing, of the wrong type, or inconsistent; unknown architectures too.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source = "config.json");
ModelConfig load_model_config(const std::filesystem::path& model_dir);
nlohmann::json model_config_to_json(const ModelConfig& c);

}  // namespace mlaserve

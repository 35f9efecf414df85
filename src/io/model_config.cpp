#include "io/model_config.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mlaserve {
namespace {

using json = nlohmann::json;

std::string_view json_type_name(const json& v) { return v.type_name(); }

// Typed access to one JSON object with errors that name the field and the
// file. Absent fields take the default given by the caller (transformers'
// DeepseekV2Config / DeepseekV3Config defaults); fields that decide tensor
// shapes have no default and must be present.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool present(const char* name) const { return obj_.contains(name); }
  bool present_non_null(const char* name) const { return present(name) && !obj_.at(name).is_null(); }

  int required_int(const char* name) const {
    MLA_CHECK(present_non_null(name), "{}: required field '{}' is missing", source_, path(name));
    return as_int(name);
  }
  int int_or(const char* name, int def) const { return present_non_null(name) ? as_int(name) : def; }
  std::optional<int> optional_int(const char* name) const {
    if (!present_non_null(name)) return std::nullopt;
    return as_int(name);
  }
  double double_or(const char* name, double def) const {
    if (!present_non_null(name)) return def;
    const json& v = obj_.at(name);
    MLA_CHECK(v.is_number(), "{}: field '{}' must be a number, got {}", source_, path(name), json_type_name(v));
    return v.get<double>();
  }
  bool bool_or(const char* name, bool def) const {
    if (!present_non_null(name)) return def;
    const json& v = obj_.at(name);
    MLA_CHECK(v.is_boolean(), "{}: field '{}' must be true or false, got {}", source_, path(name),
              json_type_name(v));
    return v.get<bool>();
  }
  std::string string_or(const char* name, const std::string& def) const {
    if (!present_non_null(name)) return def;
    const json& v = obj_.at(name);
    MLA_CHECK(v.is_string(), "{}: field '{}' must be a string, got {}", source_, path(name), json_type_name(v));
    return v.get<std::string>();
  }
  // eos_token_id may be one id or a list of ids; the first one is the
  // model's own end-of-sequence token.
  std::optional<int> first_int_of_int_or_list(const char* name) const {
    if (!present_non_null(name)) return std::nullopt;
    const json& v = obj_.at(name);
    if (v.is_array()) {
      MLA_CHECK(!v.empty() && v[0].is_number_integer(), "{}: field '{}' must be an integer or a list of integers",
                source_, path(name));
      return v[0].get<int>();
    }
    return as_int(name);
  }

  std::string path(const char* name) const { return prefix_ + name; }
  const std::string& source() const { return source_; }

 private:
  int as_int(const char* name) const {
    const json& v = obj_.at(name);
    MLA_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, got {}", source_, path(name),
              json_type_name(v));
    int64_t x = v.get<int64_t>();
    MLA_CHECK(x >= INT32_MIN && x <= INT32_MAX, "{}: field '{}' = {} is out of range", source_, path(name), x);
    return int(x);
  }

  const json& obj_;
  std::string source_;
  std::string prefix_;
};

Architecture parse_architecture(const json& j, const std::string& source, std::string* name) {
  MLA_CHECK(j.contains("architectures"), "{}: required field 'architectures' is missing", source);
  const json& a = j.at("architectures");
  MLA_CHECK(a.is_array() && a.size() == 1 && a[0].is_string(),
            "{}: field 'architectures' must be a list with one string", source);
  *name = a[0].get<std::string>();
  if (*name == "DeepseekV2ForCausalLM") return Architecture::DeepseekV2;
  if (*name == "DeepseekV3ForCausalLM") return Architecture::DeepseekV3;
  if (*name == "DeepseekV32ForCausalLM") return Architecture::DeepseekV32;
  fail("{}: unsupported architecture '{}' in field 'architectures' (supported: DeepseekV2ForCausalLM, "
       "DeepseekV3ForCausalLM, DeepseekV32ForCausalLM)",
       source, *name);
}

std::optional<RopeScaling> parse_rope_scaling(const json& j, const std::string& source) {
  if (!j.contains("rope_scaling") || j.at("rope_scaling").is_null()) return std::nullopt;
  const json& rs = j.at("rope_scaling");
  MLA_CHECK(rs.is_object(), "{}: field 'rope_scaling' must be an object or null, got {}", source,
            json_type_name(rs));
  FieldReader r(rs, source, "rope_scaling.");
  RopeScaling s;
  // Older configs spell it "type", newer ones "rope_type".
  s.type = r.string_or("type", r.string_or("rope_type", ""));
  MLA_CHECK(s.type == "yarn", "{}: field 'rope_scaling.type' is '{}'; only 'yarn' is supported", source, s.type);
  MLA_CHECK(r.present_non_null("factor"), "{}: required field 'rope_scaling.factor' is missing", source);
  s.factor = r.double_or("factor", 1.0);
  s.original_max_position_embeddings = r.int_or("original_max_position_embeddings", 4096);
  s.beta_fast = r.double_or("beta_fast", 32.0);
  s.beta_slow = r.double_or("beta_slow", 1.0);
  s.mscale = r.double_or("mscale", 1.0);
  s.mscale_all_dim = r.double_or("mscale_all_dim", 0.0);
  MLA_CHECK(s.factor >= 1.0, "{}: field 'rope_scaling.factor' must be >= 1, got {}", source, s.factor);
  MLA_CHECK(s.original_max_position_embeddings > 0,
            "{}: field 'rope_scaling.original_max_position_embeddings' must be positive", source);
  return s;
}

std::optional<QuantizationConfig> parse_quantization(const json& j, const std::string& source) {
  if (!j.contains("quantization_config") || j.at("quantization_config").is_null()) return std::nullopt;
  const json& qc = j.at("quantization_config");
  MLA_CHECK(qc.is_object(), "{}: field 'quantization_config' must be an object, got {}", source,
            json_type_name(qc));
  FieldReader r(qc, source, "quantization_config.");
  QuantizationConfig q;
  q.quant_method = r.string_or("quant_method", "");
  MLA_CHECK(q.quant_method == "fp8", "{}: field 'quantization_config.quant_method' is '{}'; only 'fp8' is supported",
            source, q.quant_method);
  q.fmt = r.string_or("fmt", "e4m3");
  MLA_CHECK(q.fmt == "e4m3", "{}: field 'quantization_config.fmt' is '{}'; only 'e4m3' is supported", source,
            q.fmt);
  q.activation_scheme = r.string_or("activation_scheme", "dynamic");
  MLA_CHECK(q.activation_scheme == "dynamic",
            "{}: field 'quantization_config.activation_scheme' is '{}'; only 'dynamic' is supported", source,
            q.activation_scheme);
  MLA_CHECK(qc.contains("weight_block_size"),
            "{}: required field 'quantization_config.weight_block_size' is missing (per-tensor FP8 is not "
            "supported)",
            source);
  const json& bs = qc.at("weight_block_size");
  MLA_CHECK(bs.is_array() && bs.size() == 2 && bs[0].is_number_integer() && bs[1].is_number_integer() &&
                bs[0].get<int64_t>() > 0 && bs[1].get<int64_t>() > 0,
            "{}: field 'quantization_config.weight_block_size' must be two positive integers", source);
  q.scale_fmt = r.string_or("scale_fmt", "");
  MLA_CHECK(q.scale_fmt.empty() || q.scale_fmt == "ue8m0",
            "{}: field 'quantization_config.scale_fmt' is '{}'; only 'ue8m0' is supported", source, q.scale_fmt);
  q.weight_block_n = bs[0].get<int>();
  q.weight_block_k = bs[1].get<int>();
  return q;
}

void check_positive(int v, const char* name, const std::string& source) {
  MLA_CHECK(v > 0, "{}: field '{}' must be positive, got {}", source, name, v);
}

void check_consistency(const ModelConfig& c, const std::string& s) {
  check_positive(c.vocab_size, "vocab_size", s);
  check_positive(c.hidden_size, "hidden_size", s);
  check_positive(c.num_hidden_layers, "num_hidden_layers", s);
  check_positive(c.num_attention_heads, "num_attention_heads", s);
  check_positive(c.kv_lora_rank, "kv_lora_rank", s);
  check_positive(c.qk_nope_head_dim, "qk_nope_head_dim", s);
  check_positive(c.qk_rope_head_dim, "qk_rope_head_dim", s);
  check_positive(c.v_head_dim, "v_head_dim", s);
  check_positive(c.max_position_embeddings, "max_position_embeddings", s);
  MLA_CHECK(c.qk_rope_head_dim % 2 == 0, "{}: field 'qk_rope_head_dim' must be even (RoPE rotates pairs), got {}",
            s, c.qk_rope_head_dim);
  MLA_CHECK(!c.q_lora_rank || *c.q_lora_rank > 0, "{}: field 'q_lora_rank' must be positive or null", s);
  MLA_CHECK(c.num_nextn_predict_layers >= 0, "{}: field 'num_nextn_predict_layers' must be >= 0", s);
  MLA_CHECK(c.rms_norm_eps > 0, "{}: field 'rms_norm_eps' must be positive", s);
  MLA_CHECK(c.rope_theta > 0, "{}: field 'rope_theta' must be positive", s);
  MLA_CHECK(c.first_k_dense_replace >= 0, "{}: field 'first_k_dense_replace' must be >= 0", s);
  MLA_CHECK(c.moe_layer_freq >= 1, "{}: field 'moe_layer_freq' must be >= 1", s);
  bool dense_layers = c.n_routed_experts == 0 || c.first_k_dense_replace > 0 || c.moe_layer_freq > 1;
  if (dense_layers) check_positive(c.intermediate_size, "intermediate_size", s);

  MLA_CHECK(c.topk_method == "greedy" || c.topk_method == "group_limited_greedy" || c.topk_method == "noaux_tc",
            "{}: field 'topk_method' is '{}'; expected greedy, group_limited_greedy or noaux_tc", s, c.topk_method);
  MLA_CHECK(c.scoring_func == "softmax" || c.scoring_func == "sigmoid",
            "{}: field 'scoring_func' is '{}'; expected softmax or sigmoid", s, c.scoring_func);
  MLA_CHECK(c.n_routed_experts >= 0, "{}: field 'n_routed_experts' must be >= 0", s);
  MLA_CHECK(c.n_shared_experts >= 0, "{}: field 'n_shared_experts' must be >= 0", s);
  if (c.n_routed_experts > 0) {
    check_positive(c.moe_intermediate_size, "moe_intermediate_size", s);
    MLA_CHECK(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.n_routed_experts,
              "{}: field 'num_experts_per_tok' = {} must be in [1, n_routed_experts = {}]", s, c.num_experts_per_tok,
              c.n_routed_experts);
    if (c.topk_method != "greedy") {
      MLA_CHECK(c.n_group >= 1 && c.n_routed_experts % c.n_group == 0,
                "{}: field 'n_group' = {} must divide n_routed_experts = {}", s, c.n_group, c.n_routed_experts);
      MLA_CHECK(c.topk_group >= 1 && c.topk_group <= c.n_group,
                "{}: field 'topk_group' = {} must be in [1, n_group = {}]", s, c.topk_group, c.n_group);
      MLA_CHECK(c.num_experts_per_tok <= c.topk_group * (c.n_routed_experts / c.n_group),
                "{}: field 'num_experts_per_tok' = {} exceeds the experts in topk_group = {} groups", s,
                c.num_experts_per_tok, c.topk_group);
    }
    if (c.topk_method == "noaux_tc") {
      MLA_CHECK(c.n_routed_experts / c.n_group >= 2,
                "{}: noaux_tc scores groups by their top-2 experts; n_routed_experts / n_group must be >= 2", s);
    }
  }
  if (c.architecture == Architecture::DeepseekV32) {
    check_positive(c.index_n_heads, "index_n_heads", s);
    check_positive(c.index_head_dim, "index_head_dim", s);
    check_positive(c.index_topk, "index_topk", s);
    MLA_CHECK(c.q_lora_rank.has_value(), "{}: DeepseekV32 needs field 'q_lora_rank' (its indexer reads the q latent)",
              s);
    MLA_CHECK(c.index_head_dim >= c.qk_rope_head_dim,
              "{}: field 'index_head_dim' = {} must be >= qk_rope_head_dim = {}", s, c.index_head_dim,
              c.qk_rope_head_dim);
  }
}

}  // namespace

ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source) {
  MLA_CHECK(j.is_object(), "{}: expected a JSON object at top level, got {}", source, json_type_name(j));
  ModelConfig c;
  c.architecture = parse_architecture(j, source, &c.architecture_name);
  const bool v2 = c.architecture == Architecture::DeepseekV2;
  FieldReader r(j, source);

  c.model_type = r.string_or("model_type", v2 ? "deepseek_v2"
                                               : (c.architecture == Architecture::DeepseekV32 ? "deepseek_v32"
                                                                                              : "deepseek_v3"));
  // Shape-defining fields: no default, a config without them is not a
  // DeepSeek checkpoint we can trust.
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.num_hidden_layers = r.required_int("num_hidden_layers");
  c.num_attention_heads = r.required_int("num_attention_heads");
  c.kv_lora_rank = r.required_int("kv_lora_rank");
  c.qk_nope_head_dim = r.required_int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.required_int("qk_rope_head_dim");
  c.v_head_dim = r.required_int("v_head_dim");
  // q_lora_rank must be present: null (V2-Lite) and absent would otherwise
  // be indistinguishable, and transformers' default for absent is 1536.
  MLA_CHECK(r.present("q_lora_rank"), "{}: required field 'q_lora_rank' is missing (use null for no q LoRA)", source);
  c.q_lora_rank = r.optional_int("q_lora_rank");

  c.intermediate_size = r.int_or("intermediate_size", v2 ? 11008 : 18432);
  c.moe_intermediate_size = r.int_or("moe_intermediate_size", v2 ? 1407 : 2048);
  c.num_key_value_heads = r.int_or("num_key_value_heads", c.num_attention_heads);
  c.max_position_embeddings = r.int_or("max_position_embeddings", v2 ? 2048 : 4096);
  c.rms_norm_eps = r.double_or("rms_norm_eps", 1e-6);
  c.rope_theta = r.double_or("rope_theta", 10000.0);
  c.rope_scaling = parse_rope_scaling(j, source);
  c.tie_word_embeddings = r.bool_or("tie_word_embeddings", false);
  c.bos_token_id = r.present("bos_token_id") ? r.optional_int("bos_token_id") : std::optional<int>(v2 ? 100000 : 0);
  c.eos_token_id = r.present("eos_token_id") ? r.first_int_of_int_or_list("eos_token_id")
                                             : std::optional<int>(v2 ? 100001 : 1);
  std::string act = r.string_or("hidden_act", "silu");
  MLA_CHECK(act == "silu", "{}: field 'hidden_act' is '{}'; DeepSeek models use 'silu'", source, act);

  c.topk_method = r.string_or("topk_method", v2 ? "greedy" : "noaux_tc");
  c.scoring_func = r.string_or("scoring_func", v2 ? "softmax" : "sigmoid");
  c.norm_topk_prob = r.bool_or("norm_topk_prob", !v2);
  c.routed_scaling_factor = r.double_or("routed_scaling_factor", v2 ? 1.0 : 2.5);
  c.n_group = r.int_or("n_group", v2 ? 1 : 8);
  c.topk_group = r.int_or("topk_group", v2 ? 1 : 4);
  c.n_routed_experts = r.int_or("n_routed_experts", v2 ? 0 : 256);
  c.n_shared_experts = r.int_or("n_shared_experts", v2 ? 0 : 1);
  c.num_experts_per_tok = r.int_or("num_experts_per_tok", v2 ? 0 : 8);
  c.first_k_dense_replace = r.int_or("first_k_dense_replace", v2 ? 0 : 3);
  c.moe_layer_freq = r.int_or("moe_layer_freq", 1);
  // transformers has no MTP layer; DeepSeek's own configs always state it.
  c.num_nextn_predict_layers = r.int_or("num_nextn_predict_layers", 0);

  if (c.architecture == Architecture::DeepseekV32) {
    c.index_n_heads = r.int_or("index_n_heads", 64);
    c.index_head_dim = r.int_or("index_head_dim", 128);
    c.index_topk = r.int_or("index_topk", 2048);
  }
  c.quantization_config = parse_quantization(j, source);
  check_consistency(c, source);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  std::filesystem::path p = model_dir / "config.json";
  std::ifstream in(p);
  MLA_CHECK(in.good(), "cannot open {}: no such file or not readable", p.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), e.what());
  }
  return parse_model_config(j, p.string());
}

nlohmann::json model_config_to_json(const ModelConfig& c) {
  // Field set and spelling as in DeepSeek's released config.json files.
  json j;
  j["architectures"] = {c.architecture_name};
  j["model_type"] = c.model_type;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  j["eos_token_id"] = c.eos_token_id ? json(*c.eos_token_id) : json(nullptr);
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["n_group"] = c.n_group;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    j["rope_scaling"] = {{"type", s.type},
                         {"factor", s.factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings},
                         {"beta_fast", s.beta_fast},
                         {"beta_slow", s.beta_slow},
                         {"mscale", s.mscale},
                         {"mscale_all_dim", s.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_theta"] = c.rope_theta;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["scoring_func"] = c.scoring_func;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["topk_group"] = c.topk_group;
  j["topk_method"] = c.topk_method;
  j["torch_dtype"] = "bfloat16";
  j["use_cache"] = true;
  j["v_head_dim"] = c.v_head_dim;
  j["vocab_size"] = c.vocab_size;
  if (c.architecture == Architecture::DeepseekV32) {
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
  }
  if (c.quantization_config) {
    const QuantizationConfig& q = *c.quantization_config;
    j["quantization_config"] = {{"quant_method", q.quant_method},
                                {"fmt", q.fmt},
                                {"activation_scheme", q.activation_scheme},
                                {"weight_block_size", {q.weight_block_n, q.weight_block_k}}};
    if (!q.scale_fmt.empty()) j["quantization_config"]["scale_fmt"] = q.scale_fmt;
  }
  return j;
}

}  // namespace mlaserve

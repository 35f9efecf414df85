#include "io/model_config.h"

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mlaserve {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::filesystem::path kData = std::filesystem::path(MLASERVE_SOURCE_DIR) / "tests/data/io";

json read_json(const std::string& file) {
  std::ifstream in(kData / file);
  return json::parse(in);
}

// The error message parse_model_config throws for `j`, or "" if none.
std::string parse_error(const json& j) {
  try {
    parse_model_config(j, "my/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, ParsesDeepSeekV3Release) {
  ModelConfig c = parse_model_config(read_json("deepseek_v3_config.json"));
  EXPECT_EQ(c.architecture, Architecture::DeepseekV3);
  EXPECT_EQ(c.architecture_name, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale_all_dim, 1.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.kv_cache_width(), 576);
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  ASSERT_TRUE(c.quantization_config.has_value());
  EXPECT_EQ(c.quantization_config->quant_method, "fp8");
  EXPECT_EQ(c.quantization_config->fmt, "e4m3");
  EXPECT_EQ(c.quantization_config->activation_scheme, "dynamic");
  EXPECT_EQ(c.quantization_config->weight_block_n, 128);
  EXPECT_EQ(c.quantization_config->weight_block_k, 128);
  EXPECT_EQ(c.quantization_config->scale_fmt, "");
  EXPECT_EQ(c.index_n_heads, 0);
}

TEST(ModelConfig, ParsesDeepSeekV2LiteRelease) {
  ModelConfig c = parse_model_config(read_json("deepseek_v2_lite_config.json"));
  EXPECT_EQ(c.architecture, Architecture::DeepseekV2);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.vocab_size, 102400);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 27);
  EXPECT_EQ(c.topk_method, "greedy");
  EXPECT_EQ(c.scoring_func, "softmax");
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale, 0.707);
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale_all_dim, 0.707);
  EXPECT_EQ(c.bos_token_id, 100000);
  EXPECT_EQ(c.eos_token_id, 100001);
  EXPECT_FALSE(c.quantization_config.has_value());
}

TEST(ModelConfig, ParsesDeepSeekV32Release) {
  ModelConfig c = parse_model_config(read_json("deepseek_v32_config.json"));
  EXPECT_EQ(c.architecture, Architecture::DeepseekV32);
  EXPECT_EQ(c.model_type, "deepseek_v32");
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.quantization_config->scale_fmt, "ue8m0");
}

TEST(ModelConfig, OmittedFieldsTakeTransformersDefaults) {
  json j = read_json("deepseek_v3_config.json");
  for (const char* f : {"rope_scaling", "quantization_config", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                        "topk_method", "scoring_func", "n_group", "topk_group", "routed_scaling_factor",
                        "norm_topk_prob", "moe_layer_freq", "tie_word_embeddings", "num_nextn_predict_layers"}) {
    j.erase(f);
  }
  ModelConfig c = parse_model_config(j);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_FALSE(c.quantization_config.has_value());
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);

  json v2 = read_json("deepseek_v2_lite_config.json");
  for (const char* f : {"topk_method", "scoring_func", "routed_scaling_factor", "norm_topk_prob"}) v2.erase(f);
  ModelConfig c2 = parse_model_config(v2);
  EXPECT_EQ(c2.topk_method, "greedy");
  EXPECT_EQ(c2.scoring_func, "softmax");
  EXPECT_DOUBLE_EQ(c2.routed_scaling_factor, 1.0);
  EXPECT_FALSE(c2.norm_topk_prob);
}

TEST(ModelConfig, EosTokenListTakesFirst) {
  json j = read_json("deepseek_v3_config.json");
  j["eos_token_id"] = {1, 7};
  EXPECT_EQ(parse_model_config(j).eos_token_id, 1);
}

TEST(ModelConfig, MissingRequiredFieldIsNamed) {
  for (const char* f : {"hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank"}) {
    json j = read_json("deepseek_v3_config.json");
    j.erase(f);
    EXPECT_THAT(parse_error(j), AllOf(HasSubstr("my/config.json"), HasSubstr(f), HasSubstr("missing"))) << f;
  }
}

TEST(ModelConfig, WrongTypeIsNamed) {
  json j = read_json("deepseek_v3_config.json");
  j["hidden_size"] = "7168";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("my/config.json"), HasSubstr("'hidden_size'"),
                                    HasSubstr("must be an integer"), HasSubstr("string")));
  j = read_json("deepseek_v3_config.json");
  j["num_hidden_layers"] = 61.5;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'num_hidden_layers'"), HasSubstr("must be an integer")));
  j = read_json("deepseek_v3_config.json");
  j["norm_topk_prob"] = 1;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'norm_topk_prob'"), HasSubstr("true or false")));
  j = read_json("deepseek_v3_config.json");
  j["rope_scaling"]["factor"] = "40";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'rope_scaling.factor'"), HasSubstr("must be a number")));
  j = read_json("deepseek_v3_config.json");
  j["topk_method"] = 3;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'topk_method'"), HasSubstr("must be a string")));
  j = read_json("deepseek_v3_config.json");
  j["quantization_config"]["weight_block_size"] = {128};
  EXPECT_THAT(parse_error(j), HasSubstr("'quantization_config.weight_block_size'"));
}

TEST(ModelConfig, UnsupportedValuesAreNamed) {
  json j = read_json("deepseek_v3_config.json");
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("unsupported architecture 'LlamaForCausalLM'"),
                                    HasSubstr("'architectures'")));
  j.erase("architectures");
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'architectures'"), HasSubstr("missing")));

  j = read_json("deepseek_v3_config.json");
  j["rope_scaling"]["type"] = "linear";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'rope_scaling.type'"), HasSubstr("linear")));
  j = read_json("deepseek_v3_config.json");
  j["quantization_config"]["quant_method"] = "awq";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'quantization_config.quant_method'"), HasSubstr("awq")));
  j = read_json("deepseek_v3_config.json");
  j["scoring_func"] = "relu";
  EXPECT_THAT(parse_error(j), HasSubstr("'scoring_func'"));
  j = read_json("deepseek_v3_config.json");
  j["hidden_act"] = "gelu";
  EXPECT_THAT(parse_error(j), HasSubstr("'hidden_act'"));
}

TEST(ModelConfig, InconsistentValuesAreNamed) {
  json j = read_json("deepseek_v3_config.json");
  j["n_group"] = 7;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'n_group'"), HasSubstr("divide")));
  j = read_json("deepseek_v3_config.json");
  j["topk_group"] = 9;
  EXPECT_THAT(parse_error(j), HasSubstr("'topk_group'"));
  j = read_json("deepseek_v3_config.json");
  j["num_experts_per_tok"] = 300;
  EXPECT_THAT(parse_error(j), HasSubstr("'num_experts_per_tok'"));
  j = read_json("deepseek_v3_config.json");
  j["qk_rope_head_dim"] = 63;
  EXPECT_THAT(parse_error(j), HasSubstr("'qk_rope_head_dim'"));
  j = read_json("deepseek_v3_config.json");
  j["hidden_size"] = 0;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("'hidden_size'"), HasSubstr("positive")));
  j = read_json("deepseek_v32_config.json");
  j["q_lora_rank"] = nullptr;
  EXPECT_THAT(parse_error(j), HasSubstr("'q_lora_rank'"));
}

TEST(ModelConfig, ToJsonRoundTrips) {
  for (const char* f : {"deepseek_v3_config.json", "deepseek_v2_lite_config.json", "deepseek_v32_config.json"}) {
    ModelConfig a = parse_model_config(read_json(f));
    json out = model_config_to_json(a);
    ModelConfig b = parse_model_config(out);
    // The written config reads back to the same struct, field by field.
    EXPECT_EQ(model_config_to_json(b), out) << f;
    EXPECT_EQ(out, model_config_to_json(parse_model_config(read_json(f)))) << f;
    EXPECT_EQ(b.q_lora_rank, a.q_lora_rank) << f;
    EXPECT_EQ(b.quantization_config.has_value(), a.quantization_config.has_value()) << f;
  }
  // And it carries the same values as DeepSeek's own file for every key both have.
  json orig = read_json("deepseek_v3_config.json");
  json out = model_config_to_json(parse_model_config(orig));
  for (auto it = out.begin(); it != out.end(); ++it) {
    if (!orig.contains(it.key())) continue;
    EXPECT_EQ(it.value(), orig[it.key()]) << it.key();
  }
}

TEST(ModelConfig, LoadNamesTheFile) {
  auto dir = std::filesystem::temp_directory_path() / "mlaserve_model_config_test";
  std::filesystem::create_directories(dir);
  try {
    load_model_config(dir / "absent");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("absent/config.json"));
  }
  {
    std::ofstream(dir / "config.json") << "{\"architectures\": [";
  }
  try {
    load_model_config(dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("config.json"), HasSubstr("invalid JSON")));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mlaserve

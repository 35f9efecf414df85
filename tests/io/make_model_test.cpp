#include "io/make_model.h"

#include <cmath>
#include <fstream>
#include <iterator>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_presets.h"

namespace mlaserve {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class MakeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("mlaserve_make_model_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path make(const std::string& sub, MakeModelOptions o) {
    fs::path out = root_ / sub;
    write_random_checkpoint(make_model_config(o), out, o.seed, o.max_shard_bytes);
    return out;
  }

  fs::path root_;
};

double to_f32(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::BF16) return bf16_to_f32(t.data<uint16_t>()[i]);
  return t.data<float>()[i];
}

TEST_F(MakeModelTest, SameSeedSameBytesOtherSeedOtherBytes) {
  MakeModelOptions o;
  o.preset = "tiny";
  o.layers = 1;
  o.seed = 7;
  fs::path a = make("a", o), b = make("b", o);
  o.seed = 8;
  fs::path c = make("c", o);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors.index.json",
                        "model-00001-of-00001.safetensors"}) {
    EXPECT_EQ(file_bytes(a / f), file_bytes(b / f)) << f;
  }
  EXPECT_EQ(file_bytes(a / "config.json"), file_bytes(c / "config.json"));
  EXPECT_NE(file_bytes(a / "model-00001-of-00001.safetensors"), file_bytes(c / "model-00001-of-00001.safetensors"));
}

TEST_F(MakeModelTest, TinyPresetsValidateInBothDtypes) {
  for (const char* preset : {"tiny", "tiny-v2", "tiny-v32"}) {
    for (const char* dtype : {"bf16", "fp8"}) {
      MakeModelOptions o;
      o.preset = preset;
      o.dtype = dtype;
      o.layers = 2;
      fs::path dir = make(std::string(preset) + "-" + dtype, o);
      Checkpoint ck = Checkpoint::open(dir);
      ck.validate_against_config();
      EXPECT_EQ(ck.config().num_hidden_layers, 2);
      EXPECT_EQ(ck.config().architecture_name, find_model_preset(preset).config.architecture_name);
      EXPECT_EQ(ck.config().quantization_config.has_value(), std::string(dtype) == "fp8");
      // DeepSeek's layout: the index is written even for one shard.
      EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
      EXPECT_TRUE(fs::exists(dir / "generation_config.json"));
      fs::remove_all(dir);
    }
  }
}

TEST_F(MakeModelTest, TinyPresetShapes) {
  ModelConfig c = make_model_config({});
  EXPECT_EQ(c.architecture, Architecture::DeepseekV3);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_TRUE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_GT(c.n_group, 1);
  EXPECT_GT(c.topk_group, 1);
  EXPECT_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  // FP8 blocks: some widths above 128 and not multiples of 128.
  EXPECT_GT(c.intermediate_size, 128);
  EXPECT_NE(c.intermediate_size % 128, 0);
  EXPECT_GT(c.moe_intermediate_size, 128);
  EXPECT_NE(c.moe_intermediate_size % 128, 0);

  ModelConfig v2 = find_model_preset("tiny-v2").config;
  EXPECT_EQ(v2.architecture, Architecture::DeepseekV2);
  EXPECT_FALSE(v2.q_lora_rank.has_value());
  EXPECT_EQ(v2.scoring_func, "softmax");
  EXPECT_EQ(v2.topk_method, "group_limited_greedy");
  EXPECT_EQ(v2.num_nextn_predict_layers, 0);

  ModelConfig v32 = find_model_preset("tiny-v32").config;
  EXPECT_EQ(v32.architecture, Architecture::DeepseekV32);
  EXPECT_GT(v32.index_n_heads, 0);
}

int64_t count_params(const ModelConfig& c) {
  int64_t n = 0;
  for (const ExpectedTensor& x : expected_tensors(c)) n += shape_numel(x.shape);
  return n;
}

TEST_F(MakeModelTest, BenchmarkPresetsMatchDesign) {
  ModelConfig lite = make_model_config({.preset = "v2-lite"});
  EXPECT_EQ(lite.architecture, Architecture::DeepseekV3);
  EXPECT_EQ(lite.hidden_size, 2048);
  EXPECT_EQ(lite.num_hidden_layers, 27);
  EXPECT_FALSE(lite.q_lora_rank.has_value());
  EXPECT_FALSE(lite.quantization_config.has_value());
  // DESIGN.md: 15.8 B parameters.
  EXPECT_NEAR(double(count_params(lite)) / 1e9, 15.8, 0.1);

  ModelConfig slice = make_model_config({.preset = "v3-slice"});
  ASSERT_TRUE(slice.quantization_config.has_value());  // FP8 by default
  EXPECT_EQ(slice.num_hidden_layers, 4);
  EXPECT_FALSE(slice.is_moe_layer(0));
  EXPECT_TRUE(slice.is_moe_layer(1));
  std::map<std::string, ExpectedTensor> by_name;
  for (ExpectedTensor& x : expected_tensors(slice)) by_name.emplace(x.name, x);
  EXPECT_EQ(by_name.at("model.layers.1.self_attn.q_b_proj.weight").shape, (Shape{128 * 192, 1536}));
  EXPECT_EQ(by_name.at("model.layers.1.self_attn.kv_a_proj_with_mqa.weight").shape, (Shape{576, 7168}));
  EXPECT_EQ(by_name.at("model.layers.1.self_attn.kv_b_proj.weight").shape, (Shape{128 * 256, 512}));
  EXPECT_EQ(by_name.at("model.layers.3.mlp.experts.255.down_proj.weight").shape, (Shape{7168, 2048}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.gate_proj.weight").shape, (Shape{18432, 7168}));
  EXPECT_FALSE(by_name.count("model.layers.4.eh_proj.weight"));

  ModelConfig with_mtp = make_model_config({.preset = "v3-slice", .mtp_layers = 1});
  EXPECT_EQ(with_mtp.num_nextn_predict_layers, 1);
  ModelConfig bf16 = make_model_config({.preset = "v3-slice", .dtype = "bf16", .layers = 2});
  EXPECT_FALSE(bf16.quantization_config.has_value());
  EXPECT_EQ(bf16.num_hidden_layers, 2);
}

TEST_F(MakeModelTest, BadOptionsAreClearErrors) {
  auto error_of = [](MakeModelOptions o) {
    try {
      make_model_config(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(error_of({.preset = "huge"}), HasSubstr("unknown model preset 'huge' (known: tiny, tiny-v2"));
  EXPECT_THAT(error_of({.preset = "tiny", .dtype = "int4"}), HasSubstr("--dtype"));
  EXPECT_THAT(error_of({.preset = "tiny", .layers = 0}), HasSubstr("--layers"));
  MakeModelOptions o;
  o.out_dir = root_ / "m";
  o.tokenizer_dir = root_ / "no-tokenizer";
  try {
    make_model(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no-tokenizer/tokenizer.json not found"));
    EXPECT_THAT(e.what(), HasSubstr("scripts/setup.sh"));
  }
}

TEST_F(MakeModelTest, CopiesTheTokenizer) {
  fs::path tok = default_tokenizer_dir();
  ASSERT_TRUE(fs::exists(tok / "tokenizer.json")) << "run scripts/setup.sh to fetch the tokenizer into " << tok;
  MakeModelOptions o;
  o.layers = 1;
  o.out_dir = root_ / "m";
  make_model(o);
  EXPECT_EQ(file_bytes(o.out_dir / "tokenizer.json"), file_bytes(tok / "tokenizer.json"));
  EXPECT_EQ(file_bytes(o.out_dir / "tokenizer_config.json"), file_bytes(tok / "tokenizer_config.json"));
  Checkpoint::open(o.out_dir).validate_against_config();
}

TEST_F(MakeModelTest, ShardsStayUnderTheLimit) {
  MakeModelOptions o;
  o.layers = 1;
  o.max_shard_bytes = 10'000'000;
  fs::path dir = make("m", o);
  Checkpoint ck = Checkpoint::open(dir);
  ck.validate_against_config();
  ASSERT_GT(ck.shard_paths().size(), 1u);
  for (const fs::path& p : ck.shard_paths()) EXPECT_LE(fs::file_size(p), 10'000'000u + 100'000u) << p;
}

TEST_F(MakeModelTest, RewritingRemovesStaleShards) {
  MakeModelOptions o;
  o.layers = 1;
  o.max_shard_bytes = 10'000'000;
  fs::path dir = make("m", o);
  ASSERT_TRUE(fs::exists(dir / "model-00002-of-00004.safetensors"));
  std::ofstream(dir / "notes.txt") << "kept";
  o.max_shard_bytes = 5'000'000'000;
  write_random_checkpoint(make_model_config(o), dir, o.seed, o.max_shard_bytes);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "generation_config.json", "model-00001-of-00001.safetensors",
                                             "model.safetensors.index.json", "notes.txt"}));
}

TEST_F(MakeModelTest, WeightStatistics) {
  MakeModelOptions o;
  o.layers = 1;
  o.seed = 3;
  Checkpoint ck = Checkpoint::open(make("m", o));
  auto stats = [&](const std::string& name) {
    Tensor t = ck.get(name);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = to_f32(t, i);
      s += v;
      s2 += v * v;
    }
    double mean = s / double(t.numel());
    return std::pair{mean, std::sqrt(s2 / double(t.numel()) - mean * mean)};
  };
  auto [emb_mean, emb_std] = stats("model.embed_tokens.weight");  // 4 M values
  EXPECT_NEAR(emb_mean, 0.0, 1e-4);
  EXPECT_NEAR(emb_std, 0.02, 2e-4);
  auto [head_mean, head_std] = stats("lm_head.weight");
  EXPECT_NEAR(head_mean, 0.0, 1e-3);
  EXPECT_NEAR(head_std, 1.0 / std::sqrt(32.0), 2e-3);
  auto [norm_mean, norm_std] = stats("model.layers.0.mlp.gate_proj.weight");
  EXPECT_NEAR(norm_mean, 0.0, 1e-3);
  EXPECT_NEAR(norm_std, 0.02, 1e-3);
  auto [ln_mean, ln_std] = stats("model.layers.0.input_layernorm.weight");
  EXPECT_NEAR(ln_mean, 1.0, 0.1);
  EXPECT_GT(ln_std, 0.02);
  EXPECT_EQ(ck.info("model.layers.1.mlp.gate.e_score_correction_bias").dtype, DType::F32);  // the MTP layer's MoE
}

// FP8 and bf16 checkpoints from one seed hold the same underlying weights:
// dequantized FP8 must match the bf16 values within e4m3's rounding, and
// each block's largest value must land on +-448 * scale.
TEST_F(MakeModelTest, Fp8DequantizesToTheBf16Weights) {
  MakeModelOptions o;
  o.layers = 2;
  o.seed = 11;
  Checkpoint bf = Checkpoint::open(make("bf16", o));
  o.dtype = "fp8";
  Checkpoint f8 = Checkpoint::open(make("fp8", o));
  int checked = 0;
  for (const ExpectedTensor& x : expected_tensors(f8.config())) {
    if (!x.fp8_quantized) {
      EXPECT_EQ(f8.info(x.name).dtype, x.dtype) << x.name;
      continue;
    }
    Tensor q = f8.get(x.name, DType::F8_E4M3, x.shape);
    Tensor s = f8.get(scale_inv_name(x.name));
    Tensor w = bf.get(x.name, DType::BF16, x.shape);
    const int64_t N = x.shape[0], K = x.shape[1], KB = s.dim(1);
    std::vector<float> block_max(size_t(s.numel()), 0.0f);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        float scale = s.data<float>()[(n / 128) * KB + k / 128];
        float deq = fp8e4m3_to_f32(q.data<uint8_t>()[n * K + k]) * scale;
        float ref = bf16_to_f32(w.data<uint16_t>()[n * K + k]);
        // e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal spacing
        // 2^-9 (absolute <= 2^-10 x scale); bf16 itself is within 2^-9.
        float bound = std::fabs(ref) * (1.0f / 16 + 1.0f / 256) + scale / 1024;
        ASSERT_LE(std::fabs(deq - ref), bound) << x.name << " [" << n << ", " << k << "]";
        float& m = block_max[size_t((n / 128) * KB + k / 128)];
        m = std::max(m, std::fabs(deq));
      }
    }
    for (int64_t b = 0; b < s.numel(); ++b) EXPECT_FLOAT_EQ(block_max[size_t(b)], 448.0f * s.data<float>()[b]);
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace mlaserve

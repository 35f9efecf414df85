#include "io/checkpoint.h"

#include <fstream>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/fp8_block_quant.h"
#include "io/make_model.h"
#include "io/model_presets.h"
#include "io/safetensors_writer.h"

namespace mlaserve {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The tiny preset with a small vocabulary: every tensor kind, kilobytes of data.
ModelConfig small_config(bool fp8) {
  ModelConfig c = find_model_preset("tiny").config;
  c.vocab_size = 300;
  c.num_hidden_layers = 2;
  if (fp8) c.quantization_config = deepseek_fp8_quantization();
  return c;
}

// Byte k of tensor `name` holds this, so views can be checked against it.
uint8_t pattern(const std::string& name, uint64_t k) { return uint8_t(k * 7 + name.size()); }

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mlaserve_checkpoint_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A single-file checkpoint (model.safetensors, no index) holding the
  // tensors the config implies, after `mutate` has edited the list.
  void write_single_file(const ModelConfig& c, const std::function<void(std::vector<TensorSpec>&)>& mutate = {}) {
    std::vector<TensorSpec> specs;
    for (const ExpectedTensor& x : expected_tensors(c)) {
      if (x.fp8_quantized && c.quantization_config) {
        specs.push_back({x.name, DType::F8_E4M3, x.shape});
        specs.push_back({scale_inv_name(x.name), DType::F32, fp8_scale_shape(x.shape[0], x.shape[1], 128, 128)});
      } else {
        specs.push_back({x.name, x.dtype, x.shape});
      }
    }
    if (mutate) mutate(specs);
    SafetensorsWriter w(dir_ / "model.safetensors", specs);
    for (const TensorSpec& s : specs) {
      std::vector<uint8_t> bytes(s.nbytes());
      for (uint64_t k = 0; k < bytes.size(); ++k) bytes[k] = pattern(s.name, k);
      w.write(s.name, 0, bytes.data(), bytes.size());
    }
    w.finish();
    std::ofstream(dir_ / "config.json") << model_config_to_json(c).dump(2);
  }

  std::string validate_error() {
    try {
      Checkpoint::open(dir_).validate_against_config();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::string open_error() {
    try {
      Checkpoint::open(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  json read_index() {
    std::ifstream in(dir_ / "model.safetensors.index.json");
    return json::parse(in);
  }
  void write_index(const json& j) { std::ofstream(dir_ / "model.safetensors.index.json") << j.dump(); }

  std::filesystem::path dir_;
};

TEST_F(CheckpointTest, SingleFileViewsIntoTheMapping) {
  ModelConfig c = small_config(false);
  write_single_file(c);
  Checkpoint ck = Checkpoint::open(dir_);
  ck.validate_against_config();
  EXPECT_EQ(ck.config().num_hidden_layers, 2);
  EXPECT_EQ(ck.names().size(), expected_tensors(c).size());
  ck.prefetch();

  const std::string name = "model.layers.0.self_attn.kv_b_proj.weight";
  Tensor t = ck.get(name, DType::BF16, {4 * 32, 32});
  ASSERT_EQ(t.nbytes(), 4u * 32 * 32 * 2);
  const uint8_t* p = t.data<uint8_t>();
  for (uint64_t k = 0; k < t.nbytes(); ++k) ASSERT_EQ(p[k], pattern(name, k)) << k;
  // A view, not a copy: the same bytes every time, kept alive by the view.
  EXPECT_EQ(ck.get(name).raw(), t.raw());
  EXPECT_NE(t.owner(), nullptr);
  EXPECT_EQ(ck.info(name).file, "model.safetensors");
  EXPECT_EQ(ck.total_bytes(), std::filesystem::file_size(dir_ / "model.safetensors") -
                                  8 - [&] {
                                    std::ifstream f(dir_ / "model.safetensors", std::ios::binary);
                                    uint64_t n = 0;
                                    f.read(reinterpret_cast<char*>(&n), 8);
                                    return n;
                                  }());
}

TEST_F(CheckpointTest, GetChecksDtypeAndShape) {
  write_single_file(small_config(false));
  Checkpoint ck = Checkpoint::open(dir_);
  try {
    ck.get("model.norm.weight", DType::F32, {32});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("model.safetensors"), HasSubstr("'model.norm.weight'"),
                                HasSubstr("dtype BF16, expected F32")));
  }
  try {
    ck.get("model.norm.weight", DType::BF16, {33});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("shape [32], expected [33]")));
  }
  EXPECT_THAT([&] {
    try {
      ck.get("model.nothing");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), HasSubstr("'model.nothing' is not in the checkpoint"));
}

TEST_F(CheckpointTest, NoCheckpointFiles) {
  std::ofstream(dir_ / "config.json") << model_config_to_json(small_config(false)).dump();
  EXPECT_THAT(open_error(), HasSubstr("no model.safetensors.index.json or model.safetensors"));
}

TEST_F(CheckpointTest, MissingTensor) {
  write_single_file(small_config(false), [](auto& specs) {
    std::erase_if(specs, [](auto& s) { return s.name == "model.layers.1.mlp.experts.5.up_proj.weight"; });
  });
  EXPECT_THAT(validate_error(),
              AllOf(HasSubstr("'model.layers.1.mlp.experts.5.up_proj.weight'"), HasSubstr("[160, 32]"),
                    HasSubstr("missing")));
}

TEST_F(CheckpointTest, ExtraTensor) {
  write_single_file(small_config(false), [](auto& specs) {
    specs.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {8}});
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("model.safetensors"),
                                      HasSubstr("'model.layers.0.self_attn.rotary_emb.inv_freq'"),
                                      HasSubstr("extra tensor")));
}

TEST_F(CheckpointTest, WrongShape) {
  write_single_file(small_config(false), [](auto& specs) {
    for (auto& s : specs)
      if (s.name == "model.layers.0.self_attn.kv_b_proj.weight") s.shape = {128, 33};
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("model.safetensors"),
                                      HasSubstr("'model.layers.0.self_attn.kv_b_proj.weight'"),
                                      HasSubstr("shape [128, 33]"), HasSubstr("implies [128, 32]")));
}

TEST_F(CheckpointTest, WrongDtype) {
  write_single_file(small_config(false), [](auto& specs) {
    for (auto& s : specs)
      if (s.name == "model.norm.weight") s.dtype = DType::I32;
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("dtype I32")));
}

TEST_F(CheckpointTest, Fp8ValidatesAndViewsScales) {
  ModelConfig c = small_config(true);
  write_single_file(c);
  Checkpoint ck = Checkpoint::open(dir_);
  ck.validate_against_config();
  // A dense gate_proj {320, 32} has 3 x 1 blocks of 128 x 128.
  Tensor s = ck.get("model.layers.0.mlp.gate_proj.weight_scale_inv", DType::F32, {3, 1});
  EXPECT_EQ(s.numel(), 3);
  EXPECT_EQ(ck.info("model.layers.0.mlp.gate_proj.weight").dtype, DType::F8_E4M3);
  EXPECT_EQ(ck.info("model.layers.1.mlp.gate.weight").dtype, DType::BF16);
}

TEST_F(CheckpointTest, Fp8WeightWithoutScale) {
  write_single_file(small_config(true), [](auto& specs) {
    std::erase_if(specs, [](auto& s) { return s.name == "model.layers.1.self_attn.q_b_proj.weight_scale_inv"; });
  });
  EXPECT_THAT(validate_error(),
              AllOf(HasSubstr("FP8 tensor 'model.layers.1.self_attn.q_b_proj.weight'"),
                    HasSubstr("no 'model.layers.1.self_attn.q_b_proj.weight_scale_inv'")));
}

TEST_F(CheckpointTest, Fp8ScaleWrongShape) {
  write_single_file(small_config(true), [](auto& specs) {
    for (auto& s : specs)
      if (s.name == "model.layers.0.mlp.down_proj.weight_scale_inv") s.shape = {1, 2};
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("'model.layers.0.mlp.down_proj.weight_scale_inv'"),
                                      HasSubstr("shape [1, 2]"), HasSubstr("needs [1, 3]")));
}

TEST_F(CheckpointTest, Fp8ScaleWrongDtype) {
  write_single_file(small_config(true), [](auto& specs) {
    for (auto& s : specs)
      if (s.name == "model.layers.0.mlp.down_proj.weight_scale_inv") s.dtype = DType::BF16;
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("'model.layers.0.mlp.down_proj.weight_scale_inv'"),
                                      HasSubstr("dtype BF16, expected F32")));
}

TEST_F(CheckpointTest, Fp8WithoutQuantizationConfig) {
  write_single_file(small_config(false), [](auto& specs) {
    for (auto& s : specs)
      if (s.name == "model.layers.0.self_attn.o_proj.weight") s.dtype = DType::F8_E4M3;
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("'model.layers.0.self_attn.o_proj.weight'"),
                                      HasSubstr("no quantization_config")));
}

TEST_F(CheckpointTest, Fp8ForATensorDeepSeekKeepsHighPrecision) {
  write_single_file(small_config(true), [](auto& specs) {
    for (auto& s : specs)
      if (s.name == "model.layers.1.mlp.gate.weight") s.dtype = DType::F8_E4M3;
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("'model.layers.1.mlp.gate.weight' is F8_E4M3"),
                                      HasSubstr("keep it in BF16")));
}

TEST_F(CheckpointTest, OrphanScale) {
  write_single_file(small_config(false), [](auto& specs) {
    specs.push_back({"model.layers.0.mlp.up_proj.weight_scale_inv", DType::F32, {3, 1}});
  });
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("'model.layers.0.mlp.up_proj.weight_scale_inv'"),
                                      HasSubstr("not FP8")));
}

// Sharded checkpoints, as make-model writes them, broken in the index.
class ShardedCheckpointTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    write_random_checkpoint(small_config(true), dir_, 1, 100'000);  // several shards
  }
};

TEST_F(ShardedCheckpointTest, Valid) {
  Checkpoint ck = Checkpoint::open(dir_);
  ck.validate_against_config();
  EXPECT_GT(ck.shard_paths().size(), 2u);
  EXPECT_EQ(ck.info("lm_head.weight").file, read_index()["weight_map"]["lm_head.weight"]);
}

TEST_F(ShardedCheckpointTest, IndexNamesMissingShard) {
  json j = read_index();
  j["weight_map"]["model.norm.weight"] = "model-00099-of-00099.safetensors";
  write_index(j);
  EXPECT_THAT(open_error(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("'model.norm.weight'"),
                                  HasSubstr("'model-00099-of-00099.safetensors', which does not exist")));
}

TEST_F(ShardedCheckpointTest, IndexNamesTensorNotInShard) {
  json j = read_index();
  std::string shard = j["weight_map"]["model.norm.weight"];
  j["weight_map"]["model.layers.0.mlp.bogus.weight"] = shard;
  write_index(j);
  EXPECT_THAT(open_error(), AllOf(HasSubstr("'model.layers.0.mlp.bogus.weight'"), HasSubstr(shard),
                                  HasSubstr("does not contain it")));
}

TEST_F(ShardedCheckpointTest, ShardTensorMissingFromIndex) {
  json j = read_index();
  std::string shard = j["weight_map"]["model.norm.weight"];
  j["weight_map"].erase("model.norm.weight");
  write_index(j);
  EXPECT_THAT(open_error(), AllOf(HasSubstr(shard), HasSubstr("'model.norm.weight' is not listed")));
}

TEST_F(ShardedCheckpointTest, IndexEscapingTheDirectory) {
  json j = read_index();
  j["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  write_index(j);
  EXPECT_THAT(open_error(), AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("not a plain file name")));
}

TEST_F(ShardedCheckpointTest, InvalidIndexJson) {
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"weight_map\": {";
  EXPECT_THAT(open_error(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("invalid JSON")));
}

TEST_F(ShardedCheckpointTest, TruncatedShard) {
  json j = read_index();
  std::string shard = j["weight_map"]["lm_head.weight"];
  auto p = dir_ / shard;
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 100);
  EXPECT_THAT(open_error(), AllOf(HasSubstr(shard), HasSubstr("beyond the data buffer")));
}

TEST_F(ShardedCheckpointTest, ConfigImpliesMoreLayers) {
  json cfg;
  {
    std::ifstream in(dir_ / "config.json");
    cfg = json::parse(in);
  }
  // Layer 2 (the MTP block on disk) passes as a decoder block; the MTP layer
  // the config now puts at index 3 is missing.
  cfg["num_hidden_layers"] = 3;
  std::ofstream(dir_ / "config.json") << cfg.dump();
  EXPECT_THAT(validate_error(), AllOf(HasSubstr("'model.layers.3.embed_tokens.weight'"), HasSubstr("missing")));
}

}  // namespace
}  // namespace mlaserve

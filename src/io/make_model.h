#pragma once
// Random-weight checkpoints in exactly the layout DeepSeek ships:
// config.json, generation_config.json, model-XXXXX-of-YYYYY.safetensors
// shards with model.safetensors.index.json, and the tokenizer files.
// Weights are a pure function of (seed, tensor name): the same seed gives the
// same bytes on any machine, whatever the thread count, depth or dtype.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "io/model_config.h"

namespace mlaserve {

struct MakeModelOptions {
  std::string preset = "tiny";
  std::filesystem::path out_dir;
  uint64_t seed = 0;
  std::optional<std::string> dtype;  // "bf16" or "fp8"; default: the preset's
  std::optional<int> layers;         // overrides num_hidden_layers
  std::optional<int> mtp_layers;     // overrides num_nextn_predict_layers
  std::filesystem::path tokenizer_dir;  // empty: default_tokenizer_dir()
  uint64_t max_shard_bytes = 5'000'000'000;  // as DeepSeek's and HF's "5GB"
};

// The preset's config with the options' overrides applied (and validated).
ModelConfig make_model_config(const MakeModelOptions& o);

// Writes the weights (shards + index), config.json and
// generation_config.json; config.json last, so a directory with a config
// holds a complete checkpoint.
void write_random_checkpoint(const ModelConfig& c, const std::filesystem::path& out_dir, uint64_t seed,
                             uint64_t max_shard_bytes = 5'000'000'000);

// Everything: checkpoint plus tokenizer.json and tokenizer_config.json.
void make_model(const MakeModelOptions& o);

// assets/tokenizer under the working directory if present, else under the
// source tree (fetched there by scripts/setup.sh).
std::filesystem::path default_tokenizer_dir();

// The initial value distribution of a tensor, by its name: norms near 1,
// biases near 0, output heads scaled to unit-variance logits, and
// transformers' initializer_range (0.02) for everything else.
struct WeightInit {
  double mean, stddev;
};
WeightInit weight_init(const std::string& name, int hidden_size);

}  // namespace mlaserve

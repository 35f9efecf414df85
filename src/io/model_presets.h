#pragma once
// Named model shapes for `mlaserve make-model`: tiny ones for tests and CI,
// and the benchmark shapes of DESIGN.md (v2-lite, v3-slice).
#include <string>
#include <vector>

#include "io/model_config.h"

namespace mlaserve {

struct ModelPreset {
  std::string name;
  std::string description;
  ModelConfig config;
  bool fp8_by_default = false;
};

const std::vector<ModelPreset>& model_presets();
// Throws naming the preset and listing the known ones.
const ModelPreset& find_model_preset(const std::string& name);

// The block-FP8 quantization_config DeepSeek-V3 ships.
QuantizationConfig deepseek_fp8_quantization();

}  // namespace mlaserve

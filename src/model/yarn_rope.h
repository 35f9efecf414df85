#pragma once
// RoPE frequencies and attention scale of DeepSeek's MLA, from the config:
// plain RoPE, or YaRN with DeepSeek's mscale rule (as transformers'
// modeling_rope_utils yarn and DeepseekV3Attention compute them).
#include <vector>

#include "io/model_config.h"

namespace mlaserve {

struct RopeTable {
  std::vector<float> inv_freq;   // {qk_rope_head_dim / 2}
  float cos_sin_scale = 1.0f;    // YaRN attention factor applied to cos and sin
};

// inv_freq[i] = theta^(-2i/d), blended with inv_freq / factor by YaRN's ramp
// between the beta_fast and beta_slow correction dims (floor/ceil truncated);
// cos_sin_scale = mscale(factor, mscale) / mscale(factor, mscale_all_dim).
RopeTable make_rope_table(const ModelConfig& c);

// 1/sqrt(qk_nope + qk_rope), times mscale(factor, mscale_all_dim)^2 when the
// config has YaRN scaling with mscale_all_dim set.
float attention_softmax_scale(const ModelConfig& c);

// 0.1 * m * ln(factor) + 1 for factor > 1, else 1 (DeepSeek's yarn_get_mscale).
double yarn_mscale(double factor, double m);

}  // namespace mlaserve

#include "model/yarn_rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace mlaserve {

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

RopeTable make_rope_table(const ModelConfig& c) {
  const int dim = c.qk_rope_head_dim;
  MLA_CHECK(dim > 0 && dim % 2 == 0, "qk_rope_head_dim must be positive and even, got {}", dim);
  const int half = dim / 2;
  const float base = float(c.rope_theta);
  RopeTable t;
  t.inv_freq.resize(size_t(half));
  // pos_freqs computed in f32 as torch does (base ** (arange(0, dim, 2) / dim)).
  std::vector<float> pos_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) pos_freq[size_t(i)] = std::pow(base, float(2 * i) / float(dim));

  if (!c.rope_scaling || c.rope_scaling->type != "yarn" || c.rope_scaling->factor <= 1.0) {
    for (int i = 0; i < half; ++i) t.inv_freq[size_t(i)] = 1.0f / pos_freq[size_t(i)];
    return t;
  }
  const RopeScaling& y = *c.rope_scaling;
  const double factor = y.factor;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(y.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(c.rope_theta));
  };
  double low = std::max(std::floor(correction_dim(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  for (int i = 0; i < half; ++i) {
    const float ramp = std::clamp(float((float(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    const float extrapolated = 1.0f / pos_freq[size_t(i)];
    const float interpolated = 1.0f / (float(factor) * pos_freq[size_t(i)]);
    t.inv_freq[size_t(i)] = interpolated * (1.0f - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  t.cos_sin_scale = float(yarn_mscale(factor, y.mscale) / yarn_mscale(factor, y.mscale_all_dim));
  return t;
}

float attention_softmax_scale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(double(c.qk_head_dim()));
  if (c.rope_scaling && c.rope_scaling->type == "yarn" && c.rope_scaling->mscale_all_dim != 0.0) {
    const double m = yarn_mscale(c.rope_scaling->factor, c.rope_scaling->mscale_all_dim);
    scale *= m * m;
  }
  return float(scale);
}

}  // namespace mlaserve

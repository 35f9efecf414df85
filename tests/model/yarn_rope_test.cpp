// RoPE tables against values derived by hand from DeepSeek-V3's config
// (qk_rope_head_dim 64, theta 10000, yarn factor 40 over 4096 positions,
// beta_fast 32, beta_slow 1, mscale = mscale_all_dim = 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/yarn_rope.h"

namespace mlaserve {
namespace {

ModelConfig v3_rope_config() {
  ModelConfig c;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.rope_theta = 10000.0;
  RopeScaling y;
  y.type = "yarn";
  y.factor = 40.0;
  y.original_max_position_embeddings = 4096;
  y.beta_fast = 32.0;
  y.beta_slow = 1.0;
  y.mscale = 1.0;
  y.mscale_all_dim = 1.0;
  c.rope_scaling = y;
  return c;
}

TEST(YarnRope, PlainRopeWithoutScaling) {
  ModelConfig c = v3_rope_config();
  c.rope_scaling.reset();
  const RopeTable t = make_rope_table(c);
  ASSERT_EQ(t.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(t.inv_freq[size_t(i)], std::pow(10000.0, -2.0 * i / 64), 1e-6 * t.inv_freq[0]);
  EXPECT_EQ(t.cos_sin_scale, 1.0f);
  EXPECT_NEAR(attention_softmax_scale(c), 1.0 / std::sqrt(192.0), 1e-8);
}

TEST(YarnRope, DeepseekV3RampAndScales) {
  const RopeTable t = make_rope_table(v3_rope_config());
  // Correction dims: 64 ln(4096 / (32 * 2 pi)) / (2 ln 10000) = 10.47 -> 10 and
  // 64 ln(4096 / (1 * 2 pi)) / (2 ln 10000) = 22.52 -> 23: dims below 10 keep
  // their frequency, dims from 23 on are divided by 40, a linear blend between.
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(10000.0, -2.0 * i / 64);
    const double ramp = std::clamp((i - 10.0) / (23.0 - 10.0), 0.0, 1.0);
    const double want = base / 40.0 * ramp + base * (1.0 - ramp);
    EXPECT_NEAR(t.inv_freq[size_t(i)], want, 1e-6 * want) << "dim pair " << i;
  }
  // mscale / mscale_all_dim = 1 on the rotary; softmax scale times (0.1 ln 40 + 1)^2.
  EXPECT_FLOAT_EQ(t.cos_sin_scale, 1.0f);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(attention_softmax_scale(v3_rope_config()), m * m / std::sqrt(192.0), 1e-7);
}

TEST(YarnRope, V2LiteMscaleRatio) {
  ModelConfig c = v3_rope_config();
  c.rope_scaling->mscale = 0.707;
  c.rope_scaling->mscale_all_dim = 0.707;
  EXPECT_FLOAT_EQ(make_rope_table(c).cos_sin_scale, 1.0f);
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(attention_softmax_scale(c), m * m / std::sqrt(192.0), 1e-7);
  // Without mscale_all_dim the softmax is unscaled and the rotary carries mscale.
  c.rope_scaling->mscale = 1.0;
  c.rope_scaling->mscale_all_dim = 0.0;
  EXPECT_NEAR(attention_softmax_scale(c), 1.0 / std::sqrt(192.0), 1e-8);
  EXPECT_NEAR(make_rope_table(c).cos_sin_scale, 0.1 * std::log(40.0) + 1.0, 1e-6);
}

TEST(YarnRope, RejectsOddRopeDim) {
  ModelConfig c = v3_rope_config();
  c.qk_rope_head_dim = 63;
  EXPECT_THROW(make_rope_table(c), Error);
}

}  // namespace
}  // namespace mlaserve

#include "io/fp8_block_quant.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "io/portable_random.h"

namespace mlaserve {
namespace {

TEST(Fp8BlockQuant, ScaleShapeCountsPartialBlocks) {
  EXPECT_EQ(fp8_scale_shape(300, 200, 128, 128), (Shape{3, 2}));
  EXPECT_EQ(fp8_scale_shape(128, 256, 128, 128), (Shape{1, 2}));
  EXPECT_EQ(fp8_scale_shape(1, 1, 128, 128), (Shape{1, 1}));
}

// A 300 x 200 matrix has full, right-partial, bottom-partial and corner
// blocks; rows get different magnitudes so blocks get different scales.
TEST(Fp8BlockQuant, RoundTripWithinE4m3Rounding) {
  const int64_t N = 300, K = 200;
  std::vector<float> w(N * K);
  PortableRng rng(5);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = float(rng.normal() * 0.01 * (1 + n / 100));
  Shape ss = fp8_scale_shape(N, K, 128, 128);
  std::vector<uint8_t> q(N * K);
  std::vector<float> s(ss[0] * ss[1]);
  quantize_fp8_blocks(w.data(), N, K, 128, 128, q.data(), s.data());

  for (int64_t bn = 0; bn < ss[0]; ++bn) {
    for (int64_t bk = 0; bk < ss[1]; ++bk) {
      float amax = 0;
      for (int64_t n = bn * 128; n < std::min(N, bn * 128 + 128); ++n)
        for (int64_t k = bk * 128; k < std::min(K, bk * 128 + 128); ++k) amax = std::max(amax, std::fabs(w[n * K + k]));
      EXPECT_FLOAT_EQ(s[bn * ss[1] + bk], amax / 448.0f) << bn << "," << bk;
    }
  }
  std::vector<float> back(N * K);
  dequantize_fp8_blocks(q.data(), s.data(), N, K, 128, 128, back.data());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      float scale = s[(n / 128) * ss[1] + k / 128];
      float manual = fp8e4m3_to_f32(q[n * K + k]) * scale;
      ASSERT_EQ(back[n * K + k], manual);
      // Half a step of e4m3's 3-bit mantissa, or of its 2^-9 subnormal grid.
      float bound = std::max(std::fabs(w[n * K + k]) / 16.0f, scale / 1024.0f) * 1.0001f;
      ASSERT_LE(std::fabs(manual - w[n * K + k]), bound) << n << "," << k;
    }
  }
}

TEST(Fp8BlockQuant, ZeroBlockStaysZeroWithFiniteScale) {
  std::vector<float> w(130 * 4, 0.0f);
  w[129 * 4] = 3.0f;  // only the second block row is non-zero
  std::vector<uint8_t> q(w.size());
  std::vector<float> s(2);
  quantize_fp8_blocks(w.data(), 130, 4, 128, 128, q.data(), s.data());
  EXPECT_TRUE(std::isfinite(s[0]));
  EXPECT_GT(s[0], 0.0f);
  for (int i = 0; i < 128 * 4; ++i) EXPECT_EQ(fp8e4m3_to_f32(q[i]), 0.0f);
  EXPECT_FLOAT_EQ(s[1], 3.0f / 448.0f);
  EXPECT_FLOAT_EQ(fp8e4m3_to_f32(q[129 * 4]) * s[1], 3.0f);
}

}  // namespace
}  // namespace mlaserve

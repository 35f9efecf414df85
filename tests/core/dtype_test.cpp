#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace mlaserve;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, Fp8E4M3DecodesEveryCodeAndRoundTrips) {
  // Every finite code decodes to a value that encodes back to the same code.
  for (int c = 0; c < 256; ++c) {
    float v = fp8e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) {
      EXPECT_EQ(c & 0x7f, 0x7f);
      continue;
    }
    if (v == 0.0f) continue;  // +0 and -0
    EXPECT_EQ(f32_to_fp8e4m3(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_fp8e4m3(1e6f), 0x7e);   // saturates
  EXPECT_EQ(f32_to_fp8e4m3(-1e6f), 0xfe);
  // 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): ties to even.
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_fp8e4m3(1.1875f), 0x3a);
}

TEST(DType, F16RoundTripsAndHandlesSubnormals) {
  for (float v : {0.0f, 1.0f, -3.140625f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(DType, ParsesSafetensorsNames) {
  DType t;
  ASSERT_TRUE(parse_dtype("F8_E4M3", &t));
  EXPECT_EQ(t, DType::F8_E4M3);
  EXPECT_FALSE(parse_dtype("F8_E5M2FNUZ", &t));
}

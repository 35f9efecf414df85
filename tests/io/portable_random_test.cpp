#include "io/portable_random.h"

#include <cmath>

#include <gtest/gtest.h>

namespace mlaserve {
namespace {

TEST(PortableRandom, LogMatchesLibm) {
  for (double x : {1e-300, 1e-10, 0.1, 0.5, 0.70710678, 0.7071068, 0.999999, 1.0, 1.000001, 1.4142, 2.0, 3.0, 10.0,
                   12345.678, 1e300}) {
    EXPECT_NEAR(portable_log(x), std::log(x), 2e-15 * std::max(1.0, std::fabs(std::log(x)))) << x;
  }
  PortableRng rng(1);
  for (int i = 0; i < 100000; ++i) {
    double x = rng.uniform() + 1e-12;
    ASSERT_NEAR(portable_log(x), std::log(x), 2e-15 * std::max(1.0, std::fabs(std::log(x)))) << x;
  }
}

TEST(PortableRandom, SameSeedSameStream) {
  PortableRng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    double x = a.normal();
    ASSERT_EQ(x, b.normal());
    differs |= x != c.normal();
  }
  EXPECT_TRUE(differs);
}

TEST(PortableRandom, UniformInUnitInterval) {
  PortableRng rng(9);
  double lo = 1, hi = 0, sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
  }
  EXPECT_LT(lo, 1e-4);
  EXPECT_GT(hi, 1 - 1e-4);
  EXPECT_NEAR(sum / n, 0.5, 0.003);
}

TEST(PortableRandom, NormalMoments) {
  PortableRng rng(3);
  const int n = 400000;
  double s = 0, s2 = 0, s4 = 0;
  int within1 = 0;
  for (int i = 0; i < n; ++i) {
    double x = rng.normal();
    s += x;
    s2 += x * x;
    s4 += x * x * x * x;
    within1 += std::fabs(x) < 1.0;
  }
  EXPECT_NEAR(s / n, 0.0, 0.006);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_NEAR(s4 / n, 3.0, 0.06);  // normal kurtosis
  EXPECT_NEAR(double(within1) / n, 0.682689, 0.003);
}

TEST(PortableRandom, HashSeparatesNames) {
  EXPECT_NE(hash_name("model.layers.1.mlp.gate_proj.weight"), hash_name("model.layers.1.mlp.up_proj.weight"));
  EXPECT_EQ(hash_name("x"), hash_name(std::string("x")));
}

}  // namespace
}  // namespace mlaserve

// The CPU reference of Backend::sample_rows on a four-token row whose
// weights are worked out by hand: logits {0, ln 2, ln 4, 0} give, at T = 1,
// w = {1/4, 1/2, 1, 1/4} (total 2), and at T = 0.5 w = {1/16, 1/4, 1, 1/16}.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_sampling.h"

namespace mlaserve {
namespace {

const std::vector<float> kRow = {0.0f, std::log(2.0f), std::log(4.0f), 0.0f};

int32_t pick(RowSampling p) { return cpu::sample_row(kRow.data(), int64_t(kRow.size()), p); }

RowSampling draw(double uniform) {
  RowSampling p;
  p.uniform = uniform;
  return p;
}

TEST(CpuSampling, InverseCdfInVocabularyOrderOverAllTokens) {
  // Cumulative weights 0.25, 0.75, 1.75, 2.0 against uniform * 2.
  EXPECT_EQ(pick(draw(0.10)), 0);
  EXPECT_EQ(pick(draw(0.20)), 1);
  EXPECT_EQ(pick(draw(0.50)), 2);
  EXPECT_EQ(pick(draw(0.95)), 3);
}

TEST(CpuSampling, TemperatureSharpensTheWeights) {
  RowSampling p = draw(0.2);  // target 0.275 of 1.375: past token 0 (0.0625), inside token 1 (0.3125)
  p.temperature = 0.5f;
  EXPECT_EQ(pick(p), 1);
  p.uniform = 0.5;  // 0.6875: inside token 2
  EXPECT_EQ(pick(p), 2);
}

TEST(CpuSampling, TopKKeepsTheLargestAndTiesAtTheKthWeight) {
  RowSampling p = draw(0.3);  // top 2 = {1, 2}, total 1.5, target 0.45
  p.top_k = 2;
  EXPECT_EQ(pick(p), 1);
  p.uniform = 0.4;  // 0.6
  EXPECT_EQ(pick(p), 2);
  p.top_k = 3;  // the third weight (1/4) ties with the fourth: both stay
  p.uniform = 0.95;
  EXPECT_EQ(pick(p), 3);
}

TEST(CpuSampling, MinPDropsWeightsBelowItsFractionOfTheMax) {
  RowSampling p = draw(0.3);
  p.min_p = 0.3f;  // keeps w >= 0.3: {1, 2}
  EXPECT_EQ(pick(p), 1);
  p.uniform = 0.0;
  EXPECT_EQ(pick(p), 1);  // token 0 is filtered out even at the first draw
}

TEST(CpuSampling, TopPKeepsTheSmallestHeadReachingTheMass) {
  RowSampling p = draw(0.01);
  p.top_p = 0.5f;  // the top token alone has half the mass
  EXPECT_EQ(pick(p), 2);
  p.top_p = 0.6f;  // needs 1.2 of 2: tokens 2 and 1
  EXPECT_EQ(pick(p), 1);
  p.uniform = 0.9;
  EXPECT_EQ(pick(p), 2);
}

TEST(CpuSampling, GreedySettingsTakeTheFirstMaximum) {
  RowSampling p = draw(0.99);
  p.temperature = 0.0f;
  EXPECT_EQ(pick(p), 2);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(pick(p), 2);
  const std::vector<float> flat = {1.0f, 3.0f, 3.0f};
  RowSampling g;
  g.temperature = 0.0f;
  EXPECT_EQ(cpu::sample_row(flat.data(), 3, g), 1);
}

TEST(CpuSampling, BackendSampleRowsRunsEachRowWithItsSettings) {
  auto backend = make_cpu_backend();
  Tensor logits = Tensor::empty({2, 4}, DType::F32);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 4; ++i) logits.data<float>()[r * 4 + i] = kRow[size_t(i)];
  RowSampling second = draw(0.3);
  second.top_k = 2;
  Tensor ids = backend->alloc({2}, DType::I32);
  backend->sample_rows(logits, {draw(0.1), second}, ids);
  EXPECT_EQ(ids.data<int32_t>()[0], 0);
  EXPECT_EQ(ids.data<int32_t>()[1], 1);
  EXPECT_THROW(backend->sample_rows(logits, {draw(0.1)}, ids), Error);
}

}  // namespace
}  // namespace mlaserve

// DeepseekModelRunner on the CPU backend (the reference): decode steps
// started before the previous one is finished, their input ids naming its
// picks, give the same tokens as steps built from the ids on the host.
#include "runtime/deepseek_runner.h"

#include <gtest/gtest.h>

#include "../model/model_fixture.h"
#include "core/error.h"
#include "overlapped_steps.h"

namespace mlaserve::runtime::testing {
namespace {

TEST(DeepseekModelRunner, StepsStartedFromThePreviousPicksEqualHostBuiltSteps) {
  mlaserve::testing::TempCheckpoint ckpt("tiny", "bf16", 5);
  auto cpu = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *cpu, {MlaMode::Auto, false});
  const std::vector<std::vector<int32_t>> prompts = {{11, 7, 300, 5, 42}, {9, 9, 1000, 2, 77, 31, 8}};
  constexpr int kSlotsPerSeq = 32, kSteps = 6;
  DeepseekModelRunner host_built(model, 2 * kSlotsPerSeq), overlapped(model, 2 * kSlotsPerSeq);
  const auto want = greedy_steps(host_built, prompts, kSlotsPerSeq, kSteps, false);
  const auto got = greedy_steps(overlapped, prompts, kSlotsPerSeq, kSteps, true);
  EXPECT_EQ(got, want);

  // A placeholder must name a row of the step before.
  overlapped.start_step(static_prefill_batch(prompts, kSlotsPerSeq), nullptr);
  EXPECT_THROW(overlapped.start_step(static_decode_batch({-1, -3}, {5, 7}, kSlotsPerSeq), nullptr), Error);
  overlapped.finish_step();
  EXPECT_THROW(overlapped.finish_step(), Error);
}

}  // namespace
}  // namespace mlaserve::runtime::testing

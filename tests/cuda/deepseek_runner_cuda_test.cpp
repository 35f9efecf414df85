// DeepseekModelRunner on CUDA: decode steps started before the previous one
// is finished (input ids naming its picks, resolved on the device, inside
// replayed graphs and eagerly) give the same tokens as steps built from the
// ids on the host.
#include <gtest/gtest.h>

#include "../model/model_fixture.h"
#include "../runtime/overlapped_steps.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "runtime/deepseek_runner.h"

namespace mlaserve::runtime::testing {
namespace {

TEST(DeepseekModelRunnerCuda, StepsStartedFromThePreviousPicksEqualHostBuiltSteps) {
  MLA_SKIP_WITHOUT_GPU();
  mlaserve::testing::TempCheckpoint ckpt("tiny-v2", "bf16", 5);
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu);
  DeepseekModel model(ckpt.get(), *gpu, {MlaMode::Auto, false});
  const std::vector<std::vector<int32_t>> prompts = {{11, 7, 300, 5, 42}, {9, 9, 1000, 2, 77, 31, 8}};
  constexpr int kSlotsPerSeq = 32, kSteps = 6;
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    const CudaGraphSettings settings{graphs, {2}, kSlotsPerSeq};
    DeepseekModelRunner host_built(model, 2 * kSlotsPerSeq, settings), overlapped(model, 2 * kSlotsPerSeq, settings);
    EXPECT_EQ(overlapped.graph_batch_sizes().size(), graphs ? 1u : 0u);
    const auto want = greedy_steps(host_built, prompts, kSlotsPerSeq, kSteps, false);
    const auto got = greedy_steps(overlapped, prompts, kSlotsPerSeq, kSteps, true);
    EXPECT_EQ(got, want);
  }
}

}  // namespace
}  // namespace mlaserve::runtime::testing

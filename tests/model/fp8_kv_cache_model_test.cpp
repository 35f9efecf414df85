// The FP8 latent cache on the CPU reference backend: the golden tiny
// checkpoints decoded with an fp8 cache against the f32 cache (the same
// comparison runs on CUDA against its bf16 cache in tests/cuda).
#include "fp8_kv_cache_fixture.h"

namespace mlaserve::testing {
namespace {

// c_kv carries one e4m3 rounding per element (<= 2^-4 relative, ~2.5% RMS
// on these data). Measured 2026-11-22 (the printed line): logits rel L2
// 0.010 (tiny_v2), 0.014 (tiny), 0.021 (tiny_fp8) over all decode steps,
// worst single row 0.15, max |diff| 0.68 logits. Bounds: 0.05 total (2.4x
// the worst file); steps whose f32-cache top-2 gap exceeds 0.5 logits (about
// the largest shift of a row's top logits seen) must keep their token.
constexpr double kMaxTotalRelL2 = 0.05;
constexpr double kDecisiveGap = 0.5;

class Fp8KvCacheModel : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8KvCacheModel, DecodesLikeTheF32Cache) {
  const auto golden = load_model_golden(GetParam());
  TempCheckpoint ckpt(golden["preset"], golden["dtype"], golden["seed"].get<uint64_t>());
  auto cpu = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *cpu, {MlaMode::Auto, false});
  const KvDtypeComparison c = compare_fp8_kv_cache(model, GetParam(), kDecisiveGap);
  EXPECT_LT(c.total_rel_l2, kMaxTotalRelL2);
  EXPECT_EQ(c.decisive_agree, c.decisive);
  EXPECT_GT(c.decisive, 0) << "no decisive step: the comparison checked no token";
}

INSTANTIATE_TEST_SUITE_P(Golden, Fp8KvCacheModel, ::testing::Values("tiny", "tiny_v2", "tiny_fp8"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace mlaserve::testing

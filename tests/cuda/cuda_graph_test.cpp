// CUDA-graph replay of decode steps equals eager execution: the same model,
// two caches filled identically, decode steps run eagerly on one and through
// captured graphs (padded to the next captured batch size) on the other.
// Steady-state replays must not allocate device memory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "../model/model_fixture.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_graph_runner.h"
#include "kernels/cuda/fp8_moe.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/moe_experts.h"

namespace mlaserve::cuda::testing {
namespace {

// Two sequences at slot bases 0 and 100 of a 256-slot cache; slot 255 is scratch.
constexpr int32_t kBase[2] = {0, 100};
constexpr int kSlots = 256, kScratch = 255;

// One new token per sequence s, whose cache rows start at slot base(s).
template <typename Base>
ForwardBatch decode_batch(const std::vector<int32_t>& tokens, const std::vector<int32_t>& lengths, Base base) {
  ForwardBatch b;
  b.q_indptr = {0};
  b.kv_indptr = {0};
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int32_t pos = lengths[s];  // the new token's position
    b.input_ids.push_back(tokens[s]);
    b.positions.push_back(pos);
    b.out_slots.push_back(base(s) + pos);
    b.q_indptr.push_back(b.q_indptr.back() + 1);
    for (int32_t j = 0; j <= pos; ++j) b.kv_slots.push_back(base(s) + j);
    b.kv_indptr.push_back(int32_t(b.kv_slots.size()));
    b.logit_rows.push_back(int32_t(s));
  }
  return b;
}

ForwardBatch prefill_batch(const std::vector<int32_t>& ids, int seq) {
  ForwardBatch b = contiguous_sequence_batch(ids, 0, false);
  for (auto& s : b.out_slots) s += kBase[seq];
  for (auto& s : b.kv_slots) s += kBase[seq];
  return b;
}

TEST(CudaGraph, ReplayEqualsEagerAndDoesNotAllocate) {
  MLA_SKIP_WITHOUT_GPU();
  mlaserve::testing::TempCheckpoint ckpt("tiny-v2", "bf16", 3);
  auto backend = make_cuda_backend(0);
  ASSERT_TRUE(backend);
  auto& cuda = dynamic_cast<CudaBackend&>(*backend);
  DeepseekModel model(ckpt.get(), *backend, {MlaMode::Auto, false});
  auto eager_cache = allocate_kv_cache(*backend, model.config(), kSlots);
  auto graph_cache = allocate_kv_cache(*backend, model.config(), kSlots);

  const std::vector<std::vector<int32_t>> prompts = {{11, 22, 33, 44, 55}, {7, 8, 9, 10, 11, 12, 13, 14, 15}};
  std::vector<int32_t> tokens, lengths;
  for (int s = 0; s < 2; ++s) {
    model.forward(prefill_batch(prompts[s], s), eager_cache);
    const auto l = mlaserve::testing::to_logits(*backend, model.forward(prefill_batch(prompts[s], s), graph_cache));
    tokens.push_back(mlaserve::testing::argmax(l.row(0)));
    lengths.push_back(int32_t(prompts[s].size()));
  }

  DecodeGraphOptions opt;
  opt.batch_sizes = {1, 4};
  opt.max_kv_len = 64;
  opt.scratch_slot = kScratch;
  auto runner = make_decode_graph_runner(*backend, opt, [&](const ForwardBatch& b) {
    return model.forward(b, graph_cache);
  });
  ASSERT_TRUE(runner);

  int64_t mallocs_after_first = -1;
  for (int step = 0; step < 6; ++step) {
    // One sequence on even steps (graph of 1), both on odd steps (padded to 4).
    const int n = step % 2 ? 2 : 1;
    const std::vector<int32_t> t(tokens.begin(), tokens.begin() + n), len(lengths.begin(), lengths.begin() + n);
    const ForwardBatch b = decode_batch(t, len, [](size_t s) { return kBase[s]; });
    ASSERT_TRUE(runner->can_replay(b));
    const auto eager = mlaserve::testing::to_logits(*backend, model.forward(b, eager_cache));
    const auto graph = mlaserve::testing::to_logits(*backend, runner->replay(b));
    ASSERT_EQ(graph.rows, n);
    for (int s = 0; s < n; ++s) {
      const auto e = eager.row(s), g = graph.row(s);
      const double rel = mlaserve::testing::row_rel_l2(g, e);
      std::printf("[cuda-graph] step %d seq %d (graph of %d): rel_l2 vs eager %.2e\n", step, s, n == 1 ? 1 : 4, rel);
      // Same kernels on the same data; only the split-KV plan can differ.
      EXPECT_LT(rel, 5e-3);
      EXPECT_EQ(mlaserve::testing::argmax(g), mlaserve::testing::argmax(e));
    }
    for (int s = 0; s < n; ++s) {
      tokens[s] = mlaserve::testing::argmax(eager.row(s));
      ++lengths[s];
    }
    if (step == 1) mallocs_after_first = cuda.allocator().device_mallocs();
  }
  EXPECT_EQ(cuda.allocator().device_mallocs(), mallocs_after_first) << "replays allocated device memory";
  EXPECT_FALSE(runner->can_replay(prefill_batch(prompts[0], 0))) << "prefill must run eagerly";
}

// From 64 tokens the MoE runs on the Hopper kernels (grouped_gemm_sm90.h),
// whose tensor maps and workspace a captured graph bakes in. On a model wide
// enough for them (hidden 256, experts of 128; bf16 and block-FP8), a
// 64-sequence decode step replayed from a graph equals the eager step.
TEST(CudaGraph, ReplayEqualsEagerOnTheHopperMoeKernels) {
  MLA_SKIP_WITHOUT_GPU();
  if (!sm90_gemm_supported()) GTEST_SKIP() << "the Hopper MoE kernels need a compute capability 9.0 GPU";
  constexpr int kSeqs = 64, kPrompt = 3, kSlotsPerSeq = 8, kCacheSlots = kSeqs * kSlotsPerSeq + 1;
  // The premise: at these widths a 64-token step takes the Hopper kernels.
  MoeExpertsParams bf16_moe;
  Fp8MoeParams fp8_moe;
  for (MoeBatch* b : {static_cast<MoeBatch*>(&bf16_moe), static_cast<MoeBatch*>(&fp8_moe)}) {
    b->num_tokens = kSeqs;
    b->hidden = 256;
    b->inter = 128;
    b->num_experts = 8;
    b->top_k = 2;
    b->num_shared = 1;
  }
  ASSERT_EQ(moe_path(bf16_moe), MoePath::Sm90);
  ASSERT_EQ(fp8_moe_path(fp8_moe), MoePath::Sm90);
  for (const std::string dtype : {"bf16", "fp8"}) {
    SCOPED_TRACE(dtype);
    ModelConfig c = mlaserve::testing::TempCheckpoint::config_of("tiny", dtype);
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.moe_intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_nextn_predict_layers = 0;
    mlaserve::testing::TempCheckpoint ckpt(c, "wide_moe_" + dtype, 5);
    auto backend = make_cuda_backend(0);
    ASSERT_TRUE(backend);
    DeepseekModel model(ckpt.get(), *backend, {MlaMode::Auto, false});
    auto eager_cache = allocate_kv_cache(*backend, model.config(), kCacheSlots);
    auto graph_cache = allocate_kv_cache(*backend, model.config(), kCacheSlots);

    // All prompts in one prefill batch (192 tokens), sequence s at slots s * kSlotsPerSeq.
    ForwardBatch prefill;
    prefill.q_indptr = {0};
    prefill.kv_indptr = {0};
    for (int s = 0; s < kSeqs; ++s) {
      for (int i = 0; i < kPrompt; ++i) {
        prefill.input_ids.push_back(int32_t(1000 + 37 * s + 11 * i));
        prefill.positions.push_back(i);
        prefill.out_slots.push_back(s * kSlotsPerSeq + i);
        prefill.kv_slots.push_back(s * kSlotsPerSeq + i);
      }
      prefill.q_indptr.push_back(prefill.q_indptr.back() + kPrompt);
      prefill.kv_indptr.push_back(prefill.kv_indptr.back() + kPrompt);
      prefill.logit_rows.push_back((s + 1) * kPrompt - 1);
    }
    model.forward(prefill, eager_cache);
    const auto first = mlaserve::testing::to_logits(*backend, model.forward(prefill, graph_cache));

    std::vector<int32_t> tokens;
    for (int s = 0; s < kSeqs; ++s) tokens.push_back(mlaserve::testing::argmax(first.row(s)));
    const ForwardBatch decode = decode_batch(tokens, std::vector<int32_t>(kSeqs, kPrompt),
                                             [](size_t s) { return int32_t(s) * kSlotsPerSeq; });
    DecodeGraphOptions opt;
    opt.batch_sizes = {kSeqs};
    opt.max_kv_len = kSlotsPerSeq;
    opt.scratch_slot = kCacheSlots - 1;
    auto runner = make_decode_graph_runner(*backend, opt, [&](const ForwardBatch& b) {
      return model.forward(b, graph_cache);
    });
    ASSERT_TRUE(runner && runner->can_replay(decode));
    const auto eager = mlaserve::testing::to_logits(*backend, model.forward(decode, eager_cache));
    const auto graph = mlaserve::testing::to_logits(*backend, runner->replay(decode));
    ASSERT_EQ(graph.rows, kSeqs);
    double worst = 0;
    for (int s = 0; s < kSeqs; ++s) {
      const auto e = eager.row(s), g = graph.row(s);
      worst = std::max(worst, mlaserve::testing::row_rel_l2(g, e));
      EXPECT_EQ(mlaserve::testing::argmax(g), mlaserve::testing::argmax(e)) << "sequence " << s;
    }
    std::printf("[cuda-graph] %s, 64 sequences on the Hopper MoE kernels: worst rel_l2 vs eager %.2e\n",
                dtype.c_str(), worst);
    EXPECT_LT(worst, 5e-3);
  }
}

}  // namespace
}  // namespace mlaserve::cuda::testing

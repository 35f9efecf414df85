// The L2 prefetch is a hint: it must run over any 16-byte aligned ranges
// (chunk tails included) without touching their contents, reject what the
// bulk-prefetch instruction cannot take, and leave a model's logits exactly
// as they are without it (eager and through a captured graph, whose
// side-stream fork must be joined).
#include "kernels/cuda/l2_prefetch.h"

#include <cstring>

#include "../model/model_fixture.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_graph_runner.h"

namespace mlaserve::cuda::testing {
namespace {

TEST(L2Prefetch, RangesWithChunkTailsLeaveTheBytesUnchanged) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const std::vector<uint16_t> host = random_bf16(3 << 20, rng);  // 6 MB
  DeviceBuffer d = upload(host);
  const char* base = static_cast<const char*>(d.get());
  // Whole chunks, a 16-byte tail, one 16-byte range, and an empty one.
  l2_prefetch({{base, 1 << 21}, {base + (1 << 21), (1 << 20) + 16}, {base + 4096, 16}, {base, 0}}, 3, nullptr);
  MLA_CUDA_CHECK(cudaGetLastError(), "test");
  EXPECT_EQ(download<uint16_t>(d, host.size()), host);
}

TEST(L2Prefetch, RejectsMisalignedOrTooManyRanges) {
  MLA_SKIP_WITHOUT_GPU();
  DeviceBuffer d(4096);
  const char* base = static_cast<const char*>(d.get());
  EXPECT_THROW(l2_prefetch({{base + 8, 64}}, 1, nullptr), Error);
  EXPECT_THROW(l2_prefetch({{base, 40}}, 1, nullptr), Error);
  EXPECT_THROW(l2_prefetch(std::vector<ByteRange>(5, {base, 16}), 1, nullptr), Error);
}

// Prefill then three decode steps; the last through a captured graph.
std::vector<mlaserve::testing::Logits> run(bool prefetch) {
  mlaserve::testing::TempCheckpoint ckpt("tiny", "bf16", 3);
  auto backend = make_cuda_backend(0);
  auto& cuda = dynamic_cast<CudaBackend&>(*backend);
  cuda.set_l2_prefetch(prefetch);
  DeepseekModel model(ckpt.get(), *backend, {MlaMode::Auto, false});
  auto cache = allocate_kv_cache(*backend, model.config(), 64);
  const std::vector<int32_t> prompt = {5, 17, 29, 41, 53, 65};
  std::vector<mlaserve::testing::Logits> out;
  out.push_back(mlaserve::testing::to_logits(
      *backend, model.forward(contiguous_sequence_batch(prompt, 0, false), cache)));
  auto decode = [&](int32_t token, int32_t pos) {
    ForwardBatch b;
    b.input_ids = {token};
    b.positions = {pos};
    b.out_slots = {pos};
    b.q_indptr = {0, 1};
    for (int32_t j = 0; j <= pos; ++j) b.kv_slots.push_back(j);
    b.kv_indptr = {0, pos + 1};
    b.logit_rows = {0};
    return b;
  };
  int32_t pos = int32_t(prompt.size());
  for (int step = 0; step < 2; ++step, ++pos)
    out.push_back(mlaserve::testing::to_logits(*backend, model.forward(decode(100 + step, pos), cache)));
  DecodeGraphOptions opt;
  opt.batch_sizes = {1};
  opt.max_kv_len = 64;
  opt.scratch_slot = 63;
  auto runner = make_decode_graph_runner(*backend, opt, [&](const ForwardBatch& b) { return model.forward(b, cache); });
  out.push_back(mlaserve::testing::to_logits(*backend, runner->replay(decode(102, pos))));
  return out;
}

TEST(L2Prefetch, SharedExpertPrefetchLeavesLogitsBitExact) {
  MLA_SKIP_WITHOUT_GPU();
  const auto with = run(true), without = run(false);
  ASSERT_EQ(with.size(), without.size());
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i].v, without[i].v) << "forward " << i;
}

}  // namespace
}  // namespace mlaserve::cuda::testing

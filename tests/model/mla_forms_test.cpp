// Model-internal consistency on random checkpoints: the absorbed and expanded
// MLA forms compute the same logits, and incremental decode through the
// latent cache equals recomputing the whole sequence.
#include <numeric>

#include "model_fixture.h"

namespace mlaserve::testing {
namespace {

// f32 everywhere: the two forms differ only in summation order.
constexpr double kFormTolerance = 1e-4;

class MlaFormsTest : public ::testing::TestWithParam<const char*> {};

std::vector<int32_t> test_sequence(int n, int vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % vocab);
  return ids;
}

TEST_P(MlaFormsTest, AbsorbedEqualsExpanded) {
  TempCheckpoint ckpt(GetParam(), "bf16", 7);
  auto be = make_cpu_backend();
  DeepseekModel absorbed(ckpt.get(), *be, {MlaMode::Absorbed, false});
  DeepseekModel expanded(ckpt.get(), *be, {MlaMode::Expanded, false});
  const auto ids = test_sequence(12, absorbed.config().vocab_size);
  Logits a = full_sequence_logits(absorbed, ids), e = full_sequence_logits(expanded, ids);
  double worst = 0;
  for (int64_t r = 0; r < a.rows; ++r) worst = std::max(worst, max_abs_diff(a.row(r), e.row(r)));
  std::printf("[mla-forms] %s: absorbed vs expanded max |diff| %.3g over %lld rows\n", GetParam(), worst,
              (long long)a.rows);
  EXPECT_LE(worst, kFormTolerance);
}

TEST_P(MlaFormsTest, IncrementalDecodeEqualsRecomputation) {
  TempCheckpoint ckpt(GetParam(), "bf16", 7);
  auto be = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *be, {MlaMode::Auto, false});
  const auto ids = test_sequence(12, model.config().vocab_size);
  Logits full = full_sequence_logits(model, ids);

  // Prefill 5 tokens (expanded form), then decode one token a step (absorbed form).
  const int prefill = 5;
  auto cache = allocate_kv_cache(*be, model.config(), int(ids.size()));
  std::span<const int32_t> all(ids);
  Logits step = to_logits(*be, model.forward(contiguous_sequence_batch(all.first(prefill), 0, false), cache));
  double worst = max_abs_diff(step.row(0), full.row(prefill - 1));
  for (int p = prefill; p < int(ids.size()); ++p) {
    step = to_logits(*be, model.forward(contiguous_sequence_batch(all.subspan(size_t(p), 1), p, false), cache));
    worst = std::max(worst, max_abs_diff(step.row(0), full.row(p)));
  }
  std::printf("[incremental] %s: decode steps vs full recomputation max |diff| %.3g\n", GetParam(), worst);
  EXPECT_LE(worst, kFormTolerance);
}

// Prefills 5 of 12 tokens, then the other 7 over the cached 5 (in `mode`):
// the worst difference of the second chunk's logits from one-shot prefill.
double second_chunk_vs_one_shot(const char* preset, MlaMode mode) {
  TempCheckpoint ckpt(preset, "bf16", 7);
  auto be = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *be, {mode, false});
  const auto ids = test_sequence(12, model.config().vocab_size);
  Logits full = full_sequence_logits(model, ids);
  auto cache = allocate_kv_cache(*be, model.config(), int(ids.size()));
  std::span<const int32_t> all(ids);
  to_logits(*be, model.forward(contiguous_sequence_batch(all.first(5), 0, true), cache));
  Logits rest = to_logits(*be, model.forward(contiguous_sequence_batch(all.subspan(5), 5, true), cache));
  double worst = 0;
  for (int64_t r = 0; r < rest.rows; ++r) worst = std::max(worst, max_abs_diff(rest.row(r), full.row(5 + r)));
  return worst;
}

TEST_P(MlaFormsTest, ChunkedPrefillOverCachedPrefixEqualsOneShot) {
  // Expanded form extending a cached prefix: the chunk's kv_b_proj expansion
  // covers the prefix rows read back from the latent cache.
  const double worst = second_chunk_vs_one_shot(GetParam(), MlaMode::Expanded);
  std::printf("[chunked] %s: second chunk vs one-shot prefill max |diff| %.3g\n", GetParam(), worst);
  EXPECT_LE(worst, kFormTolerance);
}

TEST_P(MlaFormsTest, ShortExtensionOfCachedPrefixEqualsOneShot) {
  // Auto takes the absorbed form for 7 new tokens over a 5-token cached
  // prefix (causal within the new tokens, the kernels' extend rows).
  std::vector<int32_t> seven(7);
  ASSERT_TRUE(absorbed_form_pays_off(contiguous_sequence_batch(seven, 5, true)));
  const double worst = second_chunk_vs_one_shot(GetParam(), MlaMode::Auto);
  std::printf("[absorbed extend] %s: second chunk vs one-shot prefill max |diff| %.3g\n", GetParam(), worst);
  EXPECT_LE(worst, kFormTolerance);
}

TEST_P(MlaFormsTest, MixedBatchSplitsBetweenTheFormsAndEqualsSeparateRuns) {
  // One step as the scheduler builds it: a decode row of sequence a (5
  // cached tokens) first, then the whole 7-token prompt of sequence b. Auto
  // runs a's row absorbed and b's prompt expanded in one forward.
  TempCheckpoint ckpt(GetParam(), "bf16", 7);
  auto be = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *be, {MlaMode::Auto, false, /*min_absorbed_split_rows=*/1});
  const auto a = test_sequence(6, model.config().vocab_size);
  auto b = test_sequence(7, model.config().vocab_size);
  std::reverse(b.begin(), b.end());
  Logits la = full_sequence_logits(model, a), lb = full_sequence_logits(model, b);

  auto cache = allocate_kv_cache(*be, model.config(), 13);
  std::span<const int32_t> all_a(a);
  to_logits(*be, model.forward(contiguous_sequence_batch(all_a.first(5), 0, false), cache));
  ForwardBatch step;
  step.input_ids = {a[5]};
  step.positions = {5};
  step.out_slots = {5};
  step.q_indptr = {0, 1, 8};
  step.kv_indptr = {0, 6, 13};
  step.kv_slots = {0, 1, 2, 3, 4, 5};
  for (int i = 0; i < 7; ++i) {
    step.input_ids.push_back(b[size_t(i)]);
    step.positions.push_back(i);
    step.out_slots.push_back(6 + i);
    step.kv_slots.push_back(6 + i);
  }
  step.logit_rows = {0, 7};
  ASSERT_EQ(absorbed_leading_seqs(step), 1);
  Logits both = to_logits(*be, model.forward(step, cache));
  const double worst = std::max(max_abs_diff(both.row(0), la.row(5)), max_abs_diff(both.row(1), lb.row(6)));
  std::printf("[split] %s: absorbed decode row + expanded prompt vs separate runs max |diff| %.3g\n", GetParam(),
              worst);
  EXPECT_LE(worst, kFormTolerance);
}

TEST_P(MlaFormsTest, TwoSequencesInOneBatchEqualSeparateRuns) {
  TempCheckpoint ckpt(GetParam(), "bf16", 7);
  auto be = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *be, {MlaMode::Auto, false});
  const auto a = test_sequence(6, model.config().vocab_size);
  auto b = test_sequence(9, model.config().vocab_size);
  std::reverse(b.begin(), b.end());
  Logits la = full_sequence_logits(model, a), lb = full_sequence_logits(model, b);

  // Both sequences in one ragged batch, b's slots placed after a's.
  ForwardBatch batch;
  batch.input_ids = a;
  batch.input_ids.insert(batch.input_ids.end(), b.begin(), b.end());
  for (int i = 0; i < 6; ++i) batch.positions.push_back(i);
  for (int i = 0; i < 9; ++i) batch.positions.push_back(i);
  batch.out_slots.resize(15);
  std::iota(batch.out_slots.begin(), batch.out_slots.end(), 0);
  batch.q_indptr = {0, 6, 15};
  batch.kv_indptr = {0, 6, 15};
  batch.kv_slots = batch.out_slots;
  batch.logit_rows = {5, 14};
  auto cache = allocate_kv_cache(*be, model.config(), 15);
  Logits both = to_logits(*be, model.forward(batch, cache));
  const double worst = std::max(max_abs_diff(both.row(0), la.row(5)), max_abs_diff(both.row(1), lb.row(8)));
  std::printf("[ragged] %s: batched vs separate max |diff| %.3g\n", GetParam(), worst);
  EXPECT_LE(worst, kFormTolerance);
}

INSTANTIATE_TEST_SUITE_P(Presets, MlaFormsTest, ::testing::Values("tiny", "tiny-v2"),
                         [](const auto& info) { return std::string(info.param) == "tiny" ? "tiny" : "tiny_v2"; });

ForwardBatch lengths_batch(const std::vector<std::pair<int, int>>& q_kv) {
  ForwardBatch b;
  b.q_indptr = {0};
  b.kv_indptr = {0};
  for (auto [q, kv] : q_kv) {
    b.q_indptr.push_back(b.q_indptr.back() + q);
    b.kv_indptr.push_back(b.kv_indptr.back() + kv);
  }
  return b;
}

TEST(ForwardBatch, SequencesRebaseTokensSlotsAndLogitRows) {
  ForwardBatch b = lengths_batch({{1, 4}, {3, 5}, {2, 2}});
  b.input_ids = {10, 11, 12, 13, 14, 15};
  b.positions = {3, 2, 3, 4, 0, 1};
  b.out_slots = {30, 42, 43, 44, 50, 51};
  b.kv_slots = {0, 1, 2, 30, 40, 41, 42, 43, 44, 50, 51};
  b.logit_rows = {0, 3, 5};
  const ForwardBatch s = b.sequences(1, 3);
  EXPECT_EQ(s.input_ids, (std::vector<int32_t>{11, 12, 13, 14, 15}));
  EXPECT_EQ(s.positions, (std::vector<int32_t>{2, 3, 4, 0, 1}));
  EXPECT_EQ(s.out_slots, (std::vector<int32_t>{42, 43, 44, 50, 51}));
  EXPECT_EQ(s.q_indptr, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(s.kv_indptr, (std::vector<int32_t>{0, 5, 7}));
  EXPECT_EQ(s.kv_slots, (std::vector<int32_t>{40, 41, 42, 43, 44, 50, 51}));
  EXPECT_EQ(s.logit_rows, (std::vector<int32_t>{2, 4}));
}

TEST(MlaMode, AutoTakesAbsorbedForDecodeAndShortExtensionsOfCachedPrefixes) {
  EXPECT_TRUE(absorbed_form_pays_off(lengths_batch({{1, 1}, {1, 900}})));
  EXPECT_TRUE(absorbed_form_pays_off(lengths_batch({{20, 4116}, {1, 300}})));
  EXPECT_TRUE(absorbed_form_pays_off(lengths_batch({{kMaxAbsorbedExtendTokens, kMaxAbsorbedExtendTokens + 1}})));
  // A prompt with nothing cached, a long extension, or one of them in the batch.
  EXPECT_FALSE(absorbed_form_pays_off(lengths_batch({{12, 12}})));
  EXPECT_FALSE(absorbed_form_pays_off(lengths_batch({{kMaxAbsorbedExtendTokens + 1, 8192}})));
  EXPECT_FALSE(absorbed_form_pays_off(lengths_batch({{1, 500}, {30, 30}})));
  // The leading run that qualifies: decode rows, then the prefill chunks.
  EXPECT_EQ(absorbed_leading_seqs(lengths_batch({{1, 500}, {1, 40}, {30, 30}, {1, 9}})), 2);
  EXPECT_EQ(absorbed_leading_seqs(lengths_batch({{300, 300}, {1, 40}})), 0);
  EXPECT_EQ(absorbed_leading_seqs(lengths_batch({{1, 1}, {1, 7}})), 2);
}

TEST(DeepseekModel, RejectsWrongCacheCount) {
  TempCheckpoint ckpt("tiny", "bf16", 7);
  auto be = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *be);
  std::vector<int32_t> ids = {0, 1};
  std::vector<Tensor> too_few(1, allocate_mtp_cache(*be, model.config(), 2));
  EXPECT_THROW(model.forward(contiguous_sequence_batch(ids, 0, false), too_few), Error);
}

TEST(DeepseekModel, RejectsTokenOutsideVocabulary) {
  TempCheckpoint ckpt("tiny", "bf16", 7);
  auto be = make_cpu_backend();
  DeepseekModel model(ckpt.get(), *be);
  std::vector<int32_t> ids = {0, model.config().vocab_size};
  auto cache = allocate_kv_cache(*be, model.config(), 2);
  EXPECT_THROW(model.forward(contiguous_sequence_batch(ids, 0, false), cache), Error);
}

}  // namespace
}  // namespace mlaserve::testing

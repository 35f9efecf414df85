// The CPU forward against transformers' DeepseekV3/V2ForCausalLM on the same
// random checkpoints (tests/data/model/*.json, made on the GPU machine by
// tools/reference/make_model_golden.py; this test re-creates each checkpoint
// with the io layer from the preset, dtype and seed recorded in the file).
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "model_fixture.h"

namespace mlaserve::testing {
namespace {

// Both sides run float32 on identical weight values (bf16, or FP8 times its
// block scale, converted exactly to f32); differences are summation order
// only. Logits have unit scale; measured worst cases over all three files
// (2026-11-22): max |diff| 2.1e-6, relative L2 2.7e-7, log-sum-exp 6e-7.
// The tolerances leave ~50x room for other compilers and BLAS builds.
constexpr double kMaxAbsLogitDiff = 1e-4;
constexpr double kMaxRelL2 = 1e-5;
constexpr double kMaxLogsumexpDiff = 1e-4;

nlohmann::json load_golden(const std::string& name) {
  const auto path = std::filesystem::path(MLASERVE_SOURCE_DIR) / "tests/data/model" / (name + ".json");
  std::ifstream f(path);
  if (!f) throw std::runtime_error("missing golden file " + path.string());
  return nlohmann::json::parse(f);
}

struct RowComparison {
  double max_abs = 0, rel_l2 = 0, lse_diff = 0;
};

// Ours at the reference's top-64 ids, and the full-row log-sum-exp.
RowComparison compare_row(std::span<const float> ours, const nlohmann::json& ref) {
  RowComparison c;
  double diff2 = 0, ref2 = 0;
  const auto& ids = ref["top_ids"];
  const auto& vals = ref["top_logits"];
  for (size_t i = 0; i < ids.size(); ++i) {
    const double r = vals[i].get<double>(), o = ours[ids[i].get<size_t>()];
    c.max_abs = std::max(c.max_abs, std::fabs(o - r));
    diff2 += (o - r) * (o - r);
    ref2 += r * r;
  }
  c.rel_l2 = std::sqrt(diff2 / ref2);
  double m = -INFINITY, s = 0;
  for (float v : ours) m = std::max(m, double(v));
  for (float v : ours) s += std::exp(double(v) - m);
  c.lse_diff = std::fabs(m + std::log(s) - ref["logsumexp"].get<double>());
  return c;
}

void expect_within_tolerance(const RowComparison& c, const std::string& what) {
  std::printf("[golden] %s: max_abs %.3g rel_l2 %.3g lse_diff %.3g\n", what.c_str(), c.max_abs, c.rel_l2, c.lse_diff);
  EXPECT_LE(c.max_abs, kMaxAbsLogitDiff) << what;
  EXPECT_LE(c.rel_l2, kMaxRelL2) << what;
  EXPECT_LE(c.lse_diff, kMaxLogsumexpDiff) << what;
}

class GoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    golden_ = load_golden(GetParam());
    ckpt_ = std::make_unique<TempCheckpoint>(golden_["preset"].get<std::string>(), golden_["dtype"].get<std::string>(),
                                             golden_["seed"].get<uint64_t>());
    backend_ = make_cpu_backend();
  }
  std::vector<int32_t> input_ids(const nlohmann::json& seq) { return seq["input_ids"].get<std::vector<int32_t>>(); }

  nlohmann::json golden_;
  std::unique_ptr<TempCheckpoint> ckpt_;
  std::unique_ptr<Backend> backend_;
};

TEST_P(GoldenTest, EveryPrefixMatchesTransformers) {
  for (MlaMode mode : {MlaMode::Expanded, MlaMode::Absorbed}) {
    DeepseekModel model(ckpt_->get(), *backend_, {mode, false});
    const char* form = mode == MlaMode::Expanded ? "expanded" : "absorbed";
    int s = 0;
    for (const auto& seq : golden_["sequences"]) {
      const auto ids = input_ids(seq);
      Logits logits = full_sequence_logits(model, ids);
      for (size_t p = 0; p < ids.size(); ++p)
        expect_within_tolerance(compare_row(logits.row(int64_t(p)), seq["prefixes"][p]),
                                fmt::format("{} {} seq{} prefix {}", GetParam(), form, s, p + 1));
      ++s;
    }
  }
}

TEST_P(GoldenTest, GreedyContinuationIsIdentical) {
  DeepseekModel model(ckpt_->get(), *backend_, {MlaMode::Auto, false});
  for (const auto& seq : golden_["sequences"]) {
    const auto ids = input_ids(seq);
    const auto want = seq["greedy"].get<std::vector<int32_t>>();
    auto cache = allocate_kv_cache(*backend_, model.config(), int(ids.size() + want.size()));
    std::vector<int32_t> got;
    Logits l = to_logits(*backend_, model.forward(contiguous_sequence_batch(ids, 0, false), cache));
    got.push_back(argmax(l.row(0)));
    while (got.size() < want.size()) {
      const int32_t pos = int32_t(ids.size() + got.size() - 1);
      l = to_logits(*backend_, model.forward(contiguous_sequence_batch({&got.back(), 1}, pos, false), cache));
      got.push_back(argmax(l.row(0)));
    }
    std::printf("[golden] %s greedy %zu tokens after %zu (reference min top-2 gap %.3g)\n", GetParam(), want.size(),
                ids.size(), seq["greedy_min_top2_gap"].get<double>());
    EXPECT_EQ(got, want);
  }
}

// The checkpoints with an MTP (NextN) layer.
class GoldenMtpTest : public GoldenTest {};

TEST_P(GoldenMtpTest, MtpLogitsMatchTransformersLayers) {
  DeepseekModel model(ckpt_->get(), *backend_, {MlaMode::Auto, true});
  ASSERT_TRUE(model.has_mtp()) << GetParam() << " should have an MTP layer";
  int s = 0;
  for (const auto& seq : golden_["sequences"]) {
    const auto ids = input_ids(seq);
    const int n = int(ids.size()) - 1;  // position i predicts token i + 2 from h_i and token i + 1
    auto cache = allocate_kv_cache(*backend_, model.config(), int(ids.size()));
    Tensor hidden;
    model.forward(contiguous_sequence_batch(ids, 0, false), cache, &hidden);
    Tensor mtp_cache = allocate_mtp_cache(*backend_, model.config(), n);
    std::span<const int32_t> next(ids);
    Logits mtp = to_logits(*backend_, model.mtp_forward(contiguous_sequence_batch(next.subspan(1), 0, true),
                                                        hidden.slice_rows(0, n), mtp_cache));
    ASSERT_EQ(size_t(n), seq["mtp"].size());
    for (int i = 0; i < n; ++i)
      expect_within_tolerance(compare_row(mtp.row(i), seq["mtp"][size_t(i)]),
                              fmt::format("{} mtp seq{} position {}", GetParam(), s, i));
    ++s;
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, GoldenTest, ::testing::Values("tiny", "tiny_v2", "tiny_fp8"),
                         [](const auto& info) { return std::string(info.param); });
INSTANTIATE_TEST_SUITE_P(Checkpoints, GoldenMtpTest, ::testing::Values("tiny", "tiny_fp8"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace mlaserve::testing

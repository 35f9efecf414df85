// GPU sampling against the semantics in sampling.h, computed on the host in
// double: the chosen token must be kept by the filters and its cumulative
// interval (vocabulary order, kept tokens only) must hold uniform * total.
// Logits are a shuffled grid (distinct, no near-ties); tolerances cover f32
// sums over 129k terms.
#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuda_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr int64_t kVocab = 129280;

std::vector<float> grid_logits(std::mt19937& rng) {
  std::vector<float> l(kVocab);
  for (int64_t i = 0; i < kVocab; ++i) l[i] = -6.0f + 12.0f * float(i) / kVocab;
  std::shuffle(l.begin(), l.end(), rng);
  return l;
}

// Host weights and the kept-token threshold (weights >= it are kept).
struct HostPlan {
  std::vector<double> w;
  double threshold = 0;
};

HostPlan plan(const std::vector<float>& l, const RowSamplingParams& p, double top_p_slack) {
  HostPlan h;
  const double mx = *std::max_element(l.begin(), l.end());
  h.w.resize(l.size());
  for (size_t i = 0; i < l.size(); ++i) h.w[i] = std::exp((l[i] - mx) / p.temperature);
  std::vector<double> sorted = h.w;
  std::sort(sorted.rbegin(), sorted.rend());
  if (p.top_k > 0 && p.top_k < int64_t(sorted.size())) h.threshold = sorted[size_t(p.top_k) - 1];
  if (p.min_p > 0) h.threshold = std::max(h.threshold, double(p.min_p));
  if (p.top_p < 1) {
    double mass = 0;
    for (double v : sorted)
      if (v >= h.threshold) mass += v;
    double cum = 0;
    for (double v : sorted) {
      if (v < h.threshold) break;
      cum += v;
      if (cum >= (p.top_p + top_p_slack) * mass) {
        h.threshold = v;
        break;
      }
    }
  }
  return h;
}

// Row counts 1, 6, 30, 36 and 140 (36 rows repeated) take every CTA count a
// row the sampler picks on a 132-SM Hopper (8, 8, 4, 2, 1).
TEST(Sampling, GreedyAndFilteredDrawsFollowTheSemanticsAtEveryRowCount) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  const std::vector<RowSamplingParams> cases = {
      {1.0f, 200, 0.8f, 0.01f, 0.0f},   // all three (the one-row run's)
      {0.7f, 50, 1.0f, 0.0f, 0.0f},     // top-k
      {1.0f, -1, 0.9f, 0.0f, 0.0f},     // top-p
      {1.3f, -1, 1.0f, 0.05f, 0.0f},    // min-p
      {0.0f, -1, 1.0f, 0.0f, 0.5f},     // greedy
      {1.0f, -1, 1.0f, 0.0f, 0.0f},     // temperature only, whole vocabulary
  };
  constexpr int kRowsPerCase = 6;
  std::vector<RowSamplingParams> params;
  std::vector<float> logits;
  for (int r = 0; r < kRowsPerCase; ++r)
    for (const auto& c : cases) {
      RowSamplingParams p = c;
      p.uniform = uni(rng) * 0.999f;
      params.push_back(p);
      const auto l = grid_logits(rng);
      logits.insert(logits.end(), l.begin(), l.end());
    }
  const int64_t unique = int64_t(params.size());
  // Per unique row: the argmax, and the kept threshold with the top-p
  // boundary allowed to move by 0.1% of the mass (f32 sums), and exactly.
  std::vector<int64_t> argmax(unique);
  std::vector<HostPlan> loose(unique), exact(unique);
  for (int64_t r = 0; r < unique; ++r) {
    const std::vector<float> l(logits.begin() + r * kVocab, logits.begin() + (r + 1) * kVocab);
    argmax[r] = std::max_element(l.begin(), l.end()) - l.begin();
    if (params[r].temperature < 1e-5f) continue;
    loose[r] = plan(l, params[r], 1e-3);
    exact[r] = plan(l, params[r], 0.0);
  }
  for (const int64_t rows : {int64_t(1), int64_t(6), int64_t(30), unique, int64_t(140)}) {
    std::vector<RowSamplingParams> run_params;
    std::vector<float> run_logits;
    for (int64_t r = 0; r < rows; ++r) {
      run_params.push_back(params[r % unique]);
      run_logits.insert(run_logits.end(), logits.begin() + (r % unique) * kVocab,
                        logits.begin() + (r % unique + 1) * kVocab);
    }
    auto dl = upload(run_logits), dp = upload(run_params);
    auto dids = poisoned(rows * 4);
    sample_tokens(dl.get<float>(), rows, kVocab, dp.get<RowSamplingParams>(), dids.get<int32_t>(), nullptr);
    const auto ids = download<int32_t>(dids, rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t u = r % unique;
      const RowSamplingParams& p = params[u];
      ASSERT_GE(ids[r], 0) << rows << " rows, row " << r;
      ASSERT_LT(ids[r], kVocab) << rows << " rows, row " << r;
      if (p.temperature < 1e-5f) {
        EXPECT_EQ(ids[r], argmax[u]) << rows << " rows, row " << r;
        continue;
      }
      EXPECT_GE(loose[u].w[ids[r]], loose[u].threshold * (1 - 1e-5)) << rows << " rows, row " << r
                                                                      << " picked a filtered token";
      double total = 0, before = 0;
      for (int64_t i = 0; i < kVocab; ++i) {
        if (exact[u].w[i] < exact[u].threshold) continue;
        if (i < ids[r]) before += exact[u].w[i];
        total += exact[u].w[i];
      }
      const double target = p.uniform * total, after = before + exact[u].w[ids[r]], tol = 2e-3 * total;
      EXPECT_LE(before - tol, target) << rows << " rows, row " << r;
      EXPECT_GE(after + tol, target) << rows << " rows, row " << r;
    }
  }
}

}  // namespace
}  // namespace mlaserve::cuda::testing

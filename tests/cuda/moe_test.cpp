// MoE routing (all three methods) and the fused expert path (align, grouped
// GEMMs, SiLU-and-mul, combine) against straightforward host references.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda_test_util.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_router.h"

namespace mlaserve::cuda::testing {
namespace {

struct RouteCase {
  RouteMethod method;
  bool sigmoid;
  int experts, top_k, n_group, topk_group;
  bool renormalize;
  float scaling;
};

// Host routing as DESIGN.md states it.
void route_host(const RouteCase& c, const float* logits, const std::vector<float>& bias, std::vector<int>& ids,
                std::vector<double>& weights) {
  const int E = c.experts;
  std::vector<double> score(E), sel(E);
  double mx = *std::max_element(logits, logits + E), sum = 0;
  for (int e = 0; e < E; ++e) {
    score[e] = c.sigmoid ? 1 / (1 + std::exp(-double(logits[e]))) : std::exp(double(logits[e]) - mx);
    sum += score[e];
  }
  if (!c.sigmoid)
    for (auto& s : score) s /= sum;
  for (int e = 0; e < E; ++e) sel[e] = score[e] + (c.method == RouteMethod::NoauxTc ? bias[e] : 0.0);
  if (c.method != RouteMethod::Greedy) {
    const int gs = E / c.n_group;
    std::vector<std::pair<double, int>> groups;
    for (int gi = 0; gi < c.n_group; ++gi) {
      std::vector<double> v(sel.begin() + gi * gs, sel.begin() + (gi + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      groups.push_back({c.method == RouteMethod::NoauxTc ? v[0] + v[1] : v[0], gi});
    }
    std::stable_sort(groups.begin(), groups.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<bool> keep(c.n_group, false);
    for (int k = 0; k < c.topk_group; ++k) keep[groups[k].second] = true;
    for (int e = 0; e < E; ++e)
      if (!keep[e / gs]) sel[e] = -INFINITY;
  }
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
  ids.assign(order.begin(), order.begin() + c.top_k);
  double wsum = 0;
  weights.clear();
  for (int id : ids) wsum += score[id];
  for (int id : ids) weights.push_back(score[id] / (c.renormalize ? wsum : 1.0) * c.scaling);
}

class Route : public ::testing::TestWithParam<RouteCase> {};

TEST_P(Route, PicksTheSameExpertsAndWeightsAsTheHost) {
  MLA_SKIP_WITHOUT_GPU();
  const RouteCase c = GetParam();
  const int T = 37;
  std::mt19937 rng(c.experts * 7 + int(c.method));
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(size_t(T) * c.experts), bias(c.experts);
  for (auto& v : logits) v = nd(rng);
  for (auto& v : bias) v = 0.1f * nd(rng);
  auto dlogits = upload(logits), dbias = upload(bias);
  auto dids = poisoned(size_t(T) * c.top_k * 4), dw = poisoned(size_t(T) * c.top_k * 4);
  MoeRouteParams p;
  p.logits = dlogits.get<float>();
  p.bias = c.method == RouteMethod::NoauxTc ? dbias.get<float>() : nullptr;
  p.num_tokens = T;
  p.num_experts = c.experts;
  p.method = c.method;
  p.sigmoid = c.sigmoid;
  p.top_k = c.top_k;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.renormalize = c.renormalize;
  p.scaling = c.scaling;
  p.topk_ids = dids.get<int32_t>();
  p.topk_weights = dw.get<float>();
  moe_route(p, nullptr);
  auto ids = download<int32_t>(dids, size_t(T) * c.top_k);
  auto w = download<float>(dw, size_t(T) * c.top_k);
  for (int t = 0; t < T; ++t) {
    std::vector<int> ref_ids;
    std::vector<double> ref_w;
    route_host(c, logits.data() + size_t(t) * c.experts, bias, ref_ids, ref_w);
    for (int j = 0; j < c.top_k; ++j) {
      ASSERT_EQ(ids[t * c.top_k + j], ref_ids[j]) << "token " << t << " rank " << j;
      ASSERT_NEAR(w[t * c.top_k + j], ref_w[j], 1e-5 * std::max(1.0, std::abs(ref_w[j])));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Methods, Route,
    ::testing::Values(RouteCase{RouteMethod::Greedy, false, 64, 6, 1, 1, false, 1.0f},         // V2-Lite
                      RouteCase{RouteMethod::GroupLimitedGreedy, false, 160, 6, 8, 3, false, 16.0f},  // V2
                      RouteCase{RouteMethod::NoauxTc, true, 256, 8, 8, 4, true, 2.5f},      // V3
                      RouteCase{RouteMethod::Greedy, false, 8, 2, 1, 1, true, 1.0f}));

struct ExpertCase {
  int tokens, hidden, inter, experts, top_k;
  bool addend;
};

double run_experts(const ExpertCase& c, unsigned seed) {
  std::mt19937 rng(seed);
  const int T = c.tokens, D = c.hidden, I = c.inter, E = c.experts, K = c.top_k;
  auto x = random_bf16(size_t(T) * D, rng);
  // Separate gate {E, I, D} and up {E, I, D}, stacked into the kernel's interleaved gate_up.
  auto wg = random_bf16(size_t(E) * I * D, rng, 0.05f), wu = random_bf16(size_t(E) * I * D, rng, 0.05f);
  auto wd = random_bf16(size_t(E) * D * I, rng, 0.05f);
  std::vector<uint16_t> wgu(size_t(E) * 2 * I * D);
  for (size_t e = 0; e < size_t(E); ++e)
    for (int i = 0; i < I; ++i)
      for (int d = 0; d < D; ++d) {
        wgu[(e * 2 * I + gate_up_row(i, false)) * D + d] = wg[(e * I + i) * D + d];
        wgu[(e * 2 * I + gate_up_row(i, true)) * D + d] = wu[(e * I + i) * D + d];
      }
  auto add = random_bf16(size_t(T) * D, rng);
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<float> w(size_t(T) * K);
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  for (int t = 0; t < T; ++t) {
    std::vector<int> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < K; ++j) {
      ids[t * K + j] = all[j];
      w[t * K + j] = uw(rng);
    }
  }
  std::vector<double> ref(size_t(T) * D, 0.0);
  std::vector<double> h(I);
  for (int t = 0; t < T; ++t) {
    for (int d = 0; d < D; ++d) ref[size_t(t) * D + d] = c.addend ? bf16_to_f32(add[size_t(t) * D + d]) : 0.0;
    for (int j = 0; j < K; ++j) {
      const size_t e = ids[t * K + j];
      for (int i = 0; i < I; ++i) {
        double gsum = 0, usum = 0;
        for (int d = 0; d < D; ++d) {
          const double xv = bf16_to_f32(x[size_t(t) * D + d]);
          gsum += xv * bf16_to_f32(wg[(e * I + i) * D + d]);
          usum += xv * bf16_to_f32(wu[(e * I + i) * D + d]);
        }
        h[i] = gsum / (1 + std::exp(-gsum)) * usum;
      }
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int i = 0; i < I; ++i) acc += h[i] * bf16_to_f32(wd[(e * D + d) * I + i]);
        ref[size_t(t) * D + d] += w[t * K + j] * acc;
      }
    }
  }
  auto dx = upload(x), dgu = upload(wgu), dd = upload(wd), dadd = upload(add), dids = upload(ids), dw = upload(w);
  auto dout = poisoned(size_t(T) * D * 2);
  DeviceBuffer work(moe_workspace_bytes(T, K, E, D, I));
  MoeExpertsParams p;
  p.x = dx.get<__nv_bfloat16>();
  p.w_gate_up = dgu.get<__nv_bfloat16>();
  p.w_down = dd.get<__nv_bfloat16>();
  p.topk_ids = dids.get<int32_t>();
  p.topk_weights = dw.get<float>();
  p.addend = c.addend ? dadd.get<__nv_bfloat16>() : nullptr;
  p.num_tokens = T;
  p.hidden = D;
  p.inter = I;
  p.num_experts = E;
  p.top_k = K;
  p.out = dout.get<__nv_bfloat16>();
  moe_experts(p, work.get(), nullptr);
  const double err = rel_l2(to_float(download<uint16_t>(dout, ref.size())), ref);
  std::printf("[rel_l2] moe_experts T=%d D=%d I=%d E=%d k=%d block_m=%d: %.2e\n", T, D, I, E, K,
              moe_block_m(T, K, E), err);
  return err;
}

TEST(MoeExperts, DecodeSizedBatch) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_experts({3, 256, 128, 8, 2, false}, 1), 1e-2);
}

TEST(MoeExperts, LargerBatchUsesWideRowBlocksAndAddsTheAddend) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_experts({150, 256, 192, 8, 3, true}, 2), 1e-2);
}

TEST(MoeExperts, RaggedWidthsAndV2LiteWidths) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_experts({5, 200, 72, 4, 2, true}, 3), 1e-2);  // N, K not multiples of the tiles
  EXPECT_LT(run_experts({2, 2048, 1408, 64, 6, true}, 4), 1e-2);
}

}  // namespace
}  // namespace mlaserve::cuda::testing

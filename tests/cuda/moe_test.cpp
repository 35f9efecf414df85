// MoE routing (all three methods) and the fused expert path (align, grouped
// GEMMs, SiLU-and-mul, combine) against straightforward host references.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
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
  bool coarse = false;  // logits and bias on a coarse grid: scores and group scores tie often
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
  for (auto& v : logits) v = c.coarse ? std::round(nd(rng) / 2) : nd(rng);
  for (auto& v : bias) v = c.coarse ? 0.25f * std::round(nd(rng)) : 0.1f * nd(rng);
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
                      RouteCase{RouteMethod::Greedy, false, 8, 2, 1, 1, true, 1.0f},
                      // Groups of 32 (each a lane slot) with max-score groups, and ties
                      // between experts and between groups (lower index first).
                      RouteCase{RouteMethod::GroupLimitedGreedy, false, 256, 6, 8, 3, false, 16.0f},
                      RouteCase{RouteMethod::GroupLimitedGreedy, false, 256, 8, 8, 4, false, 1.0f, true},
                      RouteCase{RouteMethod::NoauxTc, true, 256, 8, 8, 4, true, 2.5f, true}));

struct ExpertCase {
  int tokens, hidden, inter, experts, top_k, shared;
  MoePath path;
  bool repeat_experts = false;  // tokens may name one expert in several of their slots
};

const char* path_name(MoePath p) {
  switch (p) {
    case MoePath::Small:
      return "small";
    case MoePath::Grouped:
      return "grouped";
    case MoePath::Sm90:
      return "sm90";
    default:
      return "auto";
  }
}

struct ExpertRun {
  double rel_l2;
  std::vector<uint16_t> out;
};

// Random experts (E routed + S shared, stacked as moe_experts.h says) and
// routing; the device result against an f64 host reference in which shared
// expert s is one more expert every token takes with weight 1.
ExpertRun run_experts(const ExpertCase& c, unsigned seed, const MoeSmallTuning& tuning = {}) {
  std::mt19937 rng(seed);
  const int T = c.tokens, D = c.hidden, I = c.inter, E = c.experts, K = c.top_k, S = c.shared, X = E + S;
  auto x = random_bf16(size_t(T) * D, rng);
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<float> w(size_t(T) * K);
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  std::vector<bool> used(size_t(X), false);
  for (int s = 0; s < S; ++s) used[size_t(E + s)] = true;
  for (int t = 0; t < T; ++t) {
    std::vector<int> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < K; ++j) {
      ids[t * K + j] = c.repeat_experts && j % 2 == 1 ? all[j - 1] : all[j];
      w[t * K + j] = uw(rng);
      used[size_t(ids[t * K + j])] = true;
    }
  }
  // Separate gate {X, I, D} and up {X, I, D}, stacked into the kernel's
  // interleaved gate_up. Random only where routed (at v2-lite width the whole
  // stack would take seconds to fill); unused experts stay zero.
  std::vector<uint16_t> wg(size_t(X) * I * D), wu(wg.size()), wd(size_t(X) * D * I), wgu(size_t(X) * 2 * I * D);
  const size_t mat = size_t(I) * D;
  for (size_t e = 0; e < size_t(X); ++e) {
    if (!used[e]) continue;
    for (auto* m : {&wg, &wu, &wd}) {
      const auto r = random_bf16(mat, rng, 0.05f);
      std::copy(r.begin(), r.end(), m->begin() + std::ptrdiff_t(e * mat));
    }
    for (int i = 0; i < I; ++i)
      for (int d = 0; d < D; ++d) {
        wgu[(e * 2 * I + gate_up_row(i, false)) * D + d] = wg[(e * I + i) * D + d];
        wgu[(e * 2 * I + gate_up_row(i, true)) * D + d] = wu[(e * I + i) * D + d];
      }
  }
  std::vector<double> ref(size_t(T) * D, 0.0);
  std::vector<double> h(I);
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < K + S; ++j) {
      const size_t e = j < K ? size_t(ids[t * K + j]) : size_t(E + j - K);
      const double weight = j < K ? w[t * K + j] : 1.0;
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
        ref[size_t(t) * D + d] += weight * acc;
      }
    }
  }
  auto dx = upload(x), dgu = upload(wgu), dd = upload(wd), dids = upload(ids), dw = upload(w);
  auto dout = poisoned(size_t(T) * D * 2);
  MoeExpertsParams p;
  p.x = dx.get<__nv_bfloat16>();
  p.w_gate_up = dgu.get<__nv_bfloat16>();
  p.w_down = dd.get<__nv_bfloat16>();
  p.topk_ids = dids.get<int32_t>();
  p.topk_weights = dw.get<float>();
  p.num_tokens = T;
  p.hidden = D;
  p.inter = I;
  p.num_experts = E;
  p.top_k = K;
  p.num_shared = S;
  p.path = c.path;
  p.tuning = tuning;
  p.out = dout.get<__nv_bfloat16>();
  DeviceBuffer work(moe_workspace_bytes(p));
  moe_experts(p, work.get(), nullptr);
  ExpertRun r;
  r.out = download<uint16_t>(dout, ref.size());
  r.rel_l2 = rel_l2(to_float(r.out), ref);
  std::printf("[rel_l2] moe_experts %s T=%d D=%d I=%d E=%d k=%d shared=%d%s: %.2e\n", path_name(moe_path(p)), T, D, I,
              E, K, S, c.repeat_experts ? " repeated" : "", r.rel_l2);
  return r;
}

class MoeExpertsPaths : public ::testing::TestWithParam<MoePath> {};

TEST_P(MoeExpertsPaths, DecodeSizedBatchesWithAndWithoutSharedExperts) {
  MLA_SKIP_WITHOUT_GPU();
  const MoePath path = GetParam();
  EXPECT_LT(run_experts({1, 256, 128, 8, 2, 0, path}, 1).rel_l2, 1e-2);
  EXPECT_LT(run_experts({1, 256, 128, 8, 2, 2, path}, 2).rel_l2, 1e-2);
  EXPECT_LT(run_experts({3, 256, 128, 8, 2, 1, path}, 3).rel_l2, 1e-2);
  EXPECT_LT(run_experts({8, 256, 128, 8, 3, 2, path}, 4).rel_l2, 1e-2);  // tokens share experts
}

TEST_P(MoeExpertsPaths, RaggedWidthsAndRepeatedExperts) {
  MLA_SKIP_WITHOUT_GPU();
  const MoePath path = GetParam();
  EXPECT_LT(run_experts({5, 200, 72, 4, 2, 1, path}, 5).rel_l2, 1e-2);  // N, K not multiples of the tiles
  EXPECT_LT(run_experts({4, 256, 128, 8, 4, 1, path, true}, 6).rel_l2, 1e-2);
  EXPECT_LT(run_experts({1, 256, 128, 8, 4, 0, path, true}, 7).rel_l2, 1e-2);
}

TEST_P(MoeExpertsPaths, V2LiteWidths) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_experts({1, 2048, 1408, 64, 6, 2, GetParam()}, 8).rel_l2, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Paths, MoeExpertsPaths, ::testing::Values(MoePath::Small, MoePath::Grouped),
                         [](const auto& info) { return std::string(path_name(info.param)); });

TEST(MoeExperts, LargerBatchUsesWideRowBlocksWithSharedExperts) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_experts({150, 256, 192, 8, 3, 2, MoePath::Auto}, 10).rel_l2, 1e-2);
}

// From kMoeSm90MinTokens tokens Auto runs the Hopper kernels (H100/H200),
// both row tiles: 600 tokens x 3 slots over 9 experts = 200 rows an expert
// (128-row tiles), 700 tokens x 3 slots over 8 experts = 263 (64-row tiles).
TEST(MoeExperts, PrefillBatchesTakeTheHopperKernelsOnSm90) {
  MLA_SKIP_WITHOUT_GPU();
  static_assert(kMoeSm90MinTokens <= 600, "the cases below must reach the Hopper kernels");
  EXPECT_LT(run_experts({600, 256, 128, 8, 2, 1, MoePath::Auto}, 12).rel_l2, 1e-2);
  EXPECT_LT(run_experts({700, 256, 128, 8, 3, 0, MoePath::Auto}, 13).rel_l2, 1e-2);
  MoeExpertsParams p;
  p.num_tokens = kMoeSm90MinTokens;
  p.hidden = 256;
  p.inter = 128;
  p.num_experts = 8;
  p.top_k = 3;
  EXPECT_EQ(moe_path(p), sm90_gemm_supported() ? MoePath::Sm90 : MoePath::Grouped);
  p.inter = 136;  // not a multiple of 128: the grouped path
  EXPECT_EQ(moe_path(p), MoePath::Grouped);
  p.inter = 128;
  p.num_tokens = kMoeSm90MinTokens - 1;
  EXPECT_EQ(moe_path(p), MoePath::Grouped);
}

TEST(MoeExperts, SmallPathIsDeterministicForEveryTuning) {
  MLA_SKIP_WITHOUT_GPU();
  const ExpertCase c{6, 256, 136, 8, 3, 2, MoePath::Small};
  for (int cols : {1, 2, 4})
    for (int rows : {2, 4, 8}) {
      MoeSmallTuning t;
      t.gate_up_cols_per_warp = cols;
      t.down_rows_per_warp = rows;
      const ExpertRun a = run_experts(c, 11, t), b = run_experts(c, 11, t);
      EXPECT_LT(a.rel_l2, 1e-2) << cols << " cols, " << rows << " rows";
      EXPECT_EQ(a.out, b.out) << cols << " cols, " << rows << " rows";
    }
}

TEST(MoeExperts, AutoPicksTheSmallPathOnlyForDecodeSizedBatches) {
  MoeExpertsParams p;
  p.num_experts = 64;
  p.top_k = 6;
  p.num_shared = 2;
  p.num_tokens = 1;
  EXPECT_EQ(moe_path(p), MoePath::Small);
  p.num_tokens = kMoeSmallMaxTokens;
  EXPECT_EQ(moe_path(p), MoePath::Small);
  p.num_tokens = kMoeSmallMaxTokens + 1;
  EXPECT_EQ(moe_path(p), MoePath::Grouped);
}

// rel_l2 of n bf16 values of a host tensor against n f32 values of another.
double rel_l2_bf16_vs_f32(const Tensor& got_bf16, const Tensor& want_f32, size_t n) {
  std::vector<float> got(n);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) {
    got[i] = bf16_to_f32(got_bf16.data<uint16_t>()[i]);
    want[i] = want_f32.data<float>()[i];
  }
  return rel_l2(got, want);
}

// E random experts of width I over D and a shared MLP of width S * I as the
// host views the model hands the backends (the values live in `store`).
struct HostExperts {
  std::vector<std::vector<uint16_t>> store;
  std::vector<Weight> gate, up, down;
  SharedExpertWeights shared;
  HostExperts(int64_t E, int64_t I, int64_t D, int64_t S, std::mt19937& rng) {
    store.reserve(size_t(3 * E + 3));
    auto host_weight = [&](int64_t n, int64_t k) {
      store.push_back(random_bf16(size_t(n * k), rng, 0.08f));
      return Weight{Tensor::wrap(store.back().data(), {n, k}, DType::BF16, Device::CPU), {}};
    };
    for (int64_t e = 0; e < E; ++e) {
      gate.push_back(host_weight(I, D));
      up.push_back(host_weight(I, D));
      down.push_back(host_weight(D, I));
    }
    shared = SharedExpertWeights{host_weight(S * I, D), host_weight(S * I, D), host_weight(D, S * I)};
  }
  ExpertWeights load(Backend& be) const { return be.load_experts(gate, up, down, shared); }
};

// The model's path: CudaBackend folds the shared MLP (width S * I) into S
// stacked experts; the CPU backend (the reference) runs it whole. Weights are
// handed over as host views, as the model does.
class BackendSharedExperts : public ::testing::TestWithParam<int> {};

TEST_P(BackendSharedExperts, FoldedSharedExpertsMatchTheCpuBackend) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t T = GetParam(), D = 256, I = 128, E = 8, K = 2, S = 2;
  std::mt19937 rng(100 + unsigned(T));
  const HostExperts host(E, I, D, S, rng);
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> weights(ids.size());
  std::uniform_real_distribution<float> wdist(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < K; ++j) ids[size_t(t * K + j)] = perm[size_t(j)], weights[size_t(t * K + j)] = wdist(rng);
  }
  std::vector<uint16_t> x = random_bf16(size_t(T * D), rng);
  std::vector<float> x_f32 = to_float(x);

  auto cpu = make_cpu_backend();
  const ExpertWeights cpu_experts = host.load(*cpu);
  Tensor cpu_out = cpu->alloc({T, D}, DType::F32);
  cpu->moe_experts(Tensor::wrap(x_f32.data(), {T, D}, DType::F32, Device::CPU), cpu_experts,
                   Tensor::wrap(ids.data(), {T, K}, DType::I32, Device::CPU),
                   Tensor::wrap(weights.data(), {T, K}, DType::F32, Device::CPU), cpu_out);

  CudaBackend cuda;
  const ExpertWeights cuda_experts = host.load(cuda);
  ASSERT_EQ(cuda_experts.num_shared, int(S));
  ASSERT_EQ(cuda_experts.num_experts(), int(E));
  Tensor dx = cuda.load_tensor(Tensor::wrap(x.data(), {T, D}, DType::BF16, Device::CPU));
  Tensor dids = cuda.load_tensor(Tensor::wrap(ids.data(), {T, K}, DType::I32, Device::CPU));
  Tensor dw = cuda.load_tensor(Tensor::wrap(weights.data(), {T, K}, DType::F32, Device::CPU));
  Tensor out = cuda.alloc({T, D}, DType::BF16);
  cuda.moe_experts(dx, cuda_experts, dids, dw, out);
  const double err = rel_l2_bf16_vs_f32(cuda.to_host(out), cpu_out, size_t(T * D));
  std::printf("[rel_l2] backend moe_experts with %d shared experts, T=%d, CUDA vs CPU: %.2e\n", int(S), int(T), err);
  EXPECT_LT(err, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Tokens, BackendSharedExperts, ::testing::Values(1, 5, 40));

RouterParams v2_lite_routing() {  // softmax, greedy top 6
  RouterParams p;
  p.top_k = 6;
  return p;
}

RouterParams v3_routing_in_8_groups() {  // V3's: sigmoid, the correction bias, 8 groups keeping 4, top 8
  RouterParams p;
  p.method = TopkMethod::NoauxTc;
  p.scoring = ScoringFunc::Sigmoid;
  p.top_k = 8;
  p.n_group = 8;
  p.topk_group = 4;
  p.renormalize = true;
  p.scaling = 2.5f;
  return p;
}

// Backend::moe_route_experts: a decode token routed inside the small path's
// kernels (CUDA, up to 64 routed experts) gives what moe_route then
// moe_experts give, bit for bit, routing included, for the three methods;
// a larger batch takes those two ops; the CPU reference agrees with both.
TEST(BackendRouteExperts, RoutingInsideTheKernelsEqualsRouteThenExperts) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t D = 256, I = 128, E = 64, S = 2;
  std::mt19937 rng(77);
  const HostExperts host(E, I, D, S, rng);
  auto cpu = make_cpu_backend();
  CudaBackend cuda;
  const ExpertWeights cpu_experts = host.load(*cpu);
  const ExpertWeights cuda_experts = host.load(cuda);

  const RouterParams v2_lite = v2_lite_routing();
  RouterParams grouped = v2_lite;
  grouped.method = TopkMethod::GroupLimitedGreedy;
  grouped.n_group = 8;
  grouped.topk_group = 3;
  grouped.scaling = 16.0f;
  const RouterParams noaux = v3_routing_in_8_groups();
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const RouterParams& rp : {v2_lite, grouped, noaux})
    for (int64_t T : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "method " << int(rp.method) << ", " << T << " tokens");
      const int64_t K = rp.top_k;
      std::vector<float> logits(static_cast<size_t>(T * E)), bias(static_cast<size_t>(E));
      for (auto& v : logits) v = nd(rng);
      for (auto& v : bias) v = 0.1f * nd(rng);
      std::vector<uint16_t> x = random_bf16(size_t(T * D), rng);
      Tensor dx = cuda.load_tensor(Tensor::wrap(x.data(), {T, D}, DType::BF16, Device::CPU));
      Tensor dlogits = cuda.load_tensor(Tensor::wrap(logits.data(), {T, E}, DType::F32, Device::CPU));
      const bool biased = rp.method == TopkMethod::NoauxTc;
      Tensor dbias = biased ? cuda.load_tensor(Tensor::wrap(bias.data(), {E}, DType::F32, Device::CPU)) : Tensor();

      Tensor ids_a = cuda.alloc({T, K}, DType::I32), w_a = cuda.alloc({T, K}, DType::F32);
      Tensor out_a = cuda.alloc({T, D}, DType::BF16);
      cuda.moe_route(dlogits, dbias, rp, ids_a, w_a);
      cuda.moe_experts(dx, cuda_experts, ids_a, w_a, out_a);
      Tensor ids_b = cuda.alloc({T, K}, DType::I32), w_b = cuda.alloc({T, K}, DType::F32);
      Tensor out_b = cuda.alloc({T, D}, DType::BF16);
      cuda.moe_route_experts(dx, cuda_experts, dlogits, dbias, rp, ids_b, w_b, out_b);

      const Tensor ha = cuda.to_host(out_a), hb = cuda.to_host(out_b);
      const Tensor ia = cuda.to_host(ids_a), ib = cuda.to_host(ids_b), wa = cuda.to_host(w_a), wb = cuda.to_host(w_b);
      EXPECT_EQ(std::vector<int32_t>(ia.data<int32_t>(), ia.data<int32_t>() + T * K),
                std::vector<int32_t>(ib.data<int32_t>(), ib.data<int32_t>() + T * K));
      EXPECT_EQ(std::vector<float>(wa.data<float>(), wa.data<float>() + T * K),
                std::vector<float>(wb.data<float>(), wb.data<float>() + T * K));
      EXPECT_EQ(std::vector<uint16_t>(ha.data<uint16_t>(), ha.data<uint16_t>() + T * D),
                std::vector<uint16_t>(hb.data<uint16_t>(), hb.data<uint16_t>() + T * D));

      std::vector<float> x_f32 = to_float(x);
      Tensor cpu_ids = cpu->alloc({T, K}, DType::I32), cpu_w = cpu->alloc({T, K}, DType::F32);
      Tensor cpu_out = cpu->alloc({T, D}, DType::F32);
      cpu->moe_route_experts(Tensor::wrap(x_f32.data(), {T, D}, DType::F32, Device::CPU), cpu_experts,
                             Tensor::wrap(logits.data(), {T, E}, DType::F32, Device::CPU),
                             biased ? Tensor::wrap(bias.data(), {E}, DType::F32, Device::CPU) : Tensor(), rp, cpu_ids,
                             cpu_w, cpu_out);
      EXPECT_EQ(std::vector<int32_t>(cpu_ids.data<int32_t>(), cpu_ids.data<int32_t>() + T * K),
                std::vector<int32_t>(ib.data<int32_t>(), ib.data<int32_t>() + T * K));
      const double err = rel_l2_bf16_vs_f32(hb, cpu_out, size_t(T * D));
      std::printf("[rel_l2] backend moe_route_experts method %d, T=%d, CUDA vs CPU: %.2e\n", int(rp.method), int(T),
                  err);
      EXPECT_LT(err, 1e-2);
    }
  // Logits of another expert count are refused before anything runs.
  Tensor x = cuda.alloc({1, D}, DType::BF16), narrow = cuda.alloc({1, E - 1}, DType::F32);
  Tensor ids = cuda.alloc({1, 6}, DType::I32), w = cuda.alloc({1, 6}, DType::F32);
  Tensor out = cuda.alloc({1, D}, DType::BF16);
  EXPECT_THROW(cuda.moe_route_experts(x, cuda_experts, narrow, Tensor(), v2_lite, ids, w, out), Error);
}

// A post-attention norm the decode chain left pending (PendingNorm: the
// residual row, the parts of its sum of squares, logits times its rms):
// moe_route_experts given it (the small path's kernels form x and scale the
// logits themselves; past 64 experts it completes the norm first) gives what
// finish_pending_norm followed by moe_route_experts gives, bit for bit; and
// finish_pending_norm gives the f64 norm of the row and the scaled logits.
TEST(BackendRouteExperts, APendingNormEqualsTheNormFinishedFirst) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t D = 256, I = 128, S = 2;
  std::mt19937 rng(79);
  CudaBackend cuda;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Sigmoid scores (V3's method) depend on the logits' scale, softmax's top-k does not.
  for (int64_t E : {64, 96})
    for (const RouterParams& rp : {v2_lite_routing(), v3_routing_in_8_groups()}) {
      SCOPED_TRACE(::testing::Message() << E << " experts, method " << int(rp.method));
      const HostExperts host(E, I, D, S, rng);
      const ExpertWeights experts = host.load(cuda);
      const int64_t K = rp.top_k, parts_n = 7;
      std::vector<uint16_t> row = random_bf16(size_t(D), rng, 3.0f), weight = random_bf16(size_t(D), rng, 1.0f);
      const std::vector<float> row_f = to_float(row), weight_f = to_float(weight);
      // The parts: sums of squares of uneven pieces of the row, as the chain's blocks form them.
      std::vector<float> parts(static_cast<size_t>(parts_n), 0.0f);
      double ss = 0.0;
      for (int64_t i = 0; i < D; ++i) {
        parts[size_t(i * i % parts_n)] += row_f[size_t(i)] * row_f[size_t(i)];
        ss += double(row_f[size_t(i)]) * row_f[size_t(i)];
      }
      const double rms = std::sqrt(ss / double(D) + 1e-6);
      std::vector<float> logits(static_cast<size_t>(E)), bias(static_cast<size_t>(E));
      for (auto& v : logits) v = float(rms) * nd(rng);
      for (auto& v : bias) v = 0.1f * nd(rng);
      const bool biased = rp.method == TopkMethod::NoauxTc;
      Tensor dbias = biased ? cuda.load_tensor(Tensor::wrap(bias.data(), {E}, DType::F32, Device::CPU)) : Tensor();
      PendingNorm pending{cuda.load_tensor(Tensor::wrap(row.data(), {1, D}, DType::BF16, Device::CPU)),
                          cuda.load_tensor(Tensor::wrap(weight.data(), {D}, DType::BF16, Device::CPU)), 1e-6f,
                          cuda.load_tensor(Tensor::wrap(parts.data(), {parts_n}, DType::F32, Device::CPU))};
      auto logits_on_gpu = [&] {
        return cuda.load_tensor(Tensor::wrap(logits.data(), {1, E}, DType::F32, Device::CPU));
      };

      Tensor x_a = cuda.alloc({1, D}, DType::BF16), logits_a = logits_on_gpu();
      Tensor ids_a = cuda.alloc({1, K}, DType::I32), w_a = cuda.alloc({1, K}, DType::F32);
      Tensor out_a = cuda.alloc({1, D}, DType::BF16);
      cuda.moe_route_experts(x_a, experts, logits_a, dbias, rp, ids_a, w_a, out_a, &pending);
      Tensor x_b = cuda.alloc({1, D}, DType::BF16), logits_b = logits_on_gpu();
      Tensor ids_b = cuda.alloc({1, K}, DType::I32), w_b = cuda.alloc({1, K}, DType::F32);
      Tensor out_b = cuda.alloc({1, D}, DType::BF16);
      cuda.finish_pending_norm(pending, x_b, logits_b);
      cuda.moe_route_experts(x_b, experts, logits_b, dbias, rp, ids_b, w_b, out_b);

      const Tensor ia = cuda.to_host(ids_a), ib = cuda.to_host(ids_b), wa = cuda.to_host(w_a), wb = cuda.to_host(w_b);
      const Tensor ha = cuda.to_host(out_a), hb = cuda.to_host(out_b);
      EXPECT_EQ(std::vector<int32_t>(ia.data<int32_t>(), ia.data<int32_t>() + K),
                std::vector<int32_t>(ib.data<int32_t>(), ib.data<int32_t>() + K));
      EXPECT_EQ(std::vector<float>(wa.data<float>(), wa.data<float>() + K),
                std::vector<float>(wb.data<float>(), wb.data<float>() + K));
      EXPECT_EQ(std::vector<uint16_t>(ha.data<uint16_t>(), ha.data<uint16_t>() + D),
                std::vector<uint16_t>(hb.data<uint16_t>(), hb.data<uint16_t>() + D));

      const Tensor normed = cuda.to_host(x_b), scaled = cuda.to_host(logits_b);
      std::vector<double> normed_ref(static_cast<size_t>(D)), logits_ref(static_cast<size_t>(E));
      for (int64_t i = 0; i < D; ++i) normed_ref[size_t(i)] = row_f[size_t(i)] / rms * weight_f[size_t(i)];
      for (int64_t e = 0; e < E; ++e) logits_ref[size_t(e)] = logits[size_t(e)] / rms;
      const double normed_err = rel_l2(to_float({normed.data<uint16_t>(), normed.data<uint16_t>() + D}), normed_ref);
      const double logits_err = rel_l2({scaled.data<float>(), scaled.data<float>() + E}, logits_ref);
      std::printf("[rel_l2] finish_pending_norm, %d experts: normed vs f64 %.2e, logits %.2e\n", int(E), normed_err,
                  logits_err);
      EXPECT_LT(normed_err, 4e-3);  // bf16's rounding of the normed values
      EXPECT_LT(logits_err, 1e-6);
    }
}

}  // namespace
}  // namespace mlaserve::cuda::testing

// Each CPU op against a naive double-precision loop on random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/backend.h"

namespace mlaserve {
namespace {

class CpuOpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng{1234};

  Tensor random_f32(Shape s, float scale = 1.0f) {
    Tensor t = Tensor::empty(std::move(s), DType::F32);
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t;
  }
  Tensor random_bf16(Shape s, float scale = 1.0f) {
    Tensor t = Tensor::empty(std::move(s), DType::BF16);
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint16_t>()[i] = f32_to_bf16(d(rng));
    return t;
  }
  static Tensor i32(std::vector<int32_t> v) {
    Tensor t = Tensor::empty({int64_t(v.size())}, DType::I32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  }
};

void expect_close(const Tensor& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.numel(), int64_t(want.size()));
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got.data<float>()[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  EXPECT_LE(max_diff, tol * std::max(1.0, max_ref)) << "max |diff| " << max_diff << ", max |ref| " << max_ref;
}

// The naive reference of a linear layer from an already dequantized f64 matrix.
std::vector<double> naive_linear(const Tensor& x, const std::vector<double>& w, int64_t N, int64_t K) {
  const int64_t T = x.dim(0);
  std::vector<double> out(size_t(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x.data<float>()[t * K + k]) * w[size_t(n * K + k)];
      out[size_t(t * N + n)] = s;
    }
  return out;
}

TEST_F(CpuOpsTest, LinearBf16MatchesNaive) {
  // 1-4 rows take the streaming decode path, more the tiled sgemm path; K = 77
  // leaves a tail that fills no 16-wide chunk.
  const int64_t N = 131, K = 77;
  Tensor w = random_bf16({N, K});
  std::vector<double> wd(size_t(N * K));
  for (int64_t i = 0; i < N * K; ++i) wd[size_t(i)] = bf16_to_f32(w.data<uint16_t>()[i]);
  for (int64_t T : {1, 2, 5}) {
    Tensor x = random_f32({T, K});
    Tensor out = be->alloc({T, N}, DType::F32);
    be->linear(x, be->load_weight(w, {}), out);
    expect_close(out, naive_linear(x, wd, N, K), 1e-5);
  }
}

TEST_F(CpuOpsTest, LinearF32MatchesNaive) {
  const int64_t T = 3, N = 70, K = 33;
  Tensor x = random_f32({T, K}), w = random_f32({N, K});
  std::vector<double> wd(w.data<float>(), w.data<float>() + N * K);
  Tensor out = be->alloc({T, N}, DType::F32);
  be->linear(x, be->load_weight(w, {}), out);
  expect_close(out, naive_linear(x, wd, N, K), 1e-5);
}

TEST_F(CpuOpsTest, LinearBlockFp8UsesEachBlocksScale) {
  // Ragged edges (200 = 128 + 72, 300 = 2 * 128 + 44) check the ceil-divided scale grid.
  const int64_t N = 200, K = 300;
  Tensor w = Tensor::empty({N, K}, DType::F8_E4M3);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < N * K; ++i) {
    int v = byte(rng);
    if ((v & 0x7f) == 0x7f) v = 0x10;  // skip NaN encodings
    w.data<uint8_t>()[i] = uint8_t(v);
  }
  Tensor scale = random_f32({2, 3}, 0.01f);
  std::vector<double> wd(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      wd[size_t(n * K + k)] = double(fp8e4m3_to_f32(w.data<uint8_t>()[n * K + k])) *
                              double(scale.data<float>()[(n / 128) * 3 + k / 128]);
  for (int64_t T : {1, 4, 7}) {
    Tensor x = random_f32({T, K});
    Tensor out = be->alloc({T, N}, DType::F32);
    be->linear(x, be->load_weight(w, scale), out);
    expect_close(out, naive_linear(x, wd, N, K), 1e-5);
  }
}

TEST_F(CpuOpsTest, LoadWeightRejectsWrongScaleShape) {
  Tensor w = Tensor::zeros({200, 300}, DType::F8_E4M3);
  EXPECT_THROW(be->load_weight(w, Tensor::zeros({1, 3}, DType::F32)), Error);
  EXPECT_THROW(be->load_weight(w, {}), Error);
}

TEST_F(CpuOpsTest, RmsNormWithAndWithoutResidual) {
  const int64_t T = 3, D = 48;
  const float eps = 1e-6f;
  Tensor x = random_f32({T, D}), w = random_bf16({D}), res = random_f32({T, D});
  std::vector<double> want(size_t(T * D)), want_res(size_t(T * D));
  for (int pass = 0; pass < 2; ++pass) {
    const bool fused = pass == 1;
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) {
        double v = double(x.data<float>()[t * D + i]) + (fused ? double(res.data<float>()[t * D + i]) : 0.0);
        want_res[size_t(t * D + i)] = v;
        ss += v * v;
      }
      for (int64_t i = 0; i < D; ++i)
        want[size_t(t * D + i)] =
            want_res[size_t(t * D + i)] / std::sqrt(ss / D + eps) * bf16_to_f32(w.data<uint16_t>()[i]);
    }
    Tensor out = be->alloc({T, D}, DType::F32);
    be->rms_norm(x, w, eps, out, fused ? res : Tensor());
    expect_close(out, want, 1e-5);
    if (fused) expect_close(res, want_res, 1e-6);
  }
}

TEST_F(CpuOpsTest, RopeRotatesInterleavedPairs) {
  const int64_t T = 4, H = 3, W = 10, offset = 2, F = 4;
  Tensor x = random_f32({T, H, W}), inv_freq = random_f32({F}, 0.5f);
  Tensor pos = i32({0, 5, 17, 1000});
  const float scale = 1.3f;
  std::vector<double> want(x.data<float>(), x.data<float>() + x.numel());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < F; ++i) {
        double angle = double(float(pos.data<int32_t>()[t]) * inv_freq.data<float>()[i]);
        double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
        size_t base = size_t((t * H + h) * W + offset + 2 * i);
        double a = want[base], b = want[base + 1];
        want[base] = a * c - b * s;
        want[base + 1] = b * c + a * s;
      }
  be->rope(x, int(offset), pos, inv_freq, scale);
  expect_close(x, want, 1e-5);
}

TEST_F(CpuOpsTest, SiluAndMulAddAndCopyColumns) {
  Tensor g = random_f32({3, 5}), u = random_f32({3, 5}), out = be->alloc({3, 5}, DType::F32);
  std::vector<double> want(15);
  for (int i = 0; i < 15; ++i) {
    double a = g.data<float>()[i];
    want[size_t(i)] = a / (1 + std::exp(-a)) * u.data<float>()[i];
  }
  be->silu_and_mul(g, u, out);
  expect_close(out, want, 1e-6);

  std::vector<double> sum(15);
  for (int i = 0; i < 15; ++i) sum[size_t(i)] = double(out.data<float>()[i]) + g.data<float>()[i];
  be->add(out, g);
  expect_close(out, sum, 1e-6);

  Tensor src = random_f32({2, 3, 4}), dst = Tensor::zeros({6, 7}, DType::F32);
  be->copy_columns(src, 1, dst, 4, 3);
  std::vector<double> cols(42, 0.0);
  for (int r = 0; r < 6; ++r)
    for (int j = 0; j < 3; ++j) cols[size_t(r * 7 + 4 + j)] = src.data<float>()[r * 4 + 1 + j];
  expect_close(dst, cols, 0);
  EXPECT_THROW(be->copy_columns(src, 2, dst, 0, 3), Error);
}

TEST_F(CpuOpsTest, ScatterGatherAndEmbedding) {
  Tensor cache = Tensor::zeros({6, 3}, DType::F32), rows = random_f32({2, 3});
  be->scatter_rows(cache, rows, i32({4, 1}));
  Tensor back = be->alloc({2, 3}, DType::F32);
  be->gather_rows(cache, i32({4, 1}), back);
  expect_close(back, std::vector<double>(rows.data<float>(), rows.data<float>() + 6), 0);
  EXPECT_THROW(be->scatter_rows(cache, rows, i32({6, 0})), Error);

  Tensor table = random_bf16({10, 4}), out = be->alloc({3, 4}, DType::F32);
  be->embedding(i32({7, 0, 7}), table, out);
  std::vector<double> want;
  for (int id : {7, 0, 7})
    for (int i = 0; i < 4; ++i) want.push_back(bf16_to_f32(table.data<uint16_t>()[id * 4 + i]));
  expect_close(out, want, 0);
  EXPECT_THROW(be->embedding(i32({10}), table, be->alloc({1, 4}, DType::F32)), Error);
  // Ids below zero name ids an earlier step picked.
  be->embedding(i32({-1, -2, 7}), table, out, i32({7, 0}));
  expect_close(out, want, 0);
  EXPECT_THROW(be->embedding(i32({-3}), table, be->alloc({1, 4}, DType::F32), i32({7, 0})), Error);
  EXPECT_THROW(be->embedding(i32({-1}), table, be->alloc({1, 4}, DType::F32)), Error);
}

TEST_F(CpuOpsTest, HeadBmmBothLayouts) {
  const int64_t T = 3, H = 2, K = 4, Kx = 6, N = 5;
  Tensor x = random_f32({T, H, Kx});
  for (bool transpose : {false, true}) {
    Tensor w = transpose ? random_f32({H, N, K}) : random_f32({H, K, N});
    Tensor out = be->alloc({T, H, N}, DType::F32);
    be->head_bmm(x, Weight{w, {}}, transpose, out);
    std::vector<double> want(size_t(T * H * N), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) {
            double wv = transpose ? w.data<float>()[(h * N + n) * K + k] : w.data<float>()[(h * K + k) * N + n];
            want[size_t((t * H + h) * N + n)] += double(x.data<float>()[(t * H + h) * Kx + k]) * wv;
          }
    expect_close(out, want, 1e-5);
  }
}

// Two sequences: one extends a 3-token prefix by 2 tokens, one is a fresh 1-token decode.
ForwardBatch ragged_batch() {
  ForwardBatch b;
  b.input_ids = {1, 2, 3};
  b.positions = {3, 4, 0};
  b.out_slots = {9, 2, 6};
  b.q_indptr = {0, 2, 3};
  b.kv_indptr = {0, 5, 6};
  b.kv_slots = {7, 0, 5, 9, 2, 6};
  b.logit_rows = {1, 2};
  return b;
}

struct Window {
  int begin, count;
};
std::vector<Window> windows_of(const ForwardBatch& b) {
  return {{0, 4}, {0, 5}, {5, 1}};  // token i of seq 0 sees prefix 3 + i + 1
}

std::vector<double> naive_softmax(std::vector<double> s) {
  double m = *std::max_element(s.begin(), s.end()), z = 0;
  for (double& v : s) z += v = std::exp(v - m);
  for (double& v : s) v /= z;
  return s;
}

TEST_F(CpuOpsTest, AbsorbedAttentionMatchesNaive) {
  const int64_t H = 3, L = 8, R = 4, S = 10;
  const float scale = 0.3f;
  ForwardBatch fb = ragged_batch();
  DeviceBatch db = be->prepare_batch(fb);
  Tensor q = random_f32({3, H, L + R}), cache = random_f32({S, L + R});
  Tensor out = be->alloc({3, H, L}, DType::F32);
  be->mla_attention_absorbed(q, cache, db, scale, out);
  std::vector<double> want(size_t(3 * H * L), 0.0);
  auto win = windows_of(fb);
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < H; ++h) {
      std::vector<double> s;
      for (int j = 0; j < win[size_t(t)].count; ++j) {
        int slot = fb.kv_slots[size_t(win[size_t(t)].begin + j)];
        double d = 0;
        for (int i = 0; i < L + R; ++i) d += double(q.data<float>()[(t * H + h) * (L + R) + i]) * cache.data<float>()[slot * (L + R) + i];
        s.push_back(d * scale);
      }
      auto p = naive_softmax(s);
      for (int j = 0; j < win[size_t(t)].count; ++j) {
        int slot = fb.kv_slots[size_t(win[size_t(t)].begin + j)];
        for (int l = 0; l < L; ++l) want[size_t((t * H + h) * L + l)] += p[size_t(j)] * cache.data<float>()[slot * (L + R) + l];
      }
    }
  expect_close(out, want, 1e-5);
}

TEST_F(CpuOpsTest, ExpandedAttentionMatchesNaive) {
  const int64_t H = 2, Dn = 6, R = 4, Dv = 5, Lk = 6;
  const float scale = 0.25f;
  ForwardBatch fb = ragged_batch();
  DeviceBatch db = be->prepare_batch(fb);
  Tensor q = random_f32({3, H, Dn + R}), kv = random_f32({Lk, H, Dn + Dv}), k_pe = random_f32({Lk, R});
  Tensor out = be->alloc({3, H, Dv}, DType::F32);
  be->mla_attention_expanded(q, kv, k_pe, db, scale, out);
  std::vector<double> want(size_t(3 * H * Dv), 0.0);
  auto win = windows_of(fb);
  const float* qp = q.data<float>();
  const float* kvp = kv.data<float>();
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < H; ++h) {
      std::vector<double> s;
      for (int j = 0; j < win[size_t(t)].count; ++j) {
        int r = win[size_t(t)].begin + j;
        double d = 0;
        for (int i = 0; i < Dn; ++i) d += double(qp[(t * H + h) * (Dn + R) + i]) * kvp[(r * H + h) * (Dn + Dv) + i];
        for (int i = 0; i < R; ++i) d += double(qp[(t * H + h) * (Dn + R) + Dn + i]) * k_pe.data<float>()[r * R + i];
        s.push_back(d * scale);
      }
      auto p = naive_softmax(s);
      for (int j = 0; j < win[size_t(t)].count; ++j) {
        int r = win[size_t(t)].begin + j;
        for (int d = 0; d < Dv; ++d) want[size_t((t * H + h) * Dv + d)] += p[size_t(j)] * kvp[(r * H + h) * (Dn + Dv) + Dn + d];
      }
    }
  expect_close(out, want, 1e-5);
}

// Reference routing by brute force: all (score, expert) pairs sorted in f64.
struct Routed {
  std::vector<int> ids;
  std::vector<double> weights;
};
Routed naive_route(const float* logits, int E, const std::vector<double>& bias, const RouterParams& p) {
  std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  if (p.scoring == ScoringFunc::Softmax) {
    score = naive_softmax(std::vector<double>(logits, logits + E));
  } else {
    for (int e = 0; e < E; ++e) score[size_t(e)] = 1 / (1 + std::exp(-double(logits[e])));
  }
  for (int e = 0; e < E; ++e) choice[size_t(e)] = score[size_t(e)] + (bias.empty() ? 0 : bias[size_t(e)]);
  std::vector<bool> allowed(size_t(E), true);
  if (p.method != TopkMethod::Greedy) {
    const int gs = E / p.n_group;
    std::vector<std::pair<double, int>> groups;
    for (int g = 0; g < p.n_group; ++g) {
      std::vector<double> in(choice.begin() + g * gs, choice.begin() + (g + 1) * gs);
      std::sort(in.rbegin(), in.rend());
      groups.push_back({p.method == TopkMethod::GroupLimitedGreedy ? in[0] : in[0] + in[1], g});
    }
    std::sort(groups.rbegin(), groups.rend());
    std::fill(allowed.begin(), allowed.end(), false);
    for (int i = 0; i < p.topk_group; ++i)
      for (int e = 0; e < gs; ++e) allowed[size_t(groups[size_t(i)].second * gs + e)] = true;
  }
  std::vector<std::pair<double, int>> cand;
  for (int e = 0; e < E; ++e)
    if (allowed[size_t(e)]) cand.push_back({choice[size_t(e)], e});
  std::sort(cand.rbegin(), cand.rend());
  Routed r;
  double sum = 0;
  for (int j = 0; j < p.top_k; ++j) {
    r.ids.push_back(cand[size_t(j)].second);
    r.weights.push_back(score[size_t(cand[size_t(j)].second)]);
    sum += r.weights.back();
  }
  for (double& w : r.weights) w = (p.renormalize ? w / sum : w) * p.scaling;
  return r;
}

TEST_F(CpuOpsTest, RoutingMethodsMatchNaive) {
  const int T = 6, E = 16;
  Tensor logits = random_f32({T, E}, 2.0f);
  Tensor bias = random_f32({E}, 0.1f);
  std::vector<double> bias_d(bias.data<float>(), bias.data<float>() + E);
  std::vector<RouterParams> cases(3);
  cases[0] = {TopkMethod::Greedy, ScoringFunc::Softmax, 3, 1, 1, false, 1.5f};
  cases[1] = {TopkMethod::GroupLimitedGreedy, ScoringFunc::Softmax, 4, 4, 2, true, 1.0f};
  cases[2] = {TopkMethod::NoauxTc, ScoringFunc::Sigmoid, 4, 4, 2, true, 2.5f};
  for (const RouterParams& p : cases) {
    const bool use_bias = p.method == TopkMethod::NoauxTc;
    Tensor ids = be->alloc({T, p.top_k}, DType::I32), w = be->alloc({T, p.top_k}, DType::F32);
    be->moe_route(logits, use_bias ? bias : Tensor(), p, ids, w);
    for (int t = 0; t < T; ++t) {
      Routed want = naive_route(logits.data<float>() + t * E, E, use_bias ? bias_d : std::vector<double>(), p);
      std::vector<std::pair<int, double>> got_pairs, want_pairs;
      for (int j = 0; j < p.top_k; ++j) {
        got_pairs.push_back({ids.data<int32_t>()[t * p.top_k + j], w.data<float>()[t * p.top_k + j]});
        want_pairs.push_back({want.ids[size_t(j)], want.weights[size_t(j)]});
      }
      std::sort(got_pairs.begin(), got_pairs.end());
      std::sort(want_pairs.begin(), want_pairs.end());
      for (int j = 0; j < p.top_k; ++j) {
        EXPECT_EQ(got_pairs[size_t(j)].first, want_pairs[size_t(j)].first) << "method " << int(p.method) << " token " << t;
        EXPECT_NEAR(got_pairs[size_t(j)].second, want_pairs[size_t(j)].second, 1e-5);
      }
    }
  }
}

TEST_F(CpuOpsTest, RoutingRejectsImpossibleGroupLimits) {
  Tensor logits = random_f32({2, 16});
  Tensor ids = be->alloc({2, 5}, DType::I32), w = be->alloc({2, 5}, DType::F32);
  RouterParams p{TopkMethod::GroupLimitedGreedy, ScoringFunc::Softmax, 5, 4, 1, false, 1.0f};
  EXPECT_THROW(be->moe_route(logits, {}, p, ids, w), Error);  // 1 group of 4 cannot give 5 experts
  p.n_group = 5;
  EXPECT_THROW(be->moe_route(logits, {}, p, ids, w), Error);  // 16 experts do not split into 5 groups
}

// down(silu(gate · x) * (up · x)) of one bf16 MLP in f64, as written in DESIGN.md.
std::vector<double> naive_mlp(const Tensor& gw, const Tensor& uw, const Tensor& dw, const float* x) {
  const int64_t I = gw.dim(0), D = gw.dim(1);
  auto bf = [](const Tensor& t, int64_t i) { return double(bf16_to_f32(t.data<uint16_t>()[i])); };
  std::vector<double> hidden(size_t(I), 0.0), y(size_t(D), 0.0);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t d = 0; d < D; ++d) {
      g += bf(gw, i * D + d) * x[d];
      u += bf(uw, i * D + d) * x[d];
    }
    hidden[size_t(i)] = g / (1 + std::exp(-g)) * u;
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t i = 0; i < I; ++i) y[size_t(d)] += bf(dw, d * I + i) * hidden[size_t(i)];
  return y;
}

TEST_F(CpuOpsTest, MoeExpertsMatchNaiveWithAndWithoutSharedExperts) {
  const int64_t T = 5, D = 12, I = 7, E = 4, k = 2, S = 2;
  std::vector<Weight> gate, up, down;
  for (int e = 0; e < E; ++e) {
    gate.push_back({random_bf16({I, D}, 0.3f), {}});
    up.push_back({random_bf16({I, D}, 0.3f), {}});
    down.push_back({random_bf16({D, I}, 0.3f), {}});
  }
  const SharedExpertWeights shared{{random_bf16({S * I, D}, 0.3f), {}}, {random_bf16({S * I, D}, 0.3f), {}},
                                   {random_bf16({D, S * I}, 0.3f), {}}};
  const ExpertWeights routed_only = be->load_experts(gate, up, down, std::nullopt);
  const ExpertWeights with_shared = be->load_experts(gate, up, down, shared);
  EXPECT_EQ(routed_only.num_shared, 0);
  EXPECT_EQ(with_shared.num_shared, int(S));
  Tensor x = random_f32({T, D});
  Tensor ids = i32({0, 3, 1, 3, 2, 0, 3, 1, 0, 2}).view({T, k});
  Tensor w = random_f32({T, k});
  std::vector<double> routed(size_t(T * D), 0.0), total(size_t(T * D), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const size_t e = size_t(ids.data<int32_t>()[t * k + j]);
      const auto y = naive_mlp(gate[e].w, up[e].w, down[e].w, x.data<float>() + t * D);
      for (int64_t d = 0; d < D; ++d) routed[size_t(t * D + d)] += w.data<float>()[t * k + j] * y[size_t(d)];
    }
    const auto ys = naive_mlp(shared.gate.w, shared.up.w, shared.down.w, x.data<float>() + t * D);
    for (int64_t d = 0; d < D; ++d) total[size_t(t * D + d)] = routed[size_t(t * D + d)] + ys[size_t(d)];
  }
  Tensor out = be->alloc({T, D}, DType::F32);
  be->moe_experts(x, routed_only, ids, w, out);
  expect_close(out, routed, 1e-5);
  be->moe_experts(x, with_shared, ids, w, out);
  expect_close(out, total, 1e-5);
}

TEST_F(CpuOpsTest, LoadExpertsRejectsSharedExpertsOfAnotherWidth) {
  const int64_t D = 12, I = 8;
  std::vector<Weight> gate{{random_bf16({I, D}), {}}}, up{{random_bf16({I, D}), {}}},
      down{{random_bf16({D, I}), {}}};
  const SharedExpertWeights shared{{random_bf16({12, D}), {}}, {random_bf16({12, D}), {}},
                                   {random_bf16({D, 12}), {}}};  // 12 is not a multiple of 8
  EXPECT_THROW(be->load_experts(gate, up, down, shared), Error);
}

TEST_F(CpuOpsTest, SiluAndMulGateUpMatchesTheSplitForm) {
  const int64_t T = 3, I = 10;
  Tensor gate_up = random_f32({T, 2 * I}, 3.0f);
  Tensor out = be->alloc({T, I}, DType::F32);
  be->silu_and_mul_gate_up(gate_up, out);
  std::vector<double> want;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      const double g = gate_up.data<float>()[t * 2 * I + i], u = gate_up.data<float>()[t * 2 * I + I + i];
      want.push_back(g / (1 + std::exp(-g)) * u);
    }
  expect_close(out, want, 1e-6);
  Tensor wrong = be->alloc({T, I + 1}, DType::F32);
  EXPECT_THROW(be->silu_and_mul_gate_up(gate_up, wrong), Error);
}

TEST_F(CpuOpsTest, PrepareBatchRejectsInconsistentBatches) {
  ForwardBatch b = ragged_batch();
  b.kv_indptr = {0, 1, 6};  // sequence 0 would have fewer kv tokens than new tokens
  EXPECT_THROW(be->prepare_batch(b), Error);
  b = ragged_batch();
  b.logit_rows = {3};
  EXPECT_THROW(be->prepare_batch(b), Error);
}

TEST_F(CpuOpsTest, ArgmaxRowsTakesTheLowestIndexOfTies) {
  // Few distinct values, so most rows hold their maximum more than once.
  const int64_t R = 24, V = 1000;
  Tensor logits = Tensor::empty({R, V}, DType::F32);
  std::uniform_int_distribution<int> level(-4, 4);
  for (int64_t i = 0; i < R * V; ++i) logits.data<float>()[i] = 0.5f * float(level(rng));
  // Row 0: all equal; row 1: the maximum only at the last index.
  std::fill_n(logits.data<float>(), V, 1.0f);
  std::fill_n(logits.data<float>() + V, V, -3.0f);
  logits.data<float>()[2 * V - 1] = -1.0f;
  Tensor ids = Tensor::empty({R}, DType::I32);
  be->argmax_rows(logits, ids);
  int rows_with_ties = 0;
  for (int64_t r = 0; r < R; ++r) {
    const float* row = logits.data<float>() + r * V;
    int64_t best = 0, count = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    for (int64_t v = 0; v < V; ++v) count += row[v] == row[best];
    rows_with_ties += count > 1;
    EXPECT_EQ(ids.data<int32_t>()[r], best) << "row " << r;
  }
  EXPECT_EQ(ids.data<int32_t>()[0], 0);
  EXPECT_EQ(ids.data<int32_t>()[1], V - 1);
  EXPECT_GT(rows_with_ties, R / 2);
}

TEST_F(CpuOpsTest, ArgmaxRowsRejectsMismatchedShapes) {
  Tensor logits = random_f32({3, 10});
  Tensor ids = Tensor::empty({2}, DType::I32);
  EXPECT_THROW(be->argmax_rows(logits, ids), Error);
  Tensor f32_ids = Tensor::empty({3}, DType::F32);
  EXPECT_THROW(be->argmax_rows(logits, f32_ids), Error);
}

}  // namespace
}  // namespace mlaserve

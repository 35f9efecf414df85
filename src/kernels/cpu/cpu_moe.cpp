// MoE routing and experts on the CPU. Routed experts run one at a time over
// the tokens routed to them (gathered into a dense block), so each expert's
// weights are read once per step and its linears use all cores; the shared
// experts run whole, as one MLP over every token.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace mlaserve::cpu {
namespace {

// Indices of the k largest values, largest first (ties: lower index first).
std::vector<int> top_indices(const std::vector<float>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

}  // namespace

void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor topk_ids,
               Tensor topk_weights) {
  const int64_t T = logits.dim(0);
  const int E = int(logits.dim(1));
  MLA_CHECK(logits.dtype() == DType::F32, "moe_route: logits must be F32, got {}", dtype_name(logits.dtype()));
  MLA_CHECK(p.top_k >= 1 && p.top_k <= E, "moe_route: top_k {} not in [1, {}]", p.top_k, E);
  MLA_CHECK(topk_ids.dim(1) == p.top_k && topk_weights.dim(1) == p.top_k, "moe_route: outputs must be {{T, {}}}",
            p.top_k);
  const bool grouped = p.method != TopkMethod::Greedy;
  MLA_CHECK(!grouped || (p.n_group >= 1 && E % p.n_group == 0 && p.topk_group >= 1 && p.topk_group <= p.n_group),
            "moe_route: {} experts cannot form {} groups keeping {}", E, p.n_group, p.topk_group);
  MLA_CHECK(!grouped || p.top_k <= p.topk_group * (E / p.n_group),
            "moe_route: top_k {} exceeds the {} experts of the {} kept groups", p.top_k,
            p.topk_group * (E / p.n_group), p.topk_group);
  std::vector<float> bias_f32;
  if (p.method == TopkMethod::NoauxTc && bias.defined()) {
    MLA_CHECK(bias.numel() == E, "moe_route: bias has {} entries for {} experts", bias.numel(), E);
    bias_f32.resize(size_t(E));
    to_f32(bias, 0, E, bias_f32.data());
  }
  const int group_size = grouped ? E / p.n_group : E;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), group_score(static_cast<size_t>(grouped ? p.n_group : 0));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.data<float>() + t * E;
    if (p.scoring == ScoringFunc::Softmax) {
      float m = *std::max_element(l, l + E), sum = 0.0f;
      for (int e = 0; e < E; ++e) sum += scores[size_t(e)] = std::exp(l[e] - m);
      for (int e = 0; e < E; ++e) scores[size_t(e)] /= sum;
    } else {
      for (int e = 0; e < E; ++e) scores[size_t(e)] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    for (int e = 0; e < E; ++e) choice[size_t(e)] = scores[size_t(e)] + (bias_f32.empty() ? 0.0f : bias_f32[size_t(e)]);
    if (grouped) {
      for (int g = 0; g < p.n_group; ++g) {
        const float* c = choice.data() + g * group_size;
        if (p.method == TopkMethod::GroupLimitedGreedy) {
          group_score[size_t(g)] = *std::max_element(c, c + group_size);
        } else {
          std::vector<float> grp(c, c + group_size);
          auto top2 = top_indices(grp, std::min(2, group_size));
          float s = 0.0f;
          for (int i : top2) s += grp[size_t(i)];
          group_score[size_t(g)] = s;
        }
      }
      std::vector<bool> keep(size_t(p.n_group), false);
      for (int g : top_indices(group_score, p.topk_group)) keep[size_t(g)] = true;
      for (int e = 0; e < E; ++e)
        if (!keep[size_t(e / group_size)]) choice[size_t(e)] = neg_inf;
    }
    const auto chosen = top_indices(choice, p.top_k);
    int32_t* ids = topk_ids.data<int32_t>() + t * p.top_k;
    float* w = topk_weights.data<float>() + t * p.top_k;
    float sum = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      ids[j] = chosen[size_t(j)];
      w[j] = scores[size_t(chosen[size_t(j)])];
      sum += w[j];
    }
    for (int j = 0; j < p.top_k; ++j) w[j] = (p.renormalize ? w[j] / (sum + 1e-20f) : w[j]) * p.scaling;
  }
}

void moe_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& topk_ids,
                 const Tensor& topk_weights, Tensor out) {
  const int64_t T = x.dim(0), D = x.dim(1), k = topk_ids.dim(1);
  const int E = experts.num_experts();
  // Token rows and weights per expert.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
  std::vector<std::vector<float>> weights(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = topk_ids.data<int32_t>()[t * k + j];
      MLA_CHECK(e >= 0 && e < E, "moe_experts: expert id {} out of range [0, {})", e, E);
      rows[size_t(e)].push_back(t);
      weights[size_t(e)].push_back(topk_weights.data<float>()[t * k + j]);
    }
  }
  float* o = out.data<float>();
  std::fill(o, o + T * D, 0.0f);
  std::vector<float> xe, gate, up, y;
  for (int e = 0; e < E; ++e) {
    const auto& r = rows[size_t(e)];
    if (r.empty()) continue;
    const int64_t n = int64_t(r.size()), I = experts.gate[size_t(e)].out_features();
    xe.resize(size_t(n * D));
    for (int64_t i = 0; i < n; ++i) std::copy_n(x.data<float>() + r[size_t(i)] * D, D, xe.data() + i * D);
    gate.resize(size_t(n * I));
    up.resize(size_t(n * I));
    y.resize(size_t(n * D));
    linear(xe.data(), D, n, experts.gate[size_t(e)], gate.data(), I);
    linear(xe.data(), D, n, experts.up[size_t(e)], up.data(), I);
    for (int64_t i = 0; i < n * I; ++i) gate[size_t(i)] = gate[size_t(i)] / (1.0f + std::exp(-gate[size_t(i)])) * up[size_t(i)];
    linear(gate.data(), I, n, experts.down[size_t(e)], y.data(), D);
    for (int64_t i = 0; i < n; ++i) {
      float* dst = o + r[size_t(i)] * D;
      const float w = weights[size_t(e)][size_t(i)];
      for (int64_t d = 0; d < D; ++d) dst[d] += w * y[size_t(i * D + d)];
    }
  }
  if (experts.shared) {
    // The shared experts as one MLP over every token, weight 1.
    const SharedExpertWeights& s = *experts.shared;
    const int64_t I = s.gate.out_features();
    gate.resize(size_t(T * I));
    up.resize(size_t(T * I));
    y.resize(size_t(T * D));
    linear(x.data<float>(), D, T, s.gate, gate.data(), I);
    linear(x.data<float>(), D, T, s.up, up.data(), I);
    for (int64_t i = 0; i < T * I; ++i)
      gate[size_t(i)] = gate[size_t(i)] / (1.0f + std::exp(-gate[size_t(i)])) * up[size_t(i)];
    linear(gate.data(), I, T, s.down, y.data(), D);
    for (int64_t i = 0; i < T * D; ++i) o[i] += y[size_t(i)];
  }
}

}  // namespace mlaserve::cpu

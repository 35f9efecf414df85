// Fused block-FP8 MoE against host references on the dequantized expert
// weights.
//
// Bounds: the "scheme" reference applies the same activation quantization
// (x and the SiLU-and-mul output, 1x128 e4m3) and bf16 roundings on the
// host, so differences come from f32 accumulation order and the rare
// intermediate value that rounds the other way at an e4m3 boundary: 1e-2.
// The f64 reference on unquantized activations also sees both activation
// roundings (~2.5% RMS each, added in quadrature ~3.6%): bound 8e-2.
// The small (decode) path quantizes no activations: against the f64
// reference only the bf16 roundings of act and out remain (~0.3%): 1e-2.
// The Hopper kernels (MoePath::Sm90) apply SiLU-and-mul to the f32 gate and
// up sums (no bf16 rounding between), so their scheme reference skips that
// rounding; bound as grouped_gemm_sm90_test's: 2e-2.
#include "kernels/cuda/fp8_moe.h"
#include "kernels/cuda/grouped_gemm_sm90.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "fp8_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kSchemeTol = 1e-2, kSm90SchemeTol = 2e-2, kVsUnquantizedTol = 8e-2, kSmallPathTol = 1e-2;
constexpr int kExperts = 8, kTopK = 2, kHidden = 256, kInter = 256;

struct Experts {
  std::vector<HostFp8Weight> gate_up, down;  // per expert {2I, D}, {D, I}
};

// One expert MLP on the host: y = down(silu(gate x) * up x). With
// `scheme`, activations go through the 1x128 quantizer and bf16 roundings
// as on the device (gate and up rounded unless `fused_silu`).
std::vector<double> expert_mlp(const Experts& ex, int e, const std::vector<float>& x_row, bool scheme,
                               bool fused_silu) {
  std::vector<float> x = scheme ? fake_quantize_rows(x_row, 1, kHidden) : x_row;
  const auto gu = matmul_nt(x, ex.gate_up[e].dequant, 1, 2 * kInter, kHidden);
  std::vector<float> h(kInter);
  for (int i = 0; i < kInter; ++i) {
    double g = gu[i], u = gu[kInter + i];
    if (scheme && !fused_silu) g = round_bf16(float(g)), u = round_bf16(float(u));
    const double v = g / (1.0 + std::exp(-g)) * u;
    h[i] = scheme ? round_bf16(float(v)) : float(v);
  }
  if (scheme) h = fake_quantize_rows(h, 1, kInter);
  auto y = matmul_nt(h, ex.down[e].dequant, 1, kHidden, kInter);
  if (scheme)
    for (auto& v : y) v = round_bf16(float(v));
  return y;
}

struct Fp8MoeCase {
  int tokens;
  MoePath path;
};

class Fp8Moe : public ::testing::TestWithParam<Fp8MoeCase> {};

TEST_P(Fp8Moe, MatchesHostExpertsOnDequantizedWeights) {
  MLA_SKIP_WITHOUT_GPU();
  const int tokens = GetParam().tokens;
  const int shared = tokens % 2 == 1 ? 2 : 0;  // stacked after the routed experts, weight 1
  std::mt19937 rng(23 + tokens);
  Experts ex;
  std::vector<uint8_t> gu_q, dn_q;
  std::vector<float> gu_s, dn_s;
  for (int e = 0; e < kExperts + shared; ++e) {
    ex.gate_up.push_back(random_fp8_weight(2 * kInter, kHidden, rng, 0.2f));
    ex.down.push_back(random_fp8_weight(kHidden, kInter, rng, 0.2f));
    gu_q.insert(gu_q.end(), ex.gate_up[e].q.begin(), ex.gate_up[e].q.end());
    gu_s.insert(gu_s.end(), ex.gate_up[e].scale.begin(), ex.gate_up[e].scale.end());
    dn_q.insert(dn_q.end(), ex.down[e].q.begin(), ex.down[e].q.end());
    dn_s.insert(dn_s.end(), ex.down[e].scale.begin(), ex.down[e].scale.end());
  }
  const auto x = random_activations(tokens, kHidden, rng);
  std::vector<int32_t> ids(tokens * kTopK);
  std::vector<float> weights(tokens * kTopK);
  std::uniform_real_distribution<float> wdist(0.1f, 1.0f);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> perm(kExperts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < kTopK; ++j) ids[t * kTopK + j] = perm[j], weights[t * kTopK + j] = wdist(rng);
  }

  auto dx = upload(x), dgu = upload(gu_q), dgus = upload(gu_s), ddn = upload(dn_q), ddns = upload(dn_s);
  auto dids = upload(ids), dw = upload(weights);
  auto dout = poisoned(size_t(tokens) * kHidden * 2);
  Fp8MoeParams p;
  p.x = dx.get<__nv_bfloat16>();
  p.w_gate_up = dgu.get<uint8_t>();
  p.w_gate_up_scale = dgus.get<float>();
  p.w_down = ddn.get<uint8_t>();
  p.w_down_scale = ddns.get<float>();
  p.topk_ids = dids.get<int32_t>();
  p.topk_weights = dw.get<float>();
  p.num_tokens = tokens;
  p.hidden = kHidden;
  p.inter = kInter;
  p.num_experts = kExperts;
  p.top_k = kTopK;
  p.num_shared = shared;
  p.path = GetParam().path;
  p.out = dout.get<__nv_bfloat16>();
  DeviceBuffer workspace(fp8_moe_workspace_bytes(p));
  fp8_moe_experts(p, workspace.get(), nullptr);
  const auto out = to_float(download<uint16_t>(dout, size_t(tokens) * kHidden));

  const bool sm90 = fp8_moe_path(p) == MoePath::Sm90;
  std::vector<double> ref_scheme(size_t(tokens) * kHidden), ref_exact(ref_scheme.size());
  for (int t = 0; t < tokens; ++t) {
    std::vector<float> row(kHidden);
    for (int i = 0; i < kHidden; ++i) row[i] = bf16_to_f32(x[t * kHidden + i]);
    for (int j = 0; j < kTopK + shared; ++j) {
      const int e = j < kTopK ? ids[t * kTopK + j] : kExperts + j - kTopK;
      const double w = j < kTopK ? weights[t * kTopK + j] : 1.0;
      const auto ys = expert_mlp(ex, e, row, true, sm90), ye = expert_mlp(ex, e, row, false, sm90);
      for (int i = 0; i < kHidden; ++i) {
        ref_scheme[t * kHidden + i] += w * ys[i];
        ref_exact[t * kHidden + i] += w * ye[i];
      }
    }
  }
  const double err = rel_l2(out, ref_scheme), err_exact = rel_l2(out, ref_exact);
  if (GetParam().path == MoePath::Auto && tokens >= kFp8MoeSm90MinTokens)
    EXPECT_EQ(fp8_moe_path(p), sm90_gemm_supported() ? MoePath::Sm90 : MoePath::Grouped);
  if (fp8_moe_path(p) == MoePath::Small) {
    const std::string detail = std::to_string(tokens) + " tokens, small path, " + std::to_string(shared) + " shared";
    report_fp8("fp8 moe vs f64", detail.c_str(), err_exact, kSmallPathTol);
    EXPECT_LT(err_exact, kSmallPathTol);
    return;
  }
  const std::string rows = sm90 ? std::string("sm90 kernels")
                               : "block_m " + std::to_string(fp8_moe_block_m(tokens, kTopK + shared, kExperts + shared));
  const std::string detail = std::to_string(tokens) + " tokens, " + rows + ", " + std::to_string(shared) + " shared";
  const double scheme_tol = sm90 ? kSm90SchemeTol : kSchemeTol;
  report_fp8("fp8 moe vs scheme", detail.c_str(), err, scheme_tol);
  report_fp8("fp8 moe vs f64", detail.c_str(), err_exact, kVsUnquantizedTol);
  EXPECT_LT(err, scheme_tol);
  EXPECT_LT(err_exact, kVsUnquantizedTol);
}

// Grouped: 1 and 5 tokens: 8-row chunks; 64: 16-row; 300: 128-row chunks
// (the largest tile). Small: 1, 5 (tokens sharing experts) and 8, the most it
// takes. Auto at 16 (the smallest batch it sends to them), 64, 300 and 301
// (2 shared experts): the Hopper kernels on an H100/H200 (from
// kFp8MoeSm90MinTokens), the grouped path elsewhere.
INSTANTIATE_TEST_SUITE_P(Tokens, Fp8Moe,
                         ::testing::Values(Fp8MoeCase{1, MoePath::Grouped}, Fp8MoeCase{5, MoePath::Grouped},
                                           Fp8MoeCase{64, MoePath::Grouped}, Fp8MoeCase{16, MoePath::Auto},
                                           Fp8MoeCase{64, MoePath::Auto},
                                           Fp8MoeCase{300, MoePath::Grouped},
                                           Fp8MoeCase{300, MoePath::Auto}, Fp8MoeCase{301, MoePath::Auto},
                                           Fp8MoeCase{1, MoePath::Small}, Fp8MoeCase{5, MoePath::Small},
                                           Fp8MoeCase{8, MoePath::Small}));

}  // namespace
}  // namespace mlaserve::cuda::testing

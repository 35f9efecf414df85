// The Hopper (sm_90a) grouped GEMM paths against f64 host references:
// bf16 MoE experts, block-FP8 MoE experts and the dense block-FP8 GEMM.
// Skipped on GPUs other than compute capability 9.0.
//
// Bounds: bf16 MoE: the reference rounds the two stored intermediates (the
// activation and each expert's output) to bf16 as the device does, so only
// f32 accumulation order differs: 5e-3. FP8 "scheme" references apply the
// same 1x128 activation quantization on the host; an intermediate that
// rounds across an e4m3 step the other way moves its term by up to 1/16:
// 2e-2. Against unquantized activations both roundings show (~2.5% RMS each,
// in quadrature ~3.6%): 8e-2.
#include "kernels/cuda/grouped_gemm_sm90.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "fp8_test_util.h"
#include "kernels/cuda/fp8_quant.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kBf16Tol = 5e-3, kFp8SchemeTol = 2e-2, kFp8ExactTol = 8e-2;

bool hopper_present() { return gpu_available() && sm90_gemm_supported(); }

#define SKIP_WITHOUT_HOPPER() \
  if (!hopper_present()) GTEST_SKIP() << "no compute capability 9.0 GPU present"

// Stacked bf16 gate_up row of gate (is_up false) or up column i: interleaved by 8.
int64_t interleaved_row(int64_t i, bool is_up) { return (i / 8) * 16 + (is_up ? 8 : 0) + i % 8; }

// Every kernel variant is checked against the same reference.
// MoE variants gather x in the GEMM's producer (1) or in a pass before it
// (0), whose TMA-fed kernels run one CTA a tile or in pairs sharing weight
// tiles (cluster_m 1 / 2), or (bf16 block_m 192) walk runs of an expert's blocks.
std::vector<Sm90GemmVariant> bf16_variants() {
  return {Sm90GemmVariant{128, -1, 0, 1},       Sm90GemmVariant{64, -1, 0, 1},
          Sm90GemmVariant{128, -1, 0, 0, 0, 1}, Sm90GemmVariant{64, -1, 0, 0, 0, 1},
          Sm90GemmVariant{128, -1, 0, 0, 0, 2}, Sm90GemmVariant{64, -1, 0, 0, 0, 2},
          Sm90GemmVariant{192, -1, 0, 0}};
}
// The TMA-fed fp8 MoE runs 64-row tiles (fp8_moe_block_m 64, one CTA a
// tile or pairs) or three consumer warpgroups over runs of an expert's
// blocks (192, the default).
std::vector<Sm90GemmVariant> fp8_variants() {
  return {Sm90GemmVariant{0, 0, 64, 1},             Sm90GemmVariant{0, 1, 64, 1},
          Sm90GemmVariant{0, 1, 64, 0, 0, 1, 64},   Sm90GemmVariant{0, 1, 64, 0, 0, 2, 64},
          Sm90GemmVariant{0, 0, 64, 0, 0, 2, 64},   Sm90GemmVariant{0, -1, 64, 0, 0, 0, 192}};
}
std::string variant_name(const Sm90GemmVariant& v) {
  return "bf16 block_m " + std::to_string(v.bf16_block_m) + ", overlap " + std::to_string(v.fp8_overlap_promotion) +
         ", fp8 block_m " + std::to_string(v.fp8_block_m) + ", gather " + std::to_string(v.gather_in_producer) +
         ", k splits " + std::to_string(v.fp8_k_splits) + ", cluster_m " + std::to_string(v.cluster_m) +
         ", fp8 moe block_m " + std::to_string(v.fp8_moe_block_m) + ", fp8 block_n " + std::to_string(v.fp8_block_n) +
         ", fp8 cluster splits " + std::to_string(v.fp8_cluster_splits);
}

double silu_mul(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

// Routing of a random batch: top_k distinct routed experts per token, weights in [0.1, 1].
struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routing random_routing(int tokens, int experts, int top_k, std::mt19937& rng) {
  Routing r;
  std::uniform_real_distribution<float> wdist(0.1f, 1.0f);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> perm(experts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < top_k; ++j) r.ids.push_back(perm[j]), r.weights.push_back(wdist(rng));
  }
  return r;
}

// A token's experts and weights: routed ones, then the shared ones (weight 1).
std::vector<std::pair<int, float>> slots_of(const Routing& r, int t, int top_k, int experts, int shared) {
  std::vector<std::pair<int, float>> s;
  for (int j = 0; j < top_k; ++j) s.emplace_back(r.ids[t * top_k + j], r.weights[t * top_k + j]);
  for (int i = 0; i < shared; ++i) s.emplace_back(experts + i, 1.0f);
  return s;
}

struct MoeShape {
  int tokens, experts, shared, top_k, hidden, inter;
};

std::string describe(const MoeShape& s, bool addend) {
  return std::to_string(s.tokens) + " tok, " + std::to_string(s.experts) + "+" + std::to_string(s.shared) +
         " exp, top" + std::to_string(s.top_k) + (addend ? ", +addend" : "");
}

class Sm90Bf16Moe : public ::testing::TestWithParam<MoeShape> {};

TEST_P(Sm90Bf16Moe, MatchesHostExperts) {
  SKIP_WITHOUT_HOPPER();
  const MoeShape s = GetParam();
  const int total = s.experts + s.shared, D = s.hidden, I = s.inter;
  const bool with_addend = s.tokens % 2 == 1;
  std::mt19937 rng(101 + s.tokens);
  const auto x = random_bf16(size_t(s.tokens) * D, rng);
  const auto gate_up = random_bf16(size_t(total) * 2 * I * D, rng, 0.08f);  // stacked, interleaved by 8
  const auto down = random_bf16(size_t(total) * D * I, rng, 0.08f);
  const auto addend = random_bf16(size_t(s.tokens) * D, rng, 0.5f);
  const Routing route = random_routing(s.tokens, s.experts, s.top_k, rng);

  auto dx = upload(x), dgu = upload(gate_up), ddn = upload(down), dadd = upload(addend);
  auto dids = upload(route.ids), dw = upload(route.weights);
  Sm90MoeParams p;
  p.x = dx.get<__nv_bfloat16>();
  p.w_gate_up = dgu.get();
  p.w_down = ddn.get();
  p.topk_ids = dids.get<int32_t>();
  p.topk_weights = dw.get<float>();
  p.addend = with_addend ? dadd.get<__nv_bfloat16>() : nullptr;
  p.num_tokens = s.tokens;
  p.hidden = D;
  p.inter = I;
  p.num_experts = s.experts;
  p.top_k = s.top_k;
  p.num_shared = s.shared;

  const auto xf = to_float(x), guf = to_float(gate_up), dnf = to_float(down);
  std::vector<double> ref(size_t(s.tokens) * D);
  std::vector<float> h(I);
  for (int t = 0; t < s.tokens; ++t) {
    for (int d = 0; d < D; ++d) ref[t * D + d] = with_addend ? bf16_to_f32(addend[t * D + d]) : 0.0;
    for (const auto& [e, wt] : slots_of(route, t, s.top_k, s.experts, s.shared)) {
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        const float* wg = &guf[(size_t(e) * 2 * I + interleaved_row(i, false)) * D];
        const float* wu = &guf[(size_t(e) * 2 * I + interleaved_row(i, true)) * D];
        for (int d = 0; d < D; ++d) g += double(xf[t * D + d]) * wg[d], u += double(xf[t * D + d]) * wu[d];
        h[i] = round_bf16(float(silu_mul(g, u)));
      }
      for (int d = 0; d < D; ++d) {
        double y = 0;
        const float* wd = &dnf[(size_t(e) * D + d) * I];
        for (int i = 0; i < I; ++i) y += double(h[i]) * wd[i];
        ref[t * D + d] += wt * round_bf16(float(y));
      }
    }
  }
  for (const Sm90GemmVariant& v : bf16_variants()) {
    SCOPED_TRACE(variant_name(v));
    auto dout = poisoned(size_t(s.tokens) * D * 2);
    p.out = dout.get<__nv_bfloat16>();
    p.variant = v;
    DeviceBuffer workspace(moe_experts_sm90_workspace_bytes(p));
    moe_experts_sm90(p, workspace.get(), nullptr);
    const auto out = to_float(download<uint16_t>(dout, size_t(s.tokens) * D));
    const double err = rel_l2(out, ref);
    report_fp8("sm90 bf16 moe", (describe(s, with_addend) + ", bm " + std::to_string(v.bf16_block_m) + ", g" +
                std::to_string(v.gather_in_producer)).c_str(), err,
               kBf16Tol);
    EXPECT_LT(err, kBf16Tol);
  }
}

// 5 tokens: one partly filled 128-row block per expert; 300 x 4 slots: experts
// spanning several blocks, several tiles per CTA; K 512 = 8 K blocks.
// 1001 x 3 slots over 6 experts: runs of several row blocks, so pairs of
// one expert's tiles share weights and pairs across a run's end do not.
INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Bf16Moe,
                         ::testing::Values(MoeShape{5, 8, 1, 2, 256, 128}, MoeShape{300, 16, 1, 3, 512, 256},
                                           MoeShape{1001, 5, 1, 2, 256, 256}));

class Sm90Fp8Moe : public ::testing::TestWithParam<MoeShape> {};

TEST_P(Sm90Fp8Moe, MatchesHostExpertsOnDequantizedWeights) {
  SKIP_WITHOUT_HOPPER();
  const MoeShape s = GetParam();
  const int total = s.experts + s.shared, D = s.hidden, I = s.inter;
  const bool with_addend = s.tokens % 2 == 1;
  std::mt19937 rng(203 + s.tokens);
  std::vector<HostFp8Weight> gate_up, down;
  std::vector<uint8_t> gu_q, dn_q;
  std::vector<float> gu_s, dn_s;
  for (int e = 0; e < total; ++e) {
    gate_up.push_back(random_fp8_weight(2 * I, D, rng, 0.2f));
    down.push_back(random_fp8_weight(D, I, rng, 0.2f));
    gu_q.insert(gu_q.end(), gate_up[e].q.begin(), gate_up[e].q.end());
    gu_s.insert(gu_s.end(), gate_up[e].scale.begin(), gate_up[e].scale.end());
    dn_q.insert(dn_q.end(), down[e].q.begin(), down[e].q.end());
    dn_s.insert(dn_s.end(), down[e].scale.begin(), down[e].scale.end());
  }
  const auto x = random_activations(s.tokens, D, rng);
  const auto addend = random_bf16(size_t(s.tokens) * D, rng, 0.5f);
  const Routing route = random_routing(s.tokens, s.experts, s.top_k, rng);

  auto dx = upload(x), dgu = upload(gu_q), dgus = upload(gu_s), ddn = upload(dn_q), ddns = upload(dn_s);
  auto dids = upload(route.ids), dw = upload(route.weights), dadd = upload(addend);
  Sm90MoeParams p;
  p.x = dx.get<__nv_bfloat16>();
  p.w_gate_up = dgu.get();
  p.w_gate_up_scale = dgus.get<float>();
  p.w_down = ddn.get();
  p.w_down_scale = ddns.get<float>();
  p.topk_ids = dids.get<int32_t>();
  p.topk_weights = dw.get<float>();
  p.addend = with_addend ? dadd.get<__nv_bfloat16>() : nullptr;
  p.num_tokens = s.tokens;
  p.hidden = D;
  p.inter = I;
  p.num_experts = s.experts;
  p.top_k = s.top_k;
  p.num_shared = s.shared;

  // One expert on the host; `scheme`: x and the activation go through the
  // 1x128 quantizer and the stored intermediates through bf16, as on the device.
  auto expert = [&](int e, const std::vector<float>& row, bool scheme) {
    const std::vector<float> xin = scheme ? fake_quantize_rows(row, 1, D) : row;
    const auto gu = matmul_nt(xin, gate_up[e].dequant, 1, 2 * I, D);
    std::vector<float> h(I);
    for (int i = 0; i < I; ++i) {
      const double v = silu_mul(gu[i], gu[I + i]);
      h[i] = scheme ? round_bf16(float(v)) : float(v);
    }
    if (scheme) h = fake_quantize_rows(h, 1, I);
    auto y = matmul_nt(h, down[e].dequant, 1, D, I);
    if (scheme)
      for (auto& v : y) v = round_bf16(float(v));
    return y;
  };
  std::vector<double> ref_scheme(size_t(s.tokens) * D), ref_exact(ref_scheme.size());
  for (int t = 0; t < s.tokens; ++t) {
    std::vector<float> row(D);
    for (int d = 0; d < D; ++d) row[d] = bf16_to_f32(x[t * D + d]);
    for (int d = 0; d < D; ++d)
      ref_scheme[t * D + d] = ref_exact[t * D + d] = with_addend ? bf16_to_f32(addend[t * D + d]) : 0.0;
    for (const auto& [e, wt] : slots_of(route, t, s.top_k, s.experts, s.shared)) {
      const auto ys = expert(e, row, true), ye = expert(e, row, false);
      for (int d = 0; d < D; ++d) ref_scheme[t * D + d] += wt * ys[d], ref_exact[t * D + d] += wt * ye[d];
    }
  }
  // The run tiles quantize the activations in a pass after gate_up, the
  // 64 x 256 tiles in its epilogue: the same bytes, so every variant's
  // output is compared with the last one's (runs, TMA-fed) too.
  std::vector<std::vector<float>> outs;
  for (const Sm90GemmVariant& v : fp8_variants()) {
    SCOPED_TRACE(variant_name(v));
    auto dout = poisoned(size_t(s.tokens) * D * 2);
    p.out = dout.get<__nv_bfloat16>();
    p.variant = v;
    DeviceBuffer workspace(fp8_moe_experts_sm90_workspace_bytes(p));
    fp8_moe_experts_sm90(p, workspace.get(), nullptr);
    const auto out = to_float(download<uint16_t>(dout, size_t(s.tokens) * D));
    outs.push_back(out);
    const std::string detail = describe(s, with_addend) + ", o" + std::to_string(v.fp8_overlap_promotion) + ", g" +
                               std::to_string(v.gather_in_producer) + ", bm" + std::to_string(v.fp8_moe_block_m);
    const double err = rel_l2(out, ref_scheme), err_exact = rel_l2(out, ref_exact);
    report_fp8("sm90 fp8 moe vs scheme", detail.c_str(), err, kFp8SchemeTol);
    report_fp8("sm90 fp8 moe vs f64", detail.c_str(), err_exact, kFp8ExactTol);
    EXPECT_LT(err, kFp8SchemeTol);
    EXPECT_LT(err_exact, kFp8ExactTol);
  }
  const std::vector<double> last(outs.back().begin(), outs.back().end());
  for (size_t i = 0; i + 1 < outs.size(); ++i) {
    const double diff = rel_l2(outs[i], last);
    const std::string detail = describe(s, with_addend) + ", variant " + std::to_string(i) + " vs runs";
    // One activation one e4m3 step apart moves the output by ~1e-4.
    report_fp8("sm90 fp8 moe variants agree", detail.c_str(), diff, 1e-3);
    EXPECT_LT(diff, 1e-3) << variant_name(fp8_variants()[i]);
  }
}

// 5 tokens: 2 K blocks each (the overlapped variant without its loop);
// 300 x 3 slots over 16 experts: several 64-row blocks per expert; inter 384:
// the gate and up halves of a tile fall in different 128-row scale blocks,
// and down has 3 K blocks (odd: the overlapped variant falls back to serial).
// 1001 x 3 slots over 6 experts: several 64-row blocks an expert, so pairs
// sharing weight tiles, pairs across runs, and a phantom tile (odd blocks).
INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Fp8Moe,
                         ::testing::Values(MoeShape{5, 8, 1, 2, 256, 256}, MoeShape{300, 16, 1, 3, 512, 384},
                                           MoeShape{1001, 5, 1, 2, 256, 256}));

struct DenseShape {
  int m, n, k;
};

class Sm90Fp8Gemm : public ::testing::TestWithParam<DenseShape> {};

TEST_P(Sm90Fp8Gemm, MatchesHostProductOfDequantizedOperands) {
  SKIP_WITHOUT_HOPPER();
  const auto [m, n, k] = GetParam();
  std::mt19937 rng(307 + m + n);
  const HostFp8Weight w = random_fp8_weight(n, k, rng, 0.2f);
  const auto x = random_activations(m, k, rng);
  const int64_t ld = fp8_act_scale_ld(m);
  auto dx = upload(x), dwq = upload(w.q), dws = upload(w.scale);
  DeviceBuffer aq(size_t(ld) * k), as(size_t(ld) * (k / 128) * 4);
  quantize_fp8_act(dx.get<__nv_bfloat16>(), m, k, k, aq.get<uint8_t>(), as.get<float>(), ld, nullptr);
  Sm90Fp8GemmParams p;
  p.a = aq.get<uint8_t>();
  p.a_scale = as.get<float>();
  p.a_scale_ld = ld;
  p.w = dwq.get<uint8_t>();
  p.w_scale = dws.get<float>();
  p.m = m;
  p.n = n;
  p.k = k;

  std::vector<float> xf(size_t(m) * k);
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  const auto ref_scheme = matmul_nt(fake_quantize_rows(xf, m, k), w.dequant, m, n, k);
  const auto ref_exact = matmul_nt(xf, w.dequant, m, n, k);
  std::vector<Sm90GemmVariant> variants = fp8_variants();
  variants.push_back(Sm90GemmVariant{0, 1, 128, -1, 0, 1});  // 128 x 128 tiles (dense only), one CTA a tile
  variants.push_back(Sm90GemmVariant{0, 1, 128, -1, 0, 2});  // in pairs sharing weight tiles (m_blocks >= 4)
  variants.push_back(Sm90GemmVariant{0, 0, 128, -1, 0, 2});
  variants.push_back(Sm90GemmVariant{0, 1, 0});    // the plan's own tile and split choice
  // Split K into uneven ranges (3 and 5 do not divide the K blocks of every shape), both tiles.
  variants.push_back(Sm90GemmVariant{0, 1, 64, -1, 3});
  variants.push_back(Sm90GemmVariant{0, 1, 128, -1, 5});
  // 192 x 128 tiles on three consumer warpgroups (a last tile of 64 or 128 rows idles the others), also split.
  variants.push_back(Sm90GemmVariant{0, 0, 192, -1, 0, 1});
  variants.push_back(Sm90GemmVariant{0, 0, 192, -1, 3, 1});
  // 128 x 192 tiles (N not a multiple of 192 in most shapes: a partial last column tile), alone and in pairs.
  variants.push_back(Sm90GemmVariant{0, 0, 128, -1, 0, 1, 0, 192});
  variants.push_back(Sm90GemmVariant{0, 0, 128, -1, 0, 2, 0, 192});
  variants.push_back(Sm90GemmVariant{0, 0, 128, -1, 3, 1, 0, 192});  // and split K (decode rows)
  // A tile's 2 or 4 splits as one cluster adding their sums in distributed shared memory, and 4 as
  // f32 partials and a sum kernel.
  for (int block_m : {64, 128})
    for (int splits : {2, 4}) variants.push_back(Sm90GemmVariant{0, 0, block_m, -1, splits, 0, 0, 0, 1});
  variants.push_back(Sm90GemmVariant{0, 0, 64, -1, 4, 0, 0, 0, -1});
  for (const Sm90GemmVariant& v : variants) {
    SCOPED_TRACE(variant_name(v));
    auto dout = poisoned(size_t(m) * n * 2);
    p.out = dout.get<__nv_bfloat16>();
    p.variant = v;
    p.workspace = nullptr;
    DeviceBuffer workspace(fp8_gemm_sm90_workspace_bytes(p));
    p.workspace = workspace.get();
    fp8_gemm_sm90(p, nullptr);
    const auto out = to_float(download<uint16_t>(dout, size_t(m) * n));
    if (m <= kSm90QuantizeMaxRows && v.fp8_block_m != 128 && v.fp8_block_m != 192) {
      // Quantizing bf16 rows inside the GEMM gives the same e4m3 values and
      // scales as quantize_fp8_act, and so the same bits.
      auto dout_q = poisoned(size_t(m) * n * 2);
      Sm90Fp8GemmParams pq = p;
      pq.a_bf16 = dx.get<__nv_bfloat16>();
      pq.a_bf16_ld = k;
      pq.out = dout_q.get<__nv_bfloat16>();
      fp8_gemm_sm90(pq, nullptr);
      EXPECT_EQ(download<uint16_t>(dout_q, size_t(m) * n), download<uint16_t>(dout, size_t(m) * n))
          << "quantizing in the GEMM differs from the quantization kernel";
    }
    const std::string detail = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ", o" +
                               std::to_string(v.fp8_overlap_promotion) + " bm" + std::to_string(v.fp8_block_m) +
                               " bn" + std::to_string(v.fp8_block_n) + " ks" + std::to_string(v.fp8_k_splits) +
                               " cs" + std::to_string(v.fp8_cluster_splits);
    // Same quantized operands: only f32 accumulation order and bf16 output rounding differ.
    const double err = rel_l2(out, ref_scheme), err_exact = rel_l2(out, ref_exact);
    report_fp8("sm90 fp8 gemm vs scheme", detail.c_str(), err, kBf16Tol);
    report_fp8("sm90 fp8 gemm vs f64", detail.c_str(), err_exact, kFp8ExactTol);
    EXPECT_LT(err, kBf16Tol);
    EXPECT_LT(err_exact, kFp8ExactTol);
  }
  // Both ways of adding the splits add them in split order: the same bits.
  for (int block_m : {64, 128})
    for (int splits : {2, 4}) {
      SCOPED_TRACE("block_m " + std::to_string(block_m) + ", " + std::to_string(splits) + " splits");
      std::vector<uint16_t> outs[2];
      for (int way = 0; way < 2; ++way) {
        auto dout = poisoned(size_t(m) * n * 2);
        p.out = dout.get<__nv_bfloat16>();
        p.variant = Sm90GemmVariant{0, 0, block_m, -1, splits, 0, 0, 0, way == 0 ? 1 : -1};
        p.workspace = nullptr;
        DeviceBuffer workspace(fp8_gemm_sm90_workspace_bytes(p));
        EXPECT_EQ(workspace.bytes() == 0, way == 0) << "cluster splits need no partials";
        p.workspace = workspace.get();
        fp8_gemm_sm90(p, nullptr);
        outs[way] = download<uint16_t>(dout, size_t(m) * n);
      }
      EXPECT_EQ(outs[0], outs[1]) << "cluster splits differ from f32 partials and the sum kernel";
    }
}

// Ragged M and N (partial row block, N not a multiple of the 256-wide tile
// nor of 128, as kv_a's 576), shapes with several tiles and K blocks (600
// rows: 5 row tiles of 128, so pairs and a phantom tile), and
// decode rows: one token (63 of the 64 tile rows zero-filled) against V3's
// fused q_a / kv_a width, whose plan splits K, 8 tokens, and 5; up to 8 rows
// also run quantizing bf16 rows inside the GEMM; 48 tokens against q_b,
// whose plan takes 128 x 192 tiles with one warpgroup's rows.
INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Fp8Gemm,
                         ::testing::Values(DenseShape{100, 576, 512}, DenseShape{300, 1024, 1024},
                                           DenseShape{600, 640, 1024},
                                           DenseShape{1, 2112, 7168}, DenseShape{8, 1536, 1536},
                                           DenseShape{5, 576, 2048}, DenseShape{48, 24576, 1536}));

}  // namespace
}  // namespace mlaserve::cuda::testing

// MLA's absorbed products from a block-FP8 kv_b_proj against f64 host
// products on the dequantized checkpoint weight.
//
// Bounds as for the FP8 linear (fp8_gemm_test.cpp): with the activations put
// through the same 1x128 scheme on the host the operands are identical and
// only accumulation order and the bf16 output rounding differ: 5e-3; against
// the unquantized activations one e4m3 rounding of x enters: 4.5e-2.
#include "kernels/cuda/fp8_mla_bmm.h"

#include "fp8_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kSchemeTol = 5e-3, kVsUnquantizedTol = 4.5e-2;
constexpr int kHeads = 4, kNope = 128, kV = 128, kLora = 512, kRope = 64;

struct MlaFixture {
  Fp8MlaShape shape{kHeads, kNope, kV, kLora};
  HostFp8Weight kv_b;
  DeviceBuffer kv_b_q, kv_b_s, w_uk_t, w_uk_t_s;
  Fp8MlaWeights weights;

  explicit MlaFixture(std::mt19937& rng) : kv_b(random_fp8_weight(kHeads * (kNope + kV), kLora, rng, 0.2f)) {
    kv_b_q = upload(kv_b.q);
    kv_b_s = upload(kv_b.scale);
    w_uk_t = DeviceBuffer(fp8_w_uk_t_bytes(shape));
    w_uk_t_s = DeviceBuffer(fp8_w_uk_t_scale_count(shape) * sizeof(float));
    fp8_repack_w_uk(shape, kv_b_q.get<uint8_t>(), kv_b_s.get<float>(), w_uk_t.get<uint8_t>(), w_uk_t_s.get<float>(),
                    nullptr);
    weights.shape = shape;
    weights.kv_b = kv_b_q.get<uint8_t>();
    weights.kv_b_scale = kv_b_s.get<float>();
    weights.w_uk_t = w_uk_t.get<uint8_t>();
    weights.w_uk_t_scale = w_uk_t_s.get<float>();
  }
  // Dequantized kv_b_proj element: row of head h at offset `row`, column c.
  float w(int h, int row, int c) const { return kv_b.dequant[(int64_t(h) * (kNope + kV) + row) * kLora + c]; }
};

class Fp8MlaBmm : public ::testing::TestWithParam<int> {};

TEST_P(Fp8MlaBmm, QAbsorbMatchesHostProduct) {
  MLA_SKIP_WITHOUT_GPU();
  const int tokens = GetParam(), q_stride = kNope + kRope;
  std::mt19937 rng(31 + tokens);
  MlaFixture f(rng);
  const auto q = random_activations(int64_t(tokens) * kHeads, q_stride, rng);
  auto dq = upload(q);
  auto dout = poisoned(size_t(tokens) * kHeads * kLora * 2);
  DeviceBuffer workspace(fp8_mla_bmm_workspace_bytes(f.shape, tokens));
  fp8_q_absorb(f.weights, dq.get<__nv_bfloat16>(), q_stride, tokens, dout.get<__nv_bfloat16>(), workspace.get(),
               nullptr);
  const auto out = to_float(download<uint16_t>(dout, size_t(tokens) * kHeads * kLora));

  std::vector<float> q_nope(size_t(tokens) * kHeads * kNope);
  for (int64_t r = 0; r < int64_t(tokens) * kHeads; ++r)
    for (int d = 0; d < kNope; ++d) q_nope[r * kNope + d] = bf16_to_f32(q[r * q_stride + d]);
  const auto q_scheme = fake_quantize_rows(q_nope, int64_t(tokens) * kHeads, kNope);
  std::vector<double> ref(out.size()), ref_exact(out.size());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < kHeads; ++h)
      for (int c = 0; c < kLora; ++c) {
        double s = 0, se = 0;
        for (int d = 0; d < kNope; ++d) {
          const int64_t i = (int64_t(t) * kHeads + h) * kNope + d;
          s += double(q_scheme[i]) * f.w(h, d, c);
          se += double(q_nope[i]) * f.w(h, d, c);
        }
        ref[(int64_t(t) * kHeads + h) * kLora + c] = s;
        ref_exact[(int64_t(t) * kHeads + h) * kLora + c] = se;
      }
  const std::string detail = std::to_string(tokens) + " tokens x 4 heads, 128 -> 512";
  const double err = rel_l2(out, ref), err_exact = rel_l2(out, ref_exact);
  report_fp8("fp8 q_nope.W_UK", detail.c_str(), err, kSchemeTol);
  report_fp8("fp8 q_nope.W_UK vs f64", detail.c_str(), err_exact, kVsUnquantizedTol);
  EXPECT_LT(err, kSchemeTol);
  EXPECT_LT(err_exact, kVsUnquantizedTol);
}

TEST_P(Fp8MlaBmm, VUpMatchesHostProduct) {
  MLA_SKIP_WITHOUT_GPU();
  const int tokens = GetParam();
  std::mt19937 rng(37 + tokens);
  MlaFixture f(rng);
  const auto o = random_activations(int64_t(tokens) * kHeads, kLora, rng);
  auto d_o = upload(o);
  auto dout = poisoned(size_t(tokens) * kHeads * kV * 2);
  DeviceBuffer workspace(fp8_mla_bmm_workspace_bytes(f.shape, tokens));
  fp8_v_up(f.weights, d_o.get<__nv_bfloat16>(), tokens, dout.get<__nv_bfloat16>(), workspace.get(), nullptr);
  const auto out = to_float(download<uint16_t>(dout, size_t(tokens) * kHeads * kV));

  const std::vector<float> o_exact = to_float(o);
  const auto o_scheme = fake_quantize_rows(o_exact, int64_t(tokens) * kHeads, kLora);
  std::vector<double> ref(out.size()), ref_exact(out.size());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < kHeads; ++h)
      for (int v = 0; v < kV; ++v) {
        double s = 0, se = 0;
        for (int c = 0; c < kLora; ++c) {
          const int64_t i = (int64_t(t) * kHeads + h) * kLora + c;
          s += double(o_scheme[i]) * f.w(h, kNope + v, c);
          se += double(o_exact[i]) * f.w(h, kNope + v, c);
        }
        ref[(int64_t(t) * kHeads + h) * kV + v] = s;
        ref_exact[(int64_t(t) * kHeads + h) * kV + v] = se;
      }
  const std::string detail = std::to_string(tokens) + " tokens x 4 heads, 512 -> 128";
  const double err = rel_l2(out, ref), err_exact = rel_l2(out, ref_exact);
  report_fp8("fp8 o_latent.W_UV^T", detail.c_str(), err, kSchemeTol);
  report_fp8("fp8 o_latent.W_UV^T vs f64", detail.c_str(), err_exact, kVsUnquantizedTol);
  EXPECT_LT(err, kSchemeTol);
  EXPECT_LT(err_exact, kVsUnquantizedTol);
}

INSTANTIATE_TEST_SUITE_P(Tokens, Fp8MlaBmm, ::testing::Values(1, 7, 40));

}  // namespace
}  // namespace mlaserve::cuda::testing

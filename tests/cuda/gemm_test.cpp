// cuBLASLt GEMMs (linear, f32-out linear, per-head batched) against f64 host products.
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/skinny_gemm.h"

#include <cstdio>

#include "cuda_test_util.h"
#include "fp8_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

struct LinearShape {
  int64_t m, n, k;
};

class Linear : public ::testing::TestWithParam<LinearShape> {};

TEST_P(Linear, MatchesHostProductInBf16AndF32Out) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [m, n, k] = GetParam();
  std::mt19937 rng(m * 31 + n);
  auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng);
  std::vector<double> ref(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += double(bf16_to_f32(x[i * k + l])) * bf16_to_f32(w[j * k + l]);
      ref[i * n + j] = acc;
    }
  CublasLtGemm gemm;
  auto dx = upload(x), dw = upload(w);
  auto dout = poisoned(m * n * 2);
  gemm.linear(dx.get<__nv_bfloat16>(), dw.get<__nv_bfloat16>(), m, n, k, dout.get(), false, nullptr);
  const double err = rel_l2(to_float(download<uint16_t>(dout, m * n)), ref);
  auto dout32 = poisoned(m * n * 4);
  gemm.linear(dx.get<__nv_bfloat16>(), dw.get<__nv_bfloat16>(), m, n, k, dout32.get(), true, nullptr);
  const double err32 = rel_l2(download<float>(dout32, m * n), ref);
  std::printf("[rel_l2] linear %lldx%lldx%lld bf16-out %.2e f32-out %.2e\n", (long long)m, (long long)n,
              (long long)k, err, err32);
  EXPECT_LT(err, 1e-2);
  EXPECT_LT(err32, 1e-5);  // bf16 inputs are exact in f32; only summation order differs
}

INSTANTIATE_TEST_SUITE_P(Shapes, Linear,
                         ::testing::Values(LinearShape{1, 64, 32}, LinearShape{3, 576, 2048},
                                           LinearShape{37, 2048, 1408}, LinearShape{128, 512, 7168}));

TEST(HeadBmm, ReadsTheFirstKOfEachHeadWithAndWithoutTransposedWeights) {
  MLA_SKIP_WITHOUT_GPU();
  // q_nope{T, H, 128} read in place from q{T, H, 192}; W_UK {H, 128, 512}.
  const int64_t T = 5, H = 16, kx = 192, k = 128, n = 512;
  std::mt19937 rng(17);
  auto x = random_bf16(T * H * kx, rng), w = random_bf16(H * k * n, rng);
  CublasLtGemm gemm;
  auto dx = upload(x), dw = upload(w);
  for (bool transpose : {false, true}) {
    // transpose: w is {H, N, K}; use the same buffer reinterpreted.
    std::vector<double> ref(T * H * n);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t l = 0; l < k; ++l) {
            const size_t wi = transpose ? (h * n + j) * k + l : (h * k + l) * n + j;
            acc += double(bf16_to_f32(x[(t * H + h) * kx + l])) * bf16_to_f32(w[wi]);
          }
          ref[(t * H + h) * n + j] = acc;
        }
    auto dout = poisoned(T * H * n * 2);
    gemm.head_bmm(dx.get<__nv_bfloat16>(), dw.get<__nv_bfloat16>(), transpose, T, H, kx, k, n,
                  dout.get<__nv_bfloat16>(), nullptr);
    const double err = rel_l2(to_float(download<uint16_t>(dout, T * H * n)), ref);
    std::printf("[rel_l2] head_bmm transpose=%d %.2e\n", int(transpose), err);
    EXPECT_LT(err, 1e-2);
  }
}

}  // namespace
}  // namespace mlaserve::cuda::testing

namespace mlaserve::cuda::testing {
namespace {

class Skinny : public ::testing::TestWithParam<LinearShape> {};

TEST_P(Skinny, MatchesHostProduct) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [m, n, k] = GetParam();
  ASSERT_TRUE(skinny_gemm_applies(m, k));
  std::mt19937 rng(m * 131 + k);
  auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng);
  std::vector<double> ref(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += double(bf16_to_f32(x[i * k + l])) * bf16_to_f32(w[j * k + l]);
      ref[i * n + j] = acc;
    }
  auto dx = upload(x), dw = upload(w);
  auto dout = poisoned(m * n * 2), dout32 = poisoned(m * n * 4);
  skinny_gemm(dx.get<__nv_bfloat16>(), dw.get<__nv_bfloat16>(), m, n, k, dout.get(), false, nullptr);
  skinny_gemm(dx.get<__nv_bfloat16>(), dw.get<__nv_bfloat16>(), m, n, k, dout32.get(), true, nullptr);
  const double err = rel_l2(to_float(download<uint16_t>(dout, m * n)), ref);
  const double err32 = rel_l2(download<float>(dout32, m * n), ref);
  std::printf("[rel_l2] skinny_gemm %lldx%lldx%lld bf16-out %.2e f32-out %.2e\n", (long long)m, (long long)n,
              (long long)k, err, err32);
  EXPECT_LT(err, 1e-2);
  EXPECT_LT(err32, 1e-5);
}

// Covers each plan of the kernel: one column a warp (m <= 2, K > 1024), two
// (m > 2 or K <= 1024), four (K <= 512), K split over 2 warps (K 2048 at
// m > 2) and 8 (K 10944), more than one pass a warp (K 20008; K 10944 at
// m > 2), K and N that leave lanes and columns idle.
INSTANTIATE_TEST_SUITE_P(Shapes, Skinny,
                         ::testing::Values(LinearShape{1, 576, 2048}, LinearShape{3, 64, 1408},
                                           LinearShape{8, 300, 40}, LinearShape{4, 2816, 2048},
                                           LinearShape{2, 3648, 2048}, LinearShape{8, 1031, 2048},
                                           LinearShape{1, 301, 512}, LinearShape{6, 77, 264},
                                           LinearShape{1, 45, 10944}, LinearShape{7, 19, 10944},
                                           LinearShape{2, 11, 20008}, LinearShape{5, 9, 1416}));

struct SkinnyFp8Shape {
  int64_t m, n, k, x_ld;
};

class SkinnyFp8 : public ::testing::TestWithParam<SkinnyFp8Shape> {};

// Block-FP8 weights times unquantized bf16 rows: the f64 product of the
// dequantized weights and the exact activations differs only by f32
// accumulation order and the bf16 output rounding (~1e-3 RMS).
TEST_P(SkinnyFp8, MatchesHostProductOfDequantizedWeights) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [m, n, k, x_ld] = GetParam();
  ASSERT_TRUE(skinny_gemm_fp8_applies(m, k, x_ld));
  std::mt19937 rng(m * 37 + n + k);
  const HostFp8Weight w = random_fp8_weight(n, k, rng);
  const std::vector<uint16_t> x = random_activations(m, x_ld, rng);
  std::vector<float> x_rows(m * k);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) x_rows[r * k + i] = bf16_to_f32(x[r * x_ld + i]);
  auto dx = upload(x), dwq = upload(w.q), dws = upload(w.scale);
  auto dout = poisoned(m * n * 2);
  skinny_gemm_fp8(dx.get<__nv_bfloat16>(), x_ld, dwq.get<uint8_t>(), dws.get<float>(), m, n, k,
                  dout.get<__nv_bfloat16>(), nullptr);
  const double err = rel_l2(to_float(download<uint16_t>(dout, m * n)), matmul_nt(x_rows, w.dequant, m, n, k));
  std::printf("[rel_l2] skinny_gemm_fp8 %lldx%lldx%lld (x_ld %lld) %.2e\n", (long long)m, (long long)n,
              (long long)k, (long long)x_ld, err);
  EXPECT_LT(err, 5e-3);
}

// Each plan at V3's decode widths (q_a + kv_a, o_proj's K split over 4
// warps, q_b's short K), a row stride past K, K not a multiple of 128 (a
// partial scale block), ragged N, and 3-8 rows (two columns a warp).
INSTANTIATE_TEST_SUITE_P(Shapes, SkinnyFp8,
                         ::testing::Values(SkinnyFp8Shape{1, 2112, 7168, 7168}, SkinnyFp8Shape{2, 300, 16384, 16384},
                                           SkinnyFp8Shape{1, 1000, 1536, 1536}, SkinnyFp8Shape{2, 576, 7168, 7424},
                                           SkinnyFp8Shape{1, 77, 400, 400}, SkinnyFp8Shape{3, 129, 2048, 2048},
                                           SkinnyFp8Shape{8, 257, 7168, 7168}, SkinnyFp8Shape{5, 64, 40000, 40000}));

struct SkinnyNormShape {
  int64_t n, k;
  bool residual;
};

class SkinnyFp8RmsNorm : public ::testing::TestWithParam<SkinnyNormShape> {};

// The norm formed inside the launch against rms_norm, then skinny_gemm_fp8
// on its output: the same product and residual sums, bit for bit. Twice, so
// that the arrival counter is seen left at zero for the next launch.
TEST_P(SkinnyFp8RmsNorm, EqualsRmsNormThenTheSkinnyKernelBitForBit) {
  MLA_SKIP_WITHOUT_GPU();
  const auto [n, k, with_residual] = GetParam();
  ASSERT_TRUE(skinny_gemm_fp8_rms_norm_applies(k));
  std::mt19937 rng(uint32_t(n * 7 + k));
  const HostFp8Weight w = random_fp8_weight(n, k, rng);
  const std::vector<uint16_t> x = random_activations(1, k, rng), residual = random_activations(1, k, rng),
                              gamma = random_activations(1, k, rng);
  const float eps = 1e-6f;
  auto dx = upload(x), dgamma = upload(gamma), dwq = upload(w.q), dws = upload(w.scale);
  auto ref_residual = upload(residual), normed = poisoned(k * 2), ref_out = poisoned(n * 2);
  rms_norm(dx.get<__nv_bfloat16>(), dgamma.get<__nv_bfloat16>(), eps, 1, k, normed.get<__nv_bfloat16>(),
           with_residual ? ref_residual.get<__nv_bfloat16>() : nullptr, nullptr);
  skinny_gemm_fp8(normed.get<__nv_bfloat16>(), k, dwq.get<uint8_t>(), dws.get<float>(), 1, n, k,
                  ref_out.get<__nv_bfloat16>(), nullptr);
  const std::vector<uint16_t> want_out = download<uint16_t>(ref_out, n),
                              want_residual = download<uint16_t>(ref_residual, k);
  auto arrivals = upload(std::vector<uint32_t>{0});
  for (int launch = 0; launch < 2; ++launch) {
    auto fused_residual = upload(residual), out = poisoned(n * 2);
    SkinnyRmsNorm norm;
    norm.x = dx.get<__nv_bfloat16>();
    norm.residual = with_residual ? fused_residual.get<__nv_bfloat16>() : nullptr;
    norm.weight = dgamma.get<__nv_bfloat16>();
    norm.eps = eps;
    norm.arrivals = arrivals.get<unsigned>();
    skinny_gemm_fp8_rms_norm(norm, dwq.get<uint8_t>(), dws.get<float>(), n, k, out.get<__nv_bfloat16>(), nullptr);
    EXPECT_EQ(download<uint16_t>(out, n), want_out) << "launch " << launch;
    EXPECT_EQ(download<uint16_t>(fused_residual, k), want_residual) << "launch " << launch;
    EXPECT_EQ(download<uint32_t>(arrivals, 1)[0], 0u) << "launch " << launch;
  }
}

// q_a + kv_a's one-row plan (16-load warps on an H100/H200), kv_a's (two
// K slices a column), a 4-load plan without a residual, o_proj's width.
INSTANTIATE_TEST_SUITE_P(Shapes, SkinnyFp8RmsNorm,
                         ::testing::Values(SkinnyNormShape{2112, 7168, true}, SkinnyNormShape{576, 7168, true},
                                           SkinnyNormShape{1000, 2048, false}, SkinnyNormShape{300, 16384, true}));

TEST(Skinny, RejectsShapesItCannotRun) {
  EXPECT_FALSE(skinny_gemm_applies(9, 64));
  EXPECT_FALSE(skinny_gemm_applies(1, 36));
  EXPECT_FALSE(skinny_gemm_fp8_applies(9, 128, 128));
  EXPECT_FALSE(skinny_gemm_fp8_applies(1, 40, 40));
  EXPECT_FALSE(skinny_gemm_fp8_applies(1, 128, 132));
  EXPECT_TRUE(skinny_gemm_fp8_rms_norm_applies(7168));
  EXPECT_FALSE(skinny_gemm_fp8_rms_norm_applies(1024));   // rms_norm's rows of fewer threads
  EXPECT_FALSE(skinny_gemm_fp8_rms_norm_applies(16400));  // past the shared-memory row
  EXPECT_FALSE(skinny_gemm_fp8_rms_norm_applies(2056));   // not a multiple of 16
}

}  // namespace
}  // namespace mlaserve::cuda::testing

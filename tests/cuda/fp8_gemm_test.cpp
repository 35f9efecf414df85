// Block-scaled FP8 linear (own kernel and cuBLASLt) against an f64 host
// product of the dequantized operands.
//
// Bounds: both sides multiply the same dequantized values (the device's own
// quantized activations are downloaded for the reference), so the only
// differences are f32 accumulation order (~1e-6) and the bf16 output
// rounding (at most 2^-9 relative per element, ~1e-3 RMS): bound 5e-3.
// Against the unquantized bf16 activations the 1x128 e4m3 rounding of x
// enters too (~2.5% RMS per element, and so of each dot product): 4.5e-2.
#include "kernels/cuda/fp8_linear.h"

#include <initializer_list>

#include "fp8_test_util.h"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/skinny_gemm.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kSameOperandsTol = 5e-3, kVsUnquantizedTol = 4.5e-2;

struct Case {
  int64_t m, n, k;
  Fp8GemmPath path;
};

std::string name(const Case& c) {
  return std::string(fp8_gemm_path_name(c.path)) + " " + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" +
         std::to_string(c.k);
}

class Fp8Gemm : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8Gemm, MatchesHostProductOfDequantizedOperands) {
  MLA_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  std::mt19937 rng(17 + c.m + c.n);
  const HostFp8Weight w = random_fp8_weight(c.n, c.k, rng);
  const auto x = random_activations(c.m, c.k, rng);
  const int64_t ld = fp8_act_scale_ld(c.m);
  auto dx = upload(x), dwq = upload(w.q), dws = upload(w.scale);
  DeviceBuffer dxq(ld * c.k), dxs(ld * (c.k / 128) * 4);
  quantize_fp8_act(dx.get<__nv_bfloat16>(), c.m, c.k, c.k, dxq.get<uint8_t>(), dxs.get<float>(), ld, nullptr);
  auto dout = poisoned(c.m * c.n * 2);
  DeviceBuffer workspace(Fp8Linear::workspace_bytes(c.m, c.n, c.k));
  Fp8Linear linear;
  if (c.path == Fp8GemmPath::Sm90SplitK) {
    if (!sm90_gemm_supported()) GTEST_SKIP() << "no compute capability 9.0 GPU present";
    linear.run_sm90(dxq.get<uint8_t>(), dxs.get<float>(), ld, dwq.get<uint8_t>(), dws.get<float>(), c.m, c.n, c.k,
                    dout.get<__nv_bfloat16>(), workspace.get(), nullptr);
  } else if (c.path == Fp8GemmPath::OwnKernel) {
    linear.run_own_kernel(dxq.get<uint8_t>(), dxs.get<float>(), ld, dwq.get<uint8_t>(), dws.get<float>(), c.m, c.n,
                          c.k, dout.get<__nv_bfloat16>(), workspace.get(), nullptr);
  } else {
    ASSERT_TRUE(linear.run_cublaslt(dxq.get<uint8_t>(), dxs.get<float>(), ld, dwq.get<uint8_t>(), dws.get<float>(),
                                    c.m, c.n, c.k, dout.get<__nv_bfloat16>(), nullptr))
        << "cuBLASLt has no block-scaled FP8 algorithm for " << name(c);
  }
  const auto out = to_float(download<uint16_t>(dout, c.m * c.n));

  const auto xq = download<uint8_t>(dxq, c.m * c.k);
  const auto xs = download<float>(dxs, ld * (c.k / 128));
  std::vector<float> x_deq(c.m * c.k), x_exact(c.m * c.k);
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t i = 0; i < c.k; ++i) {
      x_deq[r * c.k + i] = fp8e4m3_to_f32(xq[r * c.k + i]) * xs[(i / 128) * ld + r];
      x_exact[r * c.k + i] = bf16_to_f32(x[r * c.k + i]);
    }
  const double err = rel_l2(out, matmul_nt(x_deq, w.dequant, c.m, c.n, c.k));
  const double err_exact = rel_l2(out, matmul_nt(x_exact, w.dequant, c.m, c.n, c.k));
  report_fp8("fp8 linear", name(c).c_str(), err, kSameOperandsTol);
  report_fp8("fp8 linear vs bf16 x", name(c).c_str(), err_exact, kVsUnquantizedTol);
  EXPECT_LT(err, kSameOperandsTol);
  EXPECT_LT(err_exact, kVsUnquantizedTol);
}

constexpr auto kOwn = Fp8GemmPath::OwnKernel;
constexpr auto kLt = Fp8GemmPath::CublasLt;
constexpr auto kSm90 = Fp8GemmPath::Sm90SplitK;
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Gemm,
                         ::testing::Values(Case{1, 576, 7168, kOwn},     // kv_a at decode: split-K, partial tile
                                           Case{3, 1536, 1536, kOwn},    // q_b-like K
                                           Case{16, 256, 4096, kOwn},    //
                                           Case{64, 512, 2048, kOwn},    // expert down K
                                           Case{128, 384, 1024, kOwn},   // largest own tile
                                           Case{200, 256, 1024, kOwn},   // two row chunks
                                           Case{256, 512, 1024, kLt},    //
                                           Case{132, 384, 2048, kLt},    //
                                           Case{256, 576, 1024, kLt},    // N not a multiple of 128
                                           Case{1, 576, 7168, kSm90},    // kv_a at decode: split K, ragged N
                                           Case{3, 2112, 7168, kSm90},   // fused q_a / kv_a
                                           Case{64, 512, 2048, kSm90},   // 64 x 256 tiles
                                           Case{128, 384, 1024, kSm90},  // 128 x 128 tiles
                                           Case{100, 576, 1536, kSm90},
                                           Case{301, 640, 1024, kSm90},    // prefill rows, M % 4 != 0
                                           Case{517, 384, 2048, kSm90}));  // 128-row tiles, a ragged last one

// Decode rows from bf16 above the skinny kernel's (the sm90 kernel
// quantizing them itself) against quantize_fp8_act + the same kernel:
// identical bits.
TEST(Fp8LinearBf16Input, QuantizingInTheGemmMatchesTheQuantizationKernel) {
  MLA_SKIP_WITHOUT_GPU();
  if (!sm90_gemm_supported()) GTEST_SKIP() << "no compute capability 9.0 GPU present";
  static_assert(Fp8Linear::kMaxSkinnyRows < 3);
  for (const auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{3, 2112, 7168}, {4, 1536, 1536}, {8, 576, 2048}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    std::mt19937 rng(5 + m);
    const HostFp8Weight w = random_fp8_weight(n, k, rng);
    auto dx = upload(random_activations(m, k, rng)), dwq = upload(w.q), dws = upload(w.scale);
    const int64_t ld = fp8_act_scale_ld(m);
    DeviceBuffer dxq(ld * k), dxs(ld * (k / 128) * 4), workspace(Fp8Linear::workspace_bytes(m, n, k));
    quantize_fp8_act(dx.get<__nv_bfloat16>(), m, k, k, dxq.get<uint8_t>(), dxs.get<float>(), ld, nullptr);
    auto out_ref = poisoned(m * n * 2), out = poisoned(m * n * 2);
    Fp8Linear linear;
    ASSERT_TRUE(linear.takes_bf16_rows(m, n, k));
    linear.run_sm90(dxq.get<uint8_t>(), dxs.get<float>(), ld, dwq.get<uint8_t>(), dws.get<float>(), m, n, k,
                    out_ref.get<__nv_bfloat16>(), workspace.get(), nullptr);
    ASSERT_TRUE(linear.run_bf16(dx.get<__nv_bfloat16>(), k, dwq.get<uint8_t>(), dws.get<float>(), m, n, k,
                                out.get<__nv_bfloat16>(), workspace.get(), nullptr));
    EXPECT_EQ(download<uint16_t>(out, m * n), download<uint16_t>(out_ref, m * n));
  }
}

// Up to kMaxSkinnyRows, decode rows from bf16 take the skinny kernel
// unquantized: its bits, and the product of the dequantized weights.
TEST(Fp8LinearBf16Input, SkinnyRowsAreTheSkinnyKernelsUnquantizedProduct) {
  MLA_SKIP_WITHOUT_GPU();
  if (!sm90_gemm_supported()) GTEST_SKIP() << "no compute capability 9.0 GPU present";
  for (const auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 2112, 7168}, {1, 576, 7168}, {1, 24576, 1536}, {1, 7168, 16384}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    std::mt19937 rng(11 + m);
    const HostFp8Weight w = random_fp8_weight(n, k, rng);
    const std::vector<uint16_t> x = random_activations(m, k, rng);
    auto dx = upload(x), dwq = upload(w.q), dws = upload(w.scale);
    DeviceBuffer workspace(Fp8Linear::workspace_bytes(m, n, k));
    auto out_ref = poisoned(m * n * 2), out = poisoned(m * n * 2);
    Fp8Linear linear;
    ASSERT_TRUE(Fp8Linear::skinny_takes(m, n, k, Fp8GemmDevice::current()));
    int splits = -1;
    ASSERT_TRUE(linear.run_bf16(dx.get<__nv_bfloat16>(), k, dwq.get<uint8_t>(), dws.get<float>(), m, n, k,
                                out.get<__nv_bfloat16>(), workspace.get(), nullptr, &splits));
    EXPECT_EQ(splits, 0) << "the skinny kernel leaves no partials";
    skinny_gemm_fp8(dx.get<__nv_bfloat16>(), k, dwq.get<uint8_t>(), dws.get<float>(), m, n, k,
                    out_ref.get<__nv_bfloat16>(), nullptr);
    const auto got = download<uint16_t>(out, m * n);
    EXPECT_EQ(got, download<uint16_t>(out_ref, m * n));
    std::vector<float> x_exact(m * k);
    for (int64_t i = 0; i < m * k; ++i) x_exact[i] = bf16_to_f32(x[i]);
    const double err = rel_l2(to_float(got), matmul_nt(x_exact, w.dequant, m, n, k));
    report_fp8("fp8 linear bf16 rows", (std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k)).c_str(),
               err, kSameOperandsTol);
    EXPECT_LT(err, kSameOperandsTol);
  }
}

const Fp8GemmDevice kNotHopper{false, false}, kH100{true, false}, kH200{true, true};

struct DispatchCase {
  int64_t m, n, k;
  Fp8GemmPath path;
  const char* why = "";
};

void expect_paths(const Fp8GemmDevice& device, std::initializer_list<DispatchCase> cases) {
  for (const DispatchCase& c : cases)
    EXPECT_EQ(Fp8Linear::path_for(c.m, c.n, c.k, device), c.path)
        << c.m << " x " << c.n << " x " << c.k << (*c.why ? ": " : "") << c.why;
}

TEST(Fp8LinearDispatch, WithoutHopperSmallMUsesOwnKernelLargerMUsesCublasLt) {
  expect_paths(kNotHopper, {{1, 7168, 16384, Fp8GemmPath::OwnKernel},
                            {8, 4096, 7168, Fp8GemmPath::OwnKernel},
                            {12, 4096, 7168, Fp8GemmPath::CublasLt},
                            {128, 24576, 1536, Fp8GemmPath::CublasLt},
                            {4096, 24576, 1536, Fp8GemmPath::CublasLt},
                            {4097, 7168, 2048, Fp8GemmPath::OwnKernel, "M not a multiple of 4"},
                            {64, 576, 1000, Fp8GemmPath::OwnKernel, "K not a multiple of 512"}});
}

TEST(Fp8LinearDispatch, OnHopperSplitKUpTo64RowsAndUpTo128ForWeightsUnder2To24ValuesOrLongK) {
  expect_paths(kH100, {{1, 7168, 16384, Fp8GemmPath::Sm90SplitK},
                       {64, 576, 7168, Fp8GemmPath::Sm90SplitK},
                       {64, 7168, 16384, Fp8GemmPath::Sm90SplitK},
                       {128, 2112, 7168, Fp8GemmPath::Sm90SplitK, "fused q_a / kv_a"},
                       {128, 7168, 2048, Fp8GemmPath::Sm90SplitK, "shared expert down"},
                       {68, 7168, 16384, Fp8GemmPath::Sm90SplitK, "o_proj: K splits in clusters"},
                       {128, 7168, 18432, Fp8GemmPath::Sm90SplitK, "dense down"},
                       {132, 7168, 16384, Fp8GemmPath::CublasLt, "o_proj above 128 rows"},
                       {128, 36864, 7168, Fp8GemmPath::CublasLt, "dense gate_up"},
                       {128, 24576, 1536, Fp8GemmPath::CublasLt, "q_b"},
                       {128, 32768, 512, Fp8GemmPath::CublasLt, "kv_b: 2^24 values"},
                       {66, 24576, 1536, Fp8GemmPath::Sm90SplitK, "M not a multiple of 4"},
                       {132, 24576, 1536, Fp8GemmPath::CublasLt},
                       {4, 100, 1024, Fp8GemmPath::OwnKernel, "N not a multiple of 8"},
                       {4096, 7168, 16384, Fp8GemmPath::CublasLt},
                       {4095, 7168, 16384, Fp8GemmPath::Sm90SplitK, "M not a multiple of 4"},
                       {4097, 32768, 512, Fp8GemmPath::Sm90SplitK, "kv_b, M % 4 != 0"},
                       {301, 100, 1024, Fp8GemmPath::OwnKernel, "N not a multiple of 8"}});
  EXPECT_TRUE(Fp8Linear::takes_bf16_rows(8, 576, 7168, kH100));
  EXPECT_FALSE(Fp8Linear::takes_bf16_rows(9, 576, 7168, kH100));
  EXPECT_FALSE(Fp8Linear::takes_bf16_rows(1, 576, 7168, kNotHopper));
}

// The H200's memory: cuBLASLt takes the long-K weights at 65-128 rows too.
TEST(Fp8LinearDispatch, OnFastMemoryCublasLtTakesEveryLargeWeightFrom65Rows) {
  expect_paths(kH200, {{64, 7168, 16384, Fp8GemmPath::Sm90SplitK, "o_proj"},
                       {68, 7168, 16384, Fp8GemmPath::CublasLt, "o_proj"},
                       {128, 7168, 18432, Fp8GemmPath::CublasLt, "dense down"},
                       {128, 2112, 7168, Fp8GemmPath::Sm90SplitK, "fused q_a / kv_a"},
                       {128, 7168, 2048, Fp8GemmPath::Sm90SplitK, "shared expert down"},
                       {126, 7168, 16384, Fp8GemmPath::Sm90SplitK, "M not a multiple of 4"},
                       {1, 7168, 16384, Fp8GemmPath::Sm90SplitK}});
  EXPECT_TRUE(Fp8Linear::takes_bf16_rows(8, 7168, 16384, kH200));
}

TEST(Fp8LinearDispatch, OneRowOnWeightsUnder125MiBTakesTheSkinnyKernel) {
  EXPECT_TRUE(Fp8Linear::skinny_takes(1, 2112, 7168, kH200)) << "fused q_a / kv_a";
  EXPECT_TRUE(Fp8Linear::skinny_takes(1, 24576, 1536, kH200)) << "q_b";
  EXPECT_TRUE(Fp8Linear::skinny_takes(1, 7168, 2048, kH100)) << "shared expert down";
  EXPECT_TRUE(Fp8Linear::skinny_takes(1, 7168, 16384, kH200)) << "o_proj: 112 MiB";
  EXPECT_FALSE(Fp8Linear::skinny_takes(1, 7168, 18432, kH200)) << "dense down: 126 MiB";
  EXPECT_FALSE(Fp8Linear::skinny_takes(1, 36864, 7168, kH200)) << "dense gate_up";
  EXPECT_FALSE(Fp8Linear::skinny_takes(1, 32768, 512, kH200)) << "kv_b: K 512";
  EXPECT_FALSE(Fp8Linear::skinny_takes(2, 2112, 7168, kH200)) << "two rows";
  EXPECT_FALSE(Fp8Linear::skinny_takes(1, 2112, 7168, kNotHopper));
}

// Prefill rows that cuBLASLt's layout refuses (M % 4 != 0) run the wgmma
// kernel through `run`, bit for bit as run_sm90.
TEST(Fp8LinearDispatch, RowsNotAMultipleOfFourRunTheWgmmaKernelOnHopper) {
  MLA_SKIP_WITHOUT_GPU();
  if (!sm90_gemm_supported()) GTEST_SKIP() << "no compute capability 9.0 GPU present";
  const int64_t m = 301, n = 640, k = 1024, ld = fp8_act_scale_ld(m);
  std::mt19937 rng(23);
  const HostFp8Weight w = random_fp8_weight(n, k, rng);
  auto dx = upload(random_activations(m, k, rng)), dwq = upload(w.q), dws = upload(w.scale);
  DeviceBuffer dxq(ld * k), dxs(ld * (k / 128) * 4), workspace(Fp8Linear::workspace_bytes(m, n, k));
  quantize_fp8_act(dx.get<__nv_bfloat16>(), m, k, k, dxq.get<uint8_t>(), dxs.get<float>(), ld, nullptr);
  auto out = poisoned(m * n * 2), out_ref = poisoned(m * n * 2);
  Fp8Linear linear;
  EXPECT_EQ(linear.run(dxq.get<uint8_t>(), dxs.get<float>(), ld, dwq.get<uint8_t>(), dws.get<float>(), m, n, k,
                       out.get<__nv_bfloat16>(), workspace.get(), nullptr),
            Fp8GemmPath::Sm90SplitK);
  linear.run_sm90(dxq.get<uint8_t>(), dxs.get<float>(), ld, dwq.get<uint8_t>(), dws.get<float>(), m, n, k,
                  out_ref.get<__nv_bfloat16>(), workspace.get(), nullptr);
  EXPECT_EQ(download<uint16_t>(out, m * n), download<uint16_t>(out_ref, m * n));
}

TEST(Fp8LinearDispatch, RejectsKThatIsNotABlockMultiple) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_THROW(Fp8Linear::workspace_bytes(1, 256, 100), std::exception);
}

}  // namespace
}  // namespace mlaserve::cuda::testing

// 1x128 FP8 activation quantization (plain, fused with RMSNorm, fused with
// SiLU-and-mul) against the scheme re-implemented on the host.
//
// Bounds: the quantized bytes and scales must equal the host's exactly (same
// IEEE f32 ops, both round to nearest even). Against the unquantized f64
// values, one e4m3 rounding (3 mantissa bits) is at most 2^-4 relative per
// element and about 2.5% RMS on these data: bound 4.5e-2.
#include "kernels/cuda/fp8_quant.h"

#include <cmath>

#include "fp8_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kOneRoundingTol = 4.5e-2;

struct DeviceQuantized {
  std::vector<uint8_t> q;
  std::vector<float> scale;
};

DeviceQuantized fetch(const DeviceBuffer& q, const DeviceBuffer& s, int64_t rows_padded, int64_t width) {
  return {download<uint8_t>(q, rows_padded * width), download<float>(s, rows_padded * (width / 128))};
}

// Checks rows [0, rows) equal the host scheme applied to ref_in (the values the
// kernel should have quantized) and the padding rows are zeros; returns the
// rel L2 of the dequantized values against `exact`.
double check_against_host(const DeviceQuantized& d, const std::vector<float>& ref_in, const std::vector<double>& exact,
                          int64_t rows, int64_t width, int64_t ld) {
  int64_t byte_mismatch = 0, scale_mismatch = 0;
  std::vector<float> deq(rows * width);
  for (int64_t r = 0; r < rows; ++r) {
    const HostQuantizedRow h = quantize_row_host(&ref_in[r * width], width);
    for (int64_t i = 0; i < width; ++i) {
      byte_mismatch += d.q[r * width + i] != h.q[i];
      deq[r * width + i] = fp8e4m3_to_f32(d.q[r * width + i]) * d.scale[(i / 128) * ld + r];
    }
    for (int64_t g = 0; g < width / 128; ++g) scale_mismatch += d.scale[g * ld + r] != h.scale[g];
  }
  EXPECT_EQ(byte_mismatch, 0) << "e4m3 bytes differing from the host scheme";
  EXPECT_EQ(scale_mismatch, 0) << "scales differing from the host scheme";
  for (int64_t r = rows; r < ld; ++r) {
    for (int64_t i = 0; i < width; ++i) EXPECT_EQ(d.q[r * width + i], 0) << "padding row " << r;
    for (int64_t g = 0; g < width / 128; ++g) EXPECT_EQ(d.scale[g * ld + r], 0.0f) << "padding row " << r;
  }
  return rel_l2(deq, exact);
}

TEST(Fp8Quant, StridedRowsMatchHostSchemeAndPadRowsAreZero) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t rows = 5, width = 512, stride = 640, ld = fp8_act_scale_ld(rows);
  std::mt19937 rng(3);
  auto x = random_activations(rows, stride, rng);
  for (int64_t i = 128; i < 256; ++i) x[2 * stride + i] = 0;  // an all-zero group: eps scale, zero bytes
  auto dx = upload(x);
  auto dq = poisoned(ld * width), ds = poisoned(ld * (width / 128) * 4);
  quantize_fp8_act(dx.get<__nv_bfloat16>(), rows, width, stride, dq.get<uint8_t>(), ds.get<float>(), ld, nullptr);
  std::vector<float> in(rows * width);
  std::vector<double> exact(rows * width);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) exact[r * width + i] = in[r * width + i] = bf16_to_f32(x[r * stride + i]);
  const double err = check_against_host(fetch(dq, ds, ld, width), in, exact, rows, width, ld);
  report_fp8("quantize_fp8_act", "5 x 512 (stride 640)", err, kOneRoundingTol);
  EXPECT_LT(err, kOneRoundingTol);
}

TEST(Fp8Quant, RmsNormFusedWithAndWithoutResidual) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t rows = 6, dim = 7168, ld = fp8_act_scale_ld(rows);
  const float eps = 1e-6f;
  std::mt19937 rng(5);
  auto x = random_bf16(rows * dim, rng, 2.0f), res = random_bf16(rows * dim, rng, 2.0f), w = random_bf16(dim, rng);
  for (bool fused : {false, true}) {
    auto dx = upload(x), dres = upload(res), dw = upload(w);
    auto dq = poisoned(ld * dim), ds = poisoned(ld * (dim / 128) * 4);
    rms_norm_quantize_fp8(dx.get<__nv_bfloat16>(), dw.get<__nv_bfloat16>(), eps, rows, dim, dq.get<uint8_t>(),
                          ds.get<float>(), ld, fused ? dres.get<__nv_bfloat16>() : nullptr, nullptr);
    // The kernel's own arithmetic in f32 gives the bytes to match; f64 the exact values.
    std::vector<float> normed(rows * dim), stream(rows * dim);
    std::vector<double> exact(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) {
        float v = bf16_to_f32(x[r * dim + i]);
        if (fused) v = round_bf16(v + bf16_to_f32(res[r * dim + i]));
        stream[r * dim + i] = v;
        ss += double(v) * v;
      }
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (int64_t i = 0; i < dim; ++i) {
        exact[r * dim + i] = stream[r * dim + i] * inv * bf16_to_f32(w[i]);
        normed[r * dim + i] = round_bf16(float(exact[r * dim + i]));
      }
    }
    // Bytes may differ where the f32 inverse RMS rounds a value across a
    // bf16 or e4m3 boundary; compare values, not bytes, for this op.
    const DeviceQuantized d = fetch(dq, ds, ld, dim);
    std::vector<float> deq(rows * dim);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < dim; ++i)
        deq[r * dim + i] = fp8e4m3_to_f32(d.q[r * dim + i]) * d.scale[(i / 128) * ld + r];
    const double err = rel_l2(deq, exact);
    report_fp8(fused ? "rms_norm+add+quant" : "rms_norm+quant", "6 x 7168", err, kOneRoundingTol);
    EXPECT_LT(err, kOneRoundingTol);
    const std::vector<float> host_scheme = fake_quantize_rows(normed, rows, dim);
    EXPECT_LT(rel_l2(deq, std::vector<double>(host_scheme.begin(), host_scheme.end())), 1e-2)
        << "against the host scheme applied to the bf16-rounded norm";
    if (fused) {
      std::vector<double> ref_stream(stream.begin(), stream.end());
      EXPECT_LT(rel_l2(to_float(download<uint16_t>(dres, rows * dim)), ref_stream), 1e-3) << "residual stream";
    }
    for (int64_t g = 0; g < dim / 128; ++g) EXPECT_EQ(d.scale[g * ld + rows], 0.0f) << "padding row scale";
  }
}

TEST(Fp8Quant, SiluAndMulFusedOnConcatenatedGateUp) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t rows = 9, inter = 2048, ld = fp8_act_scale_ld(rows);
  std::mt19937 rng(9);
  auto gu = random_bf16(rows * 2 * inter, rng, 3.0f);
  auto dgu = upload(gu);
  auto dq = poisoned(ld * inter), ds = poisoned(ld * (inter / 128) * 4);
  silu_and_mul_quantize_fp8(dgu.get<__nv_bfloat16>(), dgu.get<__nv_bfloat16>() + inter, 2 * inter, rows, inter,
                            dq.get<uint8_t>(), ds.get<float>(), ld, nullptr);
  std::vector<double> exact(rows * inter);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const double g = bf16_to_f32(gu[r * 2 * inter + i]), u = bf16_to_f32(gu[r * 2 * inter + inter + i]);
      exact[r * inter + i] = g / (1.0 + std::exp(-g)) * u;
    }
  const DeviceQuantized d = fetch(dq, ds, ld, inter);
  std::vector<float> deq(rows * inter);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i)
      deq[r * inter + i] = fp8e4m3_to_f32(d.q[r * inter + i]) * d.scale[(i / 128) * ld + r];
  const double err = rel_l2(deq, exact);
  report_fp8("silu_and_mul+quant", "9 x 2048", err, kOneRoundingTol);
  EXPECT_LT(err, kOneRoundingTol);
}

TEST(Fp8Quant, RejectsWidthsThatAreNotGroupMultiples) {
  MLA_SKIP_WITHOUT_GPU();
  DeviceBuffer x(4 * 200 * 2), q(4 * 200), s(4 * 4 * 4);
  EXPECT_THROW(quantize_fp8_act(x.get<__nv_bfloat16>(), 4, 200, 200, q.get<uint8_t>(), s.get<float>(), 4, nullptr),
               std::exception);
}

}  // namespace
}  // namespace mlaserve::cuda::testing

// CUDA row-wise ops against plain host references (f64 math), at a tiny
// width and at v2-lite / v3 widths.
#include "kernels/cuda/elementwise.h"

#include <cmath>
#include <cstdio>

#include "cuda_test_util.h"
#include "kernels/cuda/rope.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kBf16Tol = 1e-2;

void report(const char* op, int64_t rows, int64_t width, double err) {
  std::printf("[rel_l2] %-14s %5lld x %-6lld %.2e\n", op, (long long)rows, (long long)width, err);
}

class RowOps : public ::testing::TestWithParam<int64_t> {};

TEST_P(RowOps, RmsNormWithAndWithoutResidual) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t rows = 13, dim = GetParam();
  std::mt19937 rng(7 + dim);
  auto x = random_bf16(rows * dim, rng, 2.0f), w = random_bf16(dim, rng), res = random_bf16(rows * dim, rng, 2.0f);
  const float eps = 1e-6f;
  for (bool fused : {false, true}) {
    auto dx = upload(x), dw = upload(w), dres = upload(res);
    auto dout = poisoned(rows * dim * 2);
    rms_norm(dx.get<__nv_bfloat16>(), dw.get<__nv_bfloat16>(), eps, rows, dim, dout.get<__nv_bfloat16>(),
             fused ? dres.get<__nv_bfloat16>() : nullptr, nullptr);
    auto out = to_float(download<uint16_t>(dout, rows * dim));
    std::vector<double> ref(rows * dim), ref_res(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) {
        double v = bf16_to_f32(x[r * dim + i]) + (fused ? bf16_to_f32(res[r * dim + i]) : 0.0);
        ref_res[r * dim + i] = v;
        ss += v * v;
      }
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = ref_res[r * dim + i] * inv * bf16_to_f32(w[i]);
    }
    const double err = rel_l2(out, ref);
    report(fused ? "rms_norm+add" : "rms_norm", rows, dim, err);
    EXPECT_LT(err, kBf16Tol);
    if (fused) {
      const double res_err = rel_l2(to_float(download<uint16_t>(dres, rows * dim)), ref_res);
      EXPECT_LT(res_err, kBf16Tol) << "residual stream after the fused add";
    }
  }
}

TEST_P(RowOps, SiluAndMulOnSeparateAndConcatenatedInputs) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t rows = 9, inter = GetParam();
  std::mt19937 rng(11 + inter);
  auto gu = random_bf16(rows * 2 * inter, rng, 3.0f);  // [gate | up] per row
  auto dgu = upload(gu);
  auto dout = poisoned(rows * inter * 2);
  const auto* base = dgu.get<__nv_bfloat16>();
  silu_and_mul(base, base + inter, 2 * inter, rows, inter, dout.get<__nv_bfloat16>(), nullptr);
  auto out = to_float(download<uint16_t>(dout, rows * inter));
  std::vector<double> ref(rows * inter);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const double g = bf16_to_f32(gu[r * 2 * inter + i]), u = bf16_to_f32(gu[r * 2 * inter + inter + i]);
      ref[r * inter + i] = g / (1 + std::exp(-g)) * u;
    }
  const double err = rel_l2(out, ref);
  report("silu_and_mul", rows, inter, err);
  EXPECT_LT(err, kBf16Tol);
}

TEST_P(RowOps, EmbeddingAddAndRowMoves) {
  MLA_SKIP_WITHOUT_GPU();
  const int64_t vocab = 50, dim = GetParam(), rows = 7;
  std::mt19937 rng(3 + dim);
  auto table = random_bf16(vocab * dim, rng);
  // Two ids stand for ids an earlier step picked: -1 - r is picked[r].
  std::vector<int32_t> ids = {4, -2, 49, 4, -1, 33, 8}, picked = {17, 0};
  const std::vector<int32_t> resolved = {4, 0, 49, 4, 17, 33, 8};
  auto dtable = upload(table), dids = upload(ids), dpicked = upload(picked);
  auto demb = poisoned(rows * dim * 2);
  embedding(dids.get<int32_t>(), dpicked.get<int32_t>(), dtable.get<__nv_bfloat16>(), rows, dim,
            demb.get<__nv_bfloat16>(), nullptr);
  auto emb = download<uint16_t>(demb, rows * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(emb[r * dim + i], table[resolved[r] * dim + i]) << r << "," << i;

  // scatter rows into a cache at slots, gather them back in another order
  std::vector<int32_t> slots = {12, 3, 7, 0, 19, 5, 9};
  auto dslots = upload(slots);
  auto dcache = poisoned(20 * dim * 2);
  scatter_rows(dcache.get(), demb.get(), dslots.get<int32_t>(), rows, dim * 2, nullptr);
  auto dback = poisoned(rows * dim * 2);
  gather_rows(dback.get(), dcache.get(), dslots.get<int32_t>(), rows, dim * 2, nullptr);
  EXPECT_EQ(download<uint16_t>(dback, rows * dim), emb);
  auto cache = download<uint16_t>(dcache, 20 * dim);
  for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(cache[12 * dim + i], emb[i]);

  // y += x
  auto other = random_bf16(rows * dim, rng);
  auto dother = upload(other);
  add_inplace(demb.get<__nv_bfloat16>(), dother.get<__nv_bfloat16>(), rows * dim, nullptr);
  auto sum = to_float(download<uint16_t>(demb, rows * dim));
  std::vector<double> ref(rows * dim);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = double(bf16_to_f32(emb[i])) + bf16_to_f32(other[i]);
  EXPECT_LT(rel_l2(sum, ref), 4e-3);
}

INSTANTIATE_TEST_SUITE_P(Widths, RowOps, ::testing::Values(int64_t(64), int64_t(1408), int64_t(2048), int64_t(7168)));

TEST(CopyColumns, SplitsAndJoinsRowBlocksAtAnyAlignment) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int64_t rows = 6, src_w = 576, dst_w = 192;
  auto src = random_bf16(rows * src_w, rng);
  auto dsrc = upload(src);
  for (auto [src_col, dst_col, n] : {std::tuple<int64_t, int64_t, int64_t>{512, 128, 64}, {3, 5, 101}, {0, 0, 192}}) {
    auto ddst = poisoned(rows * dst_w * 2);
    copy_columns(dsrc.get(), src_w, src_col, ddst.get(), dst_w, dst_col, n, rows, 2, nullptr);
    auto dst = download<uint16_t>(ddst, rows * dst_w);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < n; ++c) ASSERT_EQ(dst[r * dst_w + dst_col + c], src[r * src_w + src_col + c]);
      if (dst_col > 0) EXPECT_EQ(dst[r * dst_w + dst_col - 1], 0xffff) << "wrote left of the block";
    }
  }
  EXPECT_THROW(copy_columns(dsrc.get(), src_w, 500, dsrc.get(), src_w, 0, 100, rows, 2, nullptr), std::exception);
}

TEST(Rope, RotatesInterleavedPairsInPlace) {
  MLA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  const int64_t tokens = 5, heads = 3, width = 192, offset = 128, freqs = 32;
  auto x = random_bf16(tokens * heads * width, rng);
  std::vector<int32_t> pos = {0, 1, 17, 4095, 163839};
  std::vector<float> inv_freq(freqs);
  for (int i = 0; i < freqs; ++i) inv_freq[i] = float(1.0 / std::pow(10000.0, 2.0 * i / (2 * freqs)));
  const float scale = 1.25f;
  auto dx = upload(x), dpos = upload(pos), dfreq = upload(inv_freq);
  rope_inplace(dx.get<__nv_bfloat16>(), tokens, heads, width, offset, dpos.get<int32_t>(), dfreq.get<float>(), freqs,
               scale, nullptr);
  auto out = download<uint16_t>(dx, x.size());
  std::vector<double> ref(x.size());
  std::vector<float> outf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ref[i] = bf16_to_f32(x[i]);
    outf[i] = bf16_to_f32(out[i]);
  }
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < freqs; ++i) {
        const float angle = float(pos[t]) * inv_freq[i];  // f32, as the reference forms it
        const double c = std::cos(double(angle)) * scale, s = std::sin(double(angle)) * scale;
        const size_t e = (t * heads + h) * width + offset + 2 * i;
        const double a = bf16_to_f32(x[e]), b = bf16_to_f32(x[e + 1]);
        ref[e] = a * c - b * s;
        ref[e + 1] = b * c + a * s;
      }
  const double err = rel_l2(outf, ref);
  report("rope", tokens * heads, 2 * freqs, err);
  EXPECT_LT(err, kBf16Tol);
  for (int64_t i = 0; i < offset; ++i) EXPECT_EQ(out[i], x[i]) << "columns before the rope block must not change";
}

}  // namespace
}  // namespace mlaserve::cuda::testing

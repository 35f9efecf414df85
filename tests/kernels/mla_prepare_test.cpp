// Backend::mla_prepare on the CPU against a naive double-precision loop, and
// head_bmm writing into rows wider than its product (the absorbed q rows).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/backend.h"

namespace mlaserve {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class MlaPrepareTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng{99};

  Tensor random_f32(Shape s, float scale = 1.0f) {
    Tensor t = Tensor::empty(std::move(s), DType::F32);
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t;
  }
  static Tensor filled(Shape s, float v) {
    Tensor t = Tensor::empty(std::move(s), DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
    return t;
  }
  static Tensor i32(std::vector<int32_t> v) {
    Tensor t = Tensor::empty({int64_t(v.size())}, DType::I32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  }
};

// Naive pieces in double: rmsnorm of n values, rope of R values at position pos.
std::vector<double> naive_norm(const float* x, const Tensor& w, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = x[i] * inv * w.data<float>()[i];
  return out;
}

std::vector<double> naive_rope(const float* x, const Tensor& inv_freq, int32_t pos, double scale) {
  const int64_t F = inv_freq.numel();
  std::vector<double> out(size_t(2 * F));
  for (int64_t i = 0; i < F; ++i) {
    const double angle = double(float(pos) * inv_freq.data<float>()[i]);
    const double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
    out[size_t(2 * i)] = x[2 * i] * c - x[2 * i + 1] * s;
    out[size_t(2 * i + 1)] = x[2 * i + 1] * c + x[2 * i] * s;
  }
  return out;
}

void expect_span(const float* got, const std::vector<double>& want, const char* what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::fabs(want[i]))) << what << " element " << i;
}

TEST_F(MlaPrepareTest, FusedRowsLatentWriteAndQSplit) {
  // V2-Lite's layout at a small width: rows [q (H heads of Dn + R) | c_kv (L) | k_pe (R)].
  const int64_t T = 3, H = 2, Dn = 6, R = 4, L = 8, S = 7, Nq = H * (Dn + R);
  const Tensor positions = i32({5, 0, 1000}), slots = i32({4, 0, 6});
  const Tensor inv_freq = random_f32({R / 2}, 0.5f), kv_norm = random_f32({L});
  const float scale = 1.3f, eps = 1e-6f;
  MlaPrepare p;
  p.kv = p.q = random_f32({T, Nq + L + R});
  p.kv_col = Nq;
  p.kv_norm = kv_norm;
  p.cache = filled({S, L + R}, kNaN);
  p.nope_dim = Dn;
  p.q_nope_out = filled({T, H, Dn}, kNaN);
  p.q_pe_out = filled({T, H, L + R}, kNaN);
  p.q_pe_col = L;
  p.eps = eps;
  be->mla_prepare(p, positions, slots, inv_freq, scale);

  for (int64_t t = 0; t < T; ++t) {
    const float* row = p.kv.data<float>() + t * (Nq + L + R);
    const int32_t pos = positions.data<int32_t>()[t];
    const float* cached = p.cache.data<float>() + slots.data<int32_t>()[t] * (L + R);
    expect_span(cached, naive_norm(row + Nq, kv_norm, L, eps), "c_kv");
    expect_span(cached + L, naive_rope(row + Nq + L, inv_freq, pos, scale), "k_pe");
    for (int64_t h = 0; h < H; ++h) {
      const float* head = row + h * (Dn + R);
      std::vector<double> nope(head, head + Dn);
      expect_span(p.q_nope_out.data<float>() + (t * H + h) * Dn, nope, "q_nope");
      const float* q_row = p.q_pe_out.data<float>() + (t * H + h) * (L + R);
      expect_span(q_row + L, naive_rope(head + Dn, inv_freq, pos, scale), "q_pe");
      for (int64_t i = 0; i < L; ++i) EXPECT_TRUE(std::isnan(q_row[i])) << "q_pe_out column " << i << " was written";
    }
  }
  for (int64_t s : {1, 2, 3, 5})
    for (int64_t i = 0; i < L + R; ++i)
      EXPECT_TRUE(std::isnan(p.cache.data<float>()[s * (L + R) + i])) << "cache slot " << s << " was written";
}

TEST_F(MlaPrepareTest, QaNormAndInPlaceQSplit) {
  // V3's two calls: latent write + q_a norm from [q_a | c_kv | k_pe] rows,
  // then q_b_proj's output roped in place.
  const int64_t T = 2, Q = 10, L = 8, R = 4, H = 3, Dn = 2, S = 3;
  const Tensor positions = i32({7, 8}), slots = i32({2, 1});
  const Tensor inv_freq = random_f32({R / 2}, 0.5f), kv_norm = random_f32({L}), q_a_norm = random_f32({Q});
  MlaPrepare first;
  first.kv = first.q_a = random_f32({T, Q + L + R});
  first.kv_col = Q;
  first.kv_norm = kv_norm;
  first.cache = filled({S, L + R}, kNaN);
  first.q_a_norm = q_a_norm;
  first.q_a_out = filled({T, Q}, kNaN);
  be->mla_prepare(first, positions, slots, inv_freq, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = first.q_a.data<float>() + t * (Q + L + R);
    expect_span(first.q_a_out.data<float>() + t * Q, naive_norm(row, q_a_norm, Q, first.eps), "q_a");
    expect_span(first.cache.data<float>() + slots.data<int32_t>()[t] * (L + R), naive_norm(row + Q, kv_norm, L, first.eps),
                "c_kv");
  }

  MlaPrepare second;
  second.q = random_f32({T, H * (Dn + R)});
  const Tensor q_before = random_f32({T, H * (Dn + R)});
  std::copy(second.q.data<float>(), second.q.data<float>() + second.q.numel(), q_before.data<float>());
  second.nope_dim = Dn;
  second.q_pe_out = second.q.view({T, H, Dn + R});
  second.q_pe_col = Dn;
  be->mla_prepare(second, positions, Tensor(), inv_freq, 1.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* before = q_before.data<float>() + (t * H + h) * (Dn + R);
      const float* after = second.q.data<float>() + (t * H + h) * (Dn + R);
      expect_span(after, std::vector<double>(before, before + Dn), "q_nope left in place");
      expect_span(after + Dn, naive_rope(before + Dn, inv_freq, positions.data<int32_t>()[t], 1.0), "q_pe in place");
    }
}

TEST_F(MlaPrepareTest, RejectsMismatchedParts) {
  const Tensor positions = i32({0, 1}), slots = i32({0, 1}), inv_freq = random_f32({2});
  MlaPrepare p;
  p.kv = random_f32({2, 12});
  p.kv_norm = random_f32({8});
  p.cache = random_f32({4, 12});
  be->mla_prepare(p, positions, slots, inv_freq, 1.0f);  // fits exactly
  p.kv_col = 1;
  EXPECT_THROW(be->mla_prepare(p, positions, slots, inv_freq, 1.0f), Error);  // columns past the row
  p.kv_col = 0;
  EXPECT_THROW(be->mla_prepare(p, positions, i32({0, 4}), inv_freq, 1.0f), Error);  // slot outside the cache
  EXPECT_THROW(be->mla_prepare(p, positions, i32({0}), inv_freq, 1.0f), Error);     // one slot for two tokens
  EXPECT_THROW(be->mla_prepare(p, positions, slots, random_f32({3}), 1.0f), Error);  // cache width != L + R
  MlaPrepare q;
  q.q = random_f32({2, 2 * 6});
  q.nope_dim = 2;
  q.q_pe_out = random_f32({2, 2, 4});
  q.q_pe_col = 1;
  EXPECT_THROW(be->mla_prepare(q, positions, slots, inv_freq, 1.0f), Error);  // q_pe columns past the row
  q.q_pe_col = 0;
  q.q_nope_out = random_f32({2, 3, 2});
  EXPECT_THROW(be->mla_prepare(q, positions, slots, inv_freq, 1.0f), Error);  // q_nope_out heads != q_pe_out's
  MlaPrepare a;
  a.q_a = random_f32({2, 8});
  a.q_a_norm = random_f32({8});
  EXPECT_THROW(be->mla_prepare(a, positions, slots, inv_freq, 1.0f), Error);  // q_a with nowhere to go
}

// mla_prepare_q_b without q_a_out (the model's call) against mla_prepare
// writing q_a_out and the linear after it: the same q rows, the same latent
// rows.
TEST_F(MlaPrepareTest, QbFromTheQaNormEqualsMlaPrepareThenLinear) {
  const int64_t T = 3, Q = 12, L = 8, R = 4, N = 10, S = 5;
  const Tensor positions = i32({3, 9, 27}), slots = i32({4, 0, 2});
  const Tensor inv_freq = random_f32({R / 2}, 0.5f);
  const Weight q_b = be->load_weight(random_f32({N, Q}, 0.3f), Tensor());
  MlaPrepare p;
  p.kv = p.q_a = random_f32({T, Q + L + R});
  p.kv_col = Q;
  p.kv_norm = random_f32({L});
  p.q_a_norm = random_f32({Q});
  p.cache = filled({S, L + R}, kNaN);
  Tensor fused = filled({T, N}, kNaN);
  be->mla_prepare_q_b(p, positions, slots, inv_freq, 1.0f, q_b, fused);
  const Tensor fused_cache = p.cache;

  p.cache = filled({S, L + R}, kNaN);
  p.q_a_out = filled({T, Q}, kNaN);
  Tensor ops = filled({T, N}, kNaN);
  be->mla_prepare(p, positions, slots, inv_freq, 1.0f);
  be->linear(p.q_a_out, q_b, ops);
  for (int64_t i = 0; i < T * N; ++i) ASSERT_EQ(fused.data<float>()[i], ops.data<float>()[i]) << "q element " << i;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slots.data<int32_t>()[t];
    for (int64_t c = 0; c < L + R; ++c)
      ASSERT_EQ(fused_cache.data<float>()[s * (L + R) + c], p.cache.data<float>()[s * (L + R) + c])
          << "latent row of token " << t;
  }
}

TEST_F(MlaPrepareTest, HeadBmmIntoWiderRowsLeavesTheRestAlone) {
  const int64_t T = 2, H = 3, Kx = 5, K = 4, N = 6, No = 9;
  const Tensor x = random_f32({T, H, Kx}), w = random_f32({H, K, N});
  Tensor out = filled({T, H, No}, kNaN);
  be->head_bmm(x, Weight{w, {}}, /*transpose_w=*/false, out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> want(size_t(N), 0.0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          want[size_t(n)] += double(x.data<float>()[(t * H + h) * Kx + k]) * w.data<float>()[(h * K + k) * N + n];
      const float* row = out.data<float>() + (t * H + h) * No;
      expect_span(row, want, "product");
      for (int64_t i = N; i < No; ++i) EXPECT_TRUE(std::isnan(row[i])) << "column " << i << " was written";
    }
  EXPECT_THROW(be->head_bmm(x, Weight{w, {}}, false, filled({T, H, N - 1}, 0.0f)), Error);
}

}  // namespace
}  // namespace mlaserve

// Non-absorbed (prefill / extend) MLA attention against an f64 host
// reference: ragged sequences with and without cached prefixes, causal
// within the new tokens; plus the reference-kernel path for other widths.
#include "kernels/cuda/mla_expanded.h"

#include "kernels/cuda/grouped_gemm_sm90.h"

#include <cmath>
#include <cstdio>

#include "cuda_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

struct Case {
  std::vector<int> q_lens, kv_lens;
  int heads, nope, rope, v;
};

// sm90: 1 the Hopper kernel (TMA, wgmma), 0 the mma.sync one.
double run_case(const Case& c, unsigned seed, int sm90 = 0) {
  std::mt19937 rng(seed);
  const int B = int(c.q_lens.size()), dqk = c.nope + c.rope, dkv = c.nope + c.v;
  std::vector<int32_t> q_indptr{0}, kv_indptr{0};
  int max_q = 0;
  for (int b = 0; b < B; ++b) {
    q_indptr.push_back(q_indptr.back() + c.q_lens[b]);
    kv_indptr.push_back(kv_indptr.back() + c.kv_lens[b]);
    max_q = std::max(max_q, c.q_lens[b]);
  }
  const int T = q_indptr.back(), Lk = kv_indptr.back(), H = c.heads;
  auto q = random_bf16(size_t(T) * H * dqk, rng), kv = random_bf16(size_t(Lk) * H * dkv, rng),
       kpe = random_bf16(size_t(Lk) * c.rope, rng);
  const float scale = 0.2f;
  std::vector<double> ref(size_t(T) * H * c.v);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < c.q_lens[b]; ++i) {
      const int t = q_indptr[b] + i, attend = c.kv_lens[b] - c.q_lens[b] + i + 1;
      for (int h = 0; h < H; ++h) {
        std::vector<double> s(attend);
        double mx = -INFINITY;
        for (int j = 0; j < attend; ++j) {
          const size_t row = size_t(kv_indptr[b] + j);
          double dot = 0;
          for (int d = 0; d < dqk; ++d) {
            const double k = d < c.nope ? bf16_to_f32(kv[(row * H + h) * dkv + d])
                                        : bf16_to_f32(kpe[row * c.rope + d - c.nope]);
            dot += double(bf16_to_f32(q[(size_t(t) * H + h) * dqk + d])) * k;
          }
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int d = 0; d < c.v; ++d) {
          double acc = 0;
          for (int j = 0; j < attend; ++j)
            acc += s[j] * bf16_to_f32(kv[((size_t(kv_indptr[b] + j)) * H + h) * dkv + c.nope + d]);
          ref[(size_t(t) * H + h) * c.v + d] = acc / sum;
        }
      }
    }
  auto dq = upload(q), dkv_ = upload(kv), dkpe = upload(kpe), dqi = upload(q_indptr), dki = upload(kv_indptr);
  auto dout = poisoned(ref.size() * 2);
  MlaExpandedParams p;
  p.q = dq.get<__nv_bfloat16>();
  p.kv = dkv_.get<__nv_bfloat16>();
  p.k_pe = dkpe.get<__nv_bfloat16>();
  p.q_indptr = dqi.get<int32_t>();
  p.kv_indptr = dki.get<int32_t>();
  p.num_seqs = B;
  p.num_tokens = T;
  p.num_heads = H;
  p.kv_rows = Lk;
  p.max_q_len = max_q;
  p.nope_dim = c.nope;
  p.rope_dim = c.rope;
  p.v_dim = c.v;
  p.scale = scale;
  p.out = dout.get<__nv_bfloat16>();
  p.sm90 = sm90;
  mla_attention_expanded(p, nullptr);
  const double err = rel_l2(to_float(download<uint16_t>(dout, ref.size())), ref);
  std::printf("[rel_l2] mla_expanded T=%d Lk=%d H=%d dims %d/%d/%d, %s kernel: %.2e\n", T, Lk, H, c.nope, c.rope,
              c.v, sm90 ? "Hopper" : "mma.sync", err);
  return err;
}

// Both kernels where the GPU has them.
std::vector<int> kernels() { return sm90_gemm_supported() ? std::vector<int>{0, 1} : std::vector<int>{0}; }

// 150 rows: a 128-row block and a 22-row one whose second warpgroup has no rows.
TEST(MlaExpanded, PrefillWithoutPrefixIsCausal) {
  MLA_SKIP_WITHOUT_GPU();
  for (int sm90 : kernels()) EXPECT_LT(run_case({{1, 64, 150}, {1, 64, 150}, 3, 128, 64, 128}, 1, sm90), 1e-2);
}

TEST(MlaExpanded, ExtendAttendsToTheWholePrefix) {
  MLA_SKIP_WITHOUT_GPU();
  for (int sm90 : kernels()) EXPECT_LT(run_case({{7, 70, 1}, {200, 71, 129}, 2, 128, 64, 128}, 2, sm90), 1e-2);
}

// 400 new rows: two 192-row blocks (Hopper) and one of 16 rows, two of whose
// three warpgroups have no rows; 5 rows after 895 cached ones.
TEST(MlaExpanded, ManyRowsAndALongPrefix) {
  MLA_SKIP_WITHOUT_GPU();
  for (int sm90 : kernels()) EXPECT_LT(run_case({{400, 5}, {400, 900}, 2, 128, 64, 128}, 4, sm90), 1e-2);
}

TEST(MlaExpanded, OtherWidthsUseTheReferenceKernel) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_case({{3, 5}, {3, 9}, 2, 16, 8, 16}, 3), 1e-2);
}

}  // namespace
}  // namespace mlaserve::cuda::testing

// Absorbed-MLA attention against a host softmax(q·k) v in f64, over ragged
// batches (decode and extend rows), several split counts, and head counts
// that do and do not fill the 16-head tile; head counts that fill 64-head
// blocks on both kernels (the wgmma one on Hopper); plus the reference-kernel
// path for widths the tensor-core kernels do not take.
#include "kernels/cuda/mla_absorbed.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda_test_util.h"

namespace mlaserve::cuda::testing {
namespace {

struct Case {
  std::vector<int> q_lens, kv_lens;
  int heads, latent, rope, splits;  // splits 0: the launcher's choice
};

// wide: 1 the 64-head wgmma kernel, 0 the 16-head one, -1 the launcher's choice.
double run_case(const Case& c, unsigned seed, int wide = -1) {
  std::mt19937 rng(seed);
  const int D = c.latent + c.rope, B = int(c.q_lens.size());
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, kv_slots;
  int total_kv = 0;
  for (int b = 0; b < B; ++b) {
    q_indptr.push_back(q_indptr.back() + c.q_lens[b]);
    kv_indptr.push_back(kv_indptr.back() + c.kv_lens[b]);
    total_kv += c.kv_lens[b];
  }
  const int T = q_indptr.back(), S = total_kv + 37;
  // Slots are a random permutation of the pool: rows are not contiguous.
  std::vector<int32_t> perm(S);
  for (int i = 0; i < S; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  kv_slots.assign(perm.begin(), perm.begin() + total_kv);
  auto q = random_bf16(size_t(T) * c.heads * D, rng), cache = random_bf16(size_t(S) * D, rng);
  const float scale = 0.25f;

  std::vector<double> ref(size_t(T) * c.heads * c.latent);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < c.q_lens[b]; ++i) {
      const int t = q_indptr[b] + i, attend = c.kv_lens[b] - c.q_lens[b] + i + 1;
      for (int h = 0; h < c.heads; ++h) {
        std::vector<double> s(attend);
        double mx = -INFINITY;
        for (int j = 0; j < attend; ++j) {
          const size_t row = size_t(kv_slots[kv_indptr[b] + j]) * D, qi = (size_t(t) * c.heads + h) * D;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(bf16_to_f32(q[qi + d])) * bf16_to_f32(cache[row + d]);
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int d = 0; d < c.latent; ++d) {
          double acc = 0;
          for (int j = 0; j < attend; ++j)
            acc += s[j] * bf16_to_f32(cache[size_t(kv_slots[kv_indptr[b] + j]) * D + d]);
          ref[(size_t(t) * c.heads + h) * c.latent + d] = acc / sum;
        }
      }
    }

  int sm_count = 0;
  MLA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), "test");
  const bool wide_blocks =
      wide < 0 ? mla_absorbed_uses_wide_blocks(c.heads, c.latent, c.rope) : wide != 0;
  const int splits = c.splits ? c.splits
                              : mla_absorbed_num_splits(T, c.heads, sm_count,
                                                        *std::max_element(c.kv_lens.begin(), c.kv_lens.end()),
                                                        wide_blocks);
  auto dq = upload(q), dcache = upload(cache), dqi = upload(q_indptr), dki = upload(kv_indptr),
       dslots = upload(kv_slots);
  auto dout = poisoned(size_t(T) * c.heads * c.latent * 2);
  DeviceBuffer work(mla_absorbed_workspace_bytes(T, c.heads, c.latent, splits));
  MlaAbsorbedParams p;
  p.q = dq.get<__nv_bfloat16>();
  p.cache = dcache.get<__nv_bfloat16>();
  p.q_indptr = dqi.get<int32_t>();
  p.kv_indptr = dki.get<int32_t>();
  p.kv_slots = dslots.get<int32_t>();
  p.num_seqs = B;
  p.num_tokens = T;
  p.num_heads = c.heads;
  p.latent_dim = c.latent;
  p.rope_dim = c.rope;
  p.scale = scale;
  p.out = dout.get<__nv_bfloat16>();
  p.num_splits = splits;
  p.wide_blocks = wide;
  if (splits > 1) {
    p.partial_out = work.get<float>();
    p.partial_lse = p.partial_out + size_t(splits) * T * c.heads * c.latent;
  }
  mla_attention_absorbed(p, nullptr);
  const double err = rel_l2(to_float(download<uint16_t>(dout, ref.size())), ref);
  std::printf("[rel_l2] mla_absorbed T=%d H=%d L=%d R=%d splits=%d %s: %.2e\n", T, c.heads, c.latent, c.rope,
              splits, wide_blocks ? "64-head wgmma" : "16-head", err);
  return err;
}

TEST(MlaAbsorbed, DecodeBatchSingleSplit) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_case({{1, 1, 1}, {1, 77, 300}, 16, 512, 64, 1}, 1), 1e-2);
}

TEST(MlaAbsorbed, DecodeSplitKvMergesPartials) {
  MLA_SKIP_WITHOUT_GPU();
  // 7 splits of a 100-row context leaves some splits empty.
  EXPECT_LT(run_case({{1, 1}, {1000, 100}, 16, 512, 64, 7}, 2), 1e-2);
  EXPECT_LT(run_case({{1}, {2049}, 16, 512, 64, 0}, 3), 1e-2);
}

TEST(MlaAbsorbed, ManySplitsAndRaggedRowsMerge) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_case({{1}, {2049}, 128, 512, 64, 64}, 10), 1e-2);
  EXPECT_LT(run_case({{1, 1}, {4096, 700}, 128, 512, 64, 8}, 12), 1e-2);
  EXPECT_LT(run_case({{3, 1}, {40, 2049}, 16, 512, 64, 16}, 15), 1e-2);
}

TEST(MlaAbsorbed, HeadCountsThatDoNotFillTheTile) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_case({{1, 1}, {65, 130}, 20, 512, 64, 2}, 4), 1e-2);
  EXPECT_LT(run_case({{1}, {40}, 128, 512, 64, 1}, 5), 1e-2);
}

TEST(MlaAbsorbed, V3HeadCountWithSplitKv) {
  MLA_SKIP_WITHOUT_GPU();
  // 128 heads: eight 16-head blocks per token, each merged over its splits.
  EXPECT_LT(run_case({{1, 1}, {300, 513}, 128, 512, 64, 5}, 8), 1e-2);
}

// V3's 128 heads (and 64, a tensor-parallel half) on the 64-head wgmma
// kernel and on the 16-head one: decode and extend rows, splits that leave
// the last tile's second half (the second warpgroup's rows) empty, empty
// splits, one-tile splits.
TEST(MlaAbsorbed, SixtyFourHeadBlocksOnBothKernels) {
  MLA_SKIP_WITHOUT_GPU();
  const std::vector<Case> cases = {
      {{1, 1, 1}, {1, 77, 300}, 128, 512, 64, 1}, {{1}, {40}, 64, 512, 64, 1},
      {{1, 1}, {1000, 100}, 128, 512, 64, 7},     {{1}, {2049}, 128, 512, 64, 0},
      {{5, 1, 33}, {5, 9, 90}, 128, 512, 64, 3},  {{1, 1}, {4096, 700}, 64, 512, 64, 0},
      {{1}, {2049}, 128, 512, 64, 64},
  };
  const bool hopper = mla_absorbed_uses_wide_blocks(128, 512, 64);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_LT(run_case(cases[i], 20 + unsigned(i), 0), 1e-2) << "16-head kernel, case " << i;
    if (hopper) EXPECT_LT(run_case(cases[i], 20 + unsigned(i), 1), 1e-2) << "64-head kernel, case " << i;
  }
}

TEST(MlaAbsorbed, SplitCountGivesEverySplitRows) {
  // Splits start on 32-row tile bounds; the chosen count must not leave
  // splits empty for the context it was chosen for (61 splits of 4096 rows
  // would be 43 of 96 rows and 18 empty ones).
  for (bool wide : {false, true})
    for (int tokens : {1, 2, 8, 32, 128})
      for (int heads : {16, 128})
        for (int kv_len : {1, 31, 64, 100, 640, 2049, 4096, 32768}) {
          if (wide && heads % 64) continue;
          const int splits = mla_absorbed_num_splits(tokens, heads, 132, kv_len, wide);
          ASSERT_GE(splits, 1);
          const int chunk = ((kv_len + splits - 1) / splits + 31) / 32 * 32;
          EXPECT_EQ((kv_len + chunk - 1) / chunk, splits)
              << "tokens " << tokens << ", heads " << heads << ", kv_len " << kv_len << ", wide " << wide;
        }
  EXPECT_EQ(mla_absorbed_num_splits(1, 16, 132, 4096, false), 64);
  EXPECT_EQ(mla_absorbed_num_splits(128, 16, 132, 4096, false), 2);
  // Up to 4 tokens a split may be one tile (the H200 timed 1 x 512 faster at
  // 16 splits than at 8); larger batches keep two tiles a split.
  EXPECT_EQ(mla_absorbed_num_splits(1, 128, 132, 512, false), 16);
  EXPECT_LE(mla_absorbed_num_splits(8, 128, 132, 512, false), 8);
  // 64-head blocks, one per SM: a token's two blocks over 64-row splits fill
  // 128 of 132 SMs; 64 tokens x 2 blocks fill them without splitting.
  EXPECT_EQ(mla_absorbed_num_splits(1, 128, 132, 4096, true), 64);
  EXPECT_EQ(mla_absorbed_num_splits(64, 128, 132, 8192, true), 1);
  EXPECT_EQ(mla_absorbed_num_splits(1, 128, 132, 512, true), 8);
}

TEST(MlaAbsorbed, ExtendRowsAreCausalWithinTheNewTokens) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_case({{5, 1, 33}, {5, 9, 90}, 16, 512, 64, 3}, 6), 1e-2);
}

TEST(MlaAbsorbed, OtherWidthsUseTheReferenceKernel) {
  MLA_SKIP_WITHOUT_GPU();
  EXPECT_LT(run_case({{1, 3}, {17, 10}, 4, 32, 16, 1}, 7), 1e-2);
}

}  // namespace
}  // namespace mlaserve::cuda::testing

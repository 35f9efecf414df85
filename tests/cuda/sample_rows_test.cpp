// Backend::sample_rows on the GPU against the CPU reference (cpu_sampling.h)
// with the same settings and draws, on shuffled-grid logits (distinct values)
// at the real vocabulary width. The two sum 129k weights in f32 and double,
// so a draw landing within rounding of an interval boundary may pick the
// neighbour: a few such rows are allowed, a wrong setting or row order would
// disagree on most rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "cuda_test_util.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_sampling.h"

namespace mlaserve::cuda::testing {
namespace {

TEST(SampleRows, MatchesTheCpuReference) {
  MLA_SKIP_WITHOUT_GPU();
  auto backend = make_cuda_backend(0);
  ASSERT_TRUE(backend);
  constexpr int64_t kVocab = 129280, kRows = 64;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const RowSampling kinds[] = {
      {0.0f, -1, 1.0f, 0.0f, 0.0},  {0.7f, 50, 1.0f, 0.0f, 0.0},  {1.0f, -1, 0.9f, 0.0f, 0.0},
      {1.3f, -1, 1.0f, 0.05f, 0.0}, {1.0f, 200, 0.8f, 0.01f, 0.0}, {1.0f, -1, 1.0f, 0.0f, 0.0},
  };
  Tensor host = Tensor::empty({kRows, kVocab}, DType::F32);
  std::vector<RowSampling> rows;
  for (int64_t r = 0; r < kRows; ++r) {
    float* row = host.data<float>() + r * kVocab;
    for (int64_t i = 0; i < kVocab; ++i) row[i] = -6.0f + 12.0f * float(i) / float(kVocab);
    std::shuffle(row, row + kVocab, rng);
    RowSampling p = kinds[r % 6];
    p.uniform = uni(rng);
    rows.push_back(p);
  }
  Tensor ids = backend->alloc({kRows}, DType::I32);
  backend->sample_rows(backend->load_tensor(host), rows, ids);
  Tensor got = backend->to_host(ids);
  int agree = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    const int32_t want = cpu::sample_row(host.data<float>() + r * kVocab, kVocab, rows[size_t(r)]);
    agree += got.data<int32_t>()[r] == want;
  }
  std::printf("sample_rows: %d of %lld rows equal the CPU reference\n", agree, (long long)kRows);
  EXPECT_GE(agree, kRows - 3);
}

}  // namespace
}  // namespace mlaserve::cuda::testing

// Backend::argmax_rows on the GPU against a host argmax (lowest index on
// ties, the host sampler's greedy rule) on random logits with many ties, at
// the real vocabulary width.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "cuda_test_util.h"
#include "kernels/backend.h"

namespace mlaserve::cuda::testing {
namespace {

int32_t host_argmax(const float* row, int64_t vocab) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (row[v] > row[best]) best = v;
  return int32_t(best);
}

TEST(ArgmaxRows, MatchesTheHostArgmaxWithTies) {
  MLA_SKIP_WITHOUT_GPU();
  auto backend = make_cuda_backend(0);
  ASSERT_TRUE(backend);
  for (int64_t vocab : {int64_t(1), int64_t(7), int64_t(1001), int64_t(129280)}) {
    const int64_t rows = 67;
    std::mt19937 rng{uint32_t(vocab)};
    // Coarse levels: the maximum of a row usually occurs several times.
    std::uniform_int_distribution<int> level(-20, 20);
    Tensor host = Tensor::empty({rows, vocab}, DType::F32);
    for (int64_t i = 0; i < rows * vocab; ++i) host.data<float>()[i] = 0.25f * float(level(rng));
    std::fill_n(host.data<float>(), vocab, -2.0f);  // row 0: all equal
    float* last = host.data<float>() + vocab;        // row 1: the maximum only at the end
    std::fill_n(last, vocab, -9.0f);
    last[vocab - 1] = 9.0f;
    Tensor logits = backend->load_tensor(host);
    Tensor ids = backend->alloc({rows}, DType::I32);
    backend->argmax_rows(logits, ids);
    Tensor got = backend->to_host(ids);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got.data<int32_t>()[r], host_argmax(host.data<float>() + r * vocab, vocab))
          << "vocab " << vocab << " row " << r;
  }
}

}  // namespace
}  // namespace mlaserve::cuda::testing

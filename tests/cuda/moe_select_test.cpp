// CudaBackend::moe_select (router logits and expert selection in one launch
// for up to 8 tokens, the two-step path above) against the CPU backend's
// linear_f32_out + moe_route on the same bf16 values, for the three routing
// methods at V2-Lite, V2 and V3 router widths. Several calls on one backend
// in a row, so the fused kernel's arrival counter must have been reset.
//
// Bounds: both sides accumulate the same bf16 products in f32 (different
// order, ~1e-6 relative), so the chosen experts are the same unless two
// selection scores tie to that precision (not the case for these seeds);
// weights agree to 1e-4 relative (fast vs libm exp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"

namespace mlaserve::cuda::testing {
namespace {

struct SelectCase {
  const char* name;
  int64_t hidden, experts;
  RouterParams routing;
  bool bias;
};

RouterParams routing(TopkMethod m, ScoringFunc s, int top_k, int n_group, int topk_group, bool renorm, float scale) {
  RouterParams p;
  p.method = m;
  p.scoring = s;
  p.top_k = top_k;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.renormalize = renorm;
  p.scaling = scale;
  return p;
}

class MoeSelect : public ::testing::TestWithParam<SelectCase> {
 protected:
  void SetUp() override {
    MLA_SKIP_WITHOUT_GPU();
    gpu_ = std::make_unique<CudaBackend>();
  }
  // The same values as an f32 CPU tensor and a bf16 GPU tensor.
  std::pair<Tensor, Tensor> random(Shape shape, float range) {
    std::vector<uint16_t> v = random_bf16(size_t(shape_numel(shape)), rng_, range);
    Tensor c = Tensor::empty(shape, DType::F32);
    for (size_t i = 0; i < v.size(); ++i) c.data<float>()[i] = bf16_to_f32(v[i]);
    return {c, gpu_->load_tensor(Tensor::wrap(v.data(), std::move(shape), DType::BF16, Device::CPU))};
  }

  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  std::unique_ptr<CudaBackend> gpu_;
  std::mt19937 rng_{4242};
};

TEST_P(MoeSelect, MatchesCpuLinearThenRoute) {
  if (!gpu_) return;
  const SelectCase c = GetParam();
  const int64_t D = c.hidden, E = c.experts, k = c.routing.top_k;
  const auto [wc, wg] = random({E, D}, 0.1f);
  const Weight router_cpu{wc, Tensor()}, router_gpu{wg, Tensor()};
  Tensor bias_cpu, bias_gpu;
  if (c.bias) {
    bias_cpu = Tensor::empty({E}, DType::F32);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    for (int64_t e = 0; e < E; ++e) bias_cpu.data<float>()[e] = nd(rng_);
    bias_gpu = gpu_->load_tensor(bias_cpu);
  }
  for (int64_t T : {1, 3, 8, 1, 12}) {  // 12: the two-step path
    const auto [hc, hg] = random({T, D}, 2.0f);
    Tensor ids_c = Tensor::empty({T, k}, DType::I32), w_c = Tensor::empty({T, k}, DType::F32);
    cpu_->moe_select(hc, router_cpu, bias_cpu, c.routing, ids_c, w_c);
    Tensor ids_g = gpu_->alloc({T, k}, DType::I32), w_g = gpu_->alloc({T, k}, DType::F32);
    gpu_->moe_select(hg, router_gpu, bias_gpu, c.routing, ids_g, w_g);
    const Tensor ids = gpu_->to_host(ids_g), w = gpu_->to_host(w_g);
    double max_rel = 0.0;
    for (int64_t i = 0; i < T * k; ++i) {
      ASSERT_EQ(ids.data<int32_t>()[i], ids_c.data<int32_t>()[i]) << c.name << " T=" << T << " token " << i / k
                                                                   << " rank " << i % k;
      const double want = w_c.data<float>()[i], got = w.data<float>()[i];
      max_rel = std::max(max_rel, std::abs(got - want) / std::max(1e-6, std::abs(want)));
    }
    std::printf("[moe_select] %-12s T=%-2lld E=%-3lld D=%-4lld ids equal, weights max rel %.2e\n", c.name,
                (long long)T, (long long)E, (long long)D, max_rel);
    EXPECT_LT(max_rel, 1e-4) << c.name << " T=" << T;
  }
}

// rms_norm_moe_select (the post-attention norm inside moe_select's launch
// for one token of 2048 to 8192 columns, the ops in turn elsewhere) against
// rms_norm then moe_select on the same backend: the norm sums as rms_norm
// does and the logits as moe_select does, so normed, the residual, the ids
// and the weights are the same bits.
TEST_P(MoeSelect, NormInTheLaunchEqualsTheOpsInTurn) {
  if (!gpu_) return;
  const SelectCase c = GetParam();
  const int64_t D = c.hidden, E = c.experts, k = c.routing.top_k;
  const Weight router{random({E, D}, 0.1f).second, Tensor()};
  const Tensor norm_w = random({D}, 1.0f).second;
  Tensor bias;
  if (c.bias) {
    Tensor b = Tensor::empty({E}, DType::F32);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    for (int64_t e = 0; e < E; ++e) b.data<float>()[e] = nd(rng_);
    bias = gpu_->load_tensor(b);
  }
  auto bits_equal = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  for (int64_t T : {1, 2, 1, 12}) {  // 2, 12: the ops in turn on both sides
    const Tensor x = random({T, D}, 2.0f).second, res0 = gpu_->to_host(random({T, D}, 4.0f).second);
    Tensor res_a = gpu_->load_tensor(res0), res_b = gpu_->load_tensor(res0);
    Tensor normed_a = gpu_->alloc({T, D}, DType::BF16), normed_b = gpu_->alloc({T, D}, DType::BF16);
    Tensor ids_a = gpu_->alloc({T, k}, DType::I32), w_a = gpu_->alloc({T, k}, DType::F32);
    Tensor ids_b = gpu_->alloc({T, k}, DType::I32), w_b = gpu_->alloc({T, k}, DType::F32);
    gpu_->rms_norm_moe_select(ResidualNorm{x, res_a, norm_w, 1e-6f}, normed_a, router, bias, c.routing, ids_a, w_a);
    gpu_->rms_norm(x, norm_w, 1e-6f, normed_b, res_b);
    gpu_->moe_select(normed_b, router, bias, c.routing, ids_b, w_b);
    EXPECT_TRUE(bits_equal(gpu_->to_host(res_a), gpu_->to_host(res_b))) << c.name << " T=" << T << " residual";
    EXPECT_TRUE(bits_equal(gpu_->to_host(normed_a), gpu_->to_host(normed_b))) << c.name << " T=" << T << " normed";
    EXPECT_TRUE(bits_equal(gpu_->to_host(ids_a), gpu_->to_host(ids_b))) << c.name << " T=" << T << " ids";
    EXPECT_TRUE(bits_equal(gpu_->to_host(w_a), gpu_->to_host(w_b))) << c.name << " T=" << T << " weights";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Methods, MoeSelect,
    ::testing::Values(
        SelectCase{"v2lite", 2048, 64, routing(TopkMethod::Greedy, ScoringFunc::Softmax, 6, 1, 1, false, 1.0f), false},
        SelectCase{"v2", 5120, 160,
                   routing(TopkMethod::GroupLimitedGreedy, ScoringFunc::Softmax, 6, 8, 3, false, 16.0f), false},
        SelectCase{"v3", 7168, 256, routing(TopkMethod::NoauxTc, ScoringFunc::Sigmoid, 8, 8, 4, true, 2.5f), true},
        SelectCase{"tiny", 32, 8, routing(TopkMethod::Greedy, ScoringFunc::Softmax, 2, 1, 1, true, 1.0f), false}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace mlaserve::cuda::testing

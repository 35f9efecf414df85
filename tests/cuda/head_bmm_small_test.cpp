// CudaBackend::head_bmm at decode sizes (the weight-streaming kernel of
// head_bmm_small.h, T <= 8) and just above (cuBLASLt) against the CPU
// backend on the same bf16 values: both products (w {H, K, N} and
// transposed {H, N, K}), x rows wider than K and output rows wider than N.
// Outputs start as NaN: columns past N must stay NaN, every other one must
// be written.
//
// Bound: both sides sum the same bf16 products in f32 (different order);
// the GPU rounds the result to bf16 once (2^-9 relative), so 1e-2 relative
// L2 is loose for a right answer and far below a wrong head or column.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "cuda_test_util.h"
#include "fp8_test_util.h"
#include "kernels/cuda/cuda_backend.h"

namespace mlaserve::cuda::testing {
namespace {

struct BmmShape {
  const char* name;
  int64_t tokens, heads, kx, k, n, no;
  bool transpose;
};

class HeadBmmSmall : public ::testing::TestWithParam<BmmShape> {
 protected:
  void SetUp() override {
    MLA_SKIP_WITHOUT_GPU();
    gpu_ = std::make_unique<CudaBackend>();
  }
  // The same values as an f32 CPU tensor and a bf16 GPU tensor.
  std::pair<Tensor, Tensor> both(Shape shape, std::vector<uint16_t> v) {
    Tensor c = Tensor::empty(shape, DType::F32);
    for (size_t i = 0; i < v.size(); ++i) c.data<float>()[i] = bf16_to_f32(v[i]);
    return {c, gpu_->load_tensor(Tensor::wrap(v.data(), std::move(shape), DType::BF16, Device::CPU))};
  }
  std::pair<Tensor, Tensor> random(Shape shape, float range) {
    return both(shape, random_bf16(size_t(shape_numel(shape)), rng_, range));
  }

  // Relative L2 of the GPU output's first N columns of each row against the
  // CPU's, and how many of the columns past N (NaN before the call) it wrote.
  std::pair<double, int64_t> compare(const Tensor& cpu_out, const Tensor& gpu_out, int64_t N, int64_t No) {
    const Tensor host = gpu_->to_host(gpu_out);
    std::vector<float> got;
    std::vector<double> want;
    int64_t written_outside = 0;
    for (int64_t i = 0; i < cpu_out.numel(); ++i) {
      const float g = bf16_to_f32(host.data<uint16_t>()[i]);
      if (i % No < N) {
        got.push_back(g);
        want.push_back(cpu_out.data<float>()[i]);
      } else if (!std::isnan(g)) {
        ++written_outside;
      }
    }
    return {rel_l2(got, want), written_outside};
  }

  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  std::unique_ptr<CudaBackend> gpu_;
  std::mt19937 rng_{77};
};

TEST_P(HeadBmmSmall, MatchesCpu) {
  if (!gpu_) return;
  const BmmShape s = GetParam();
  const int64_t T = s.tokens, H = s.heads, N = s.n, No = s.no, K = s.k;
  const auto [xc, xg] = random({T, H, s.kx}, 2.0f);
  const auto [wc, wg] = random(s.transpose ? Shape{H, N, K} : Shape{H, K, N}, 0.1f);
  const Shape out_shape{T, H, No};
  const auto [oc, og] = both(out_shape, std::vector<uint16_t>(size_t(shape_numel(out_shape)), 0x7fc0));  // NaN
  cpu_->head_bmm(xc, Weight{wc, {}}, s.transpose, oc);
  gpu_->head_bmm(xg, Weight{wg, {}}, s.transpose, og);
  const auto [err, written_outside] = compare(oc, og, N, No);
  std::printf("[rel_l2] head_bmm %-8s T=%-2lld H=%-3lld K=%-3lld N=%-3lld transpose=%d: %.2e\n", s.name,
              (long long)T, (long long)H, (long long)K, (long long)N, int(s.transpose), err);
  EXPECT_EQ(written_outside, 0) << "columns past N were written";
  EXPECT_LT(err, 1e-2);  // also fails on NaN (an unwritten element)
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, HeadBmmSmall,
    ::testing::Values(BmmShape{"wuk_v2l", 1, 16, 192, 128, 512, 576, false},  // q_nope of q{Dn+R} into q_cat{L+R}
                      BmmShape{"wuv_v2l", 1, 16, 512, 512, 128, 128, true},   // o_latent · W_UVᵀ
                      BmmShape{"wuk_v2l", 3, 16, 192, 128, 512, 576, false},
                      BmmShape{"wuv_v2l", 5, 16, 512, 512, 128, 128, true},
                      BmmShape{"wuk_v3", 8, 128, 192, 128, 512, 576, false},
                      BmmShape{"wuv_v3", 8, 128, 512, 512, 128, 128, true},
                      BmmShape{"ragged", 2, 3, 40, 24, 72, 80, false},  // N not a multiple of 64, K of 32
                      BmmShape{"ragged", 7, 3, 40, 24, 40, 41, true},   // K < 256, odd output rows
                      BmmShape{"odd", 2, 2, 20, 16, 12, 12, false},      // N % 8 != 0: cuBLASLt
                      BmmShape{"wuk_v2l", 9, 16, 192, 128, 512, 576, false},  // above the small path
                      BmmShape{"wuv_v2l", 16, 16, 512, 512, 128, 128, true}),
    [](const auto& info) {
      return std::string(info.param.name) + "_t" + std::to_string(info.param.tokens) +
             (info.param.transpose ? "_t" : "_n") + std::to_string(info.index);
    });

// Block-FP8 per-head weights {H, N, K} (MLA's W_UK transposed per head and
// W_UV, loaded as load_mla does) against the CPU backend's product with the
// dequantized values: the streaming kernel (T <= 2) widens e4m3 * scale to
// f32, the tensor-core one to bf16 (one more 2^-9 rounding of each weight).
// Same 1e-2 bound, on weights whose 128x128 blocks differ in scale, so a
// wrong block scale or head shows.
class HeadBmmFp8 : public HeadBmmSmall {};

TEST_P(HeadBmmFp8, MatchesCpuOnDequantizedWeights) {
  if (!gpu_) return;
  const BmmShape s = GetParam();
  const int64_t T = s.tokens, H = s.heads, N = s.n, No = s.no, K = s.k;
  const auto [xc, xg] = random({T, H, s.kx}, 2.0f);
  HostFp8Weight hw = random_fp8_weight(H * N, K, rng_);
  const Tensor q = Tensor::wrap(hw.q.data(), {H * N, K}, DType::F8_E4M3, Device::CPU);
  const Tensor scale = Tensor::wrap(hw.scale.data(), {(H * N + 127) / 128, K / 128}, DType::F32, Device::CPU);
  gpu_->set_fp8_weights(true);
  Weight wg = gpu_->load_weight(q, scale);
  ASSERT_TRUE(wg.is_fp8());
  wg.w = wg.w.view({H, N, K});
  const Weight wc{q.view({H, N, K}), scale};
  const Shape out_shape{T, H, No};
  const auto [oc, og] = both(out_shape, std::vector<uint16_t>(size_t(shape_numel(out_shape)), 0x7fc0));  // NaN
  cpu_->head_bmm(xc, wc, /*transpose_w=*/true, oc);
  gpu_->head_bmm(xg, wg, /*transpose_w=*/true, og);
  const auto [err, written_outside] = compare(oc, og, N, No);
  std::printf("[rel_l2] head_bmm fp8 %-8s T=%-3lld H=%-3lld K=%-3lld N=%-3lld: %.2e\n", s.name, (long long)T,
              (long long)H, (long long)K, (long long)N, err);
  EXPECT_EQ(written_outside, 0) << "columns past N were written";
  EXPECT_LT(err, 1e-2);
  EXPECT_THROW(gpu_->head_bmm(xg, wg, /*transpose_w=*/false, og), Error);  // FP8 weights are {H, N, K} only
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, HeadBmmFp8,
    ::testing::Values(BmmShape{"wuk_v3", 1, 128, 192, 128, 512, 576, true},  // q_nope · W_UK, W_UK {H, L, Dn}
                      BmmShape{"wuv_v3", 1, 128, 512, 512, 128, 128, true},  // o_latent · W_UVᵀ
                      BmmShape{"wuk_v2l", 2, 16, 192, 128, 512, 576, true},
                      BmmShape{"k256", 2, 3, 304, 256, 256, 260, true},      // 16 lanes a row
                      BmmShape{"wuk_v2l", 3, 16, 192, 128, 512, 576, true},  // tensor cores from here
                      BmmShape{"wuv_v2l", 8, 16, 512, 512, 128, 128, true},
                      BmmShape{"wuk_v3", 9, 128, 192, 128, 512, 576, true},
                      BmmShape{"wuv_v2l", 40, 16, 512, 512, 128, 128, true},
                      BmmShape{"wuv_v3", 70, 128, 512, 512, 128, 128, true},  // two token tiles
                      BmmShape{"k256", 20, 3, 264, 256, 256, 258, true}),
    [](const auto& info) {
      return std::string(info.param.name) + "_t" + std::to_string(info.param.tokens) + "_" +
             std::to_string(info.index);
    });

}  // namespace
}  // namespace mlaserve::cuda::testing

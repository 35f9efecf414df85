// CudaBackend::mla_prepare and head_bmm into wider rows against the CPU
// backend on the same bf16 inputs, at tiny, v2-lite and v3-slice widths
// (relative L2 error reported). Outputs start as NaN, so a part that is not
// written, or written into the wrong columns or slots, fails.
//
// Bound: both backends compute from the same bf16 values in f32; the CUDA
// outputs are rounded to bf16 once (2^-9 relative), so 1e-2 is loose for a
// right answer and far below the order-1 error of a wrong column or slot.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"

namespace mlaserve::cuda::testing {
namespace {

constexpr double kTol = 1e-2;

// The same values on both backends: f32 on the CPU, bf16 on the GPU.
struct Both {
  Tensor cpu, gpu;
};

class MlaPrepareCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    MLA_SKIP_WITHOUT_GPU();
    gpu_ = std::make_unique<CudaBackend>();
  }

  Both random(Shape shape, float range = 2.0f) {
    std::vector<uint16_t> v = random_bf16(size_t(shape_numel(shape)), rng_, range);
    return from_bf16(std::move(shape), v);
  }
  Both from_bf16(Shape shape, std::vector<uint16_t>& v) {
    Tensor c = Tensor::empty(shape, DType::F32);
    for (size_t i = 0; i < v.size(); ++i) c.data<float>()[i] = bf16_to_f32(v[i]);
    return {c, gpu_->load_tensor(Tensor::wrap(v.data(), std::move(shape), DType::BF16, Device::CPU))};
  }
  Both nan(Shape shape) {
    std::vector<uint16_t> v(size_t(shape_numel(shape)), 0x7fc0);  // bf16 quiet NaN
    return from_bf16(std::move(shape), v);
  }
  Both i32(const std::vector<int32_t>& v) {
    Tensor c = Tensor::empty({int64_t(v.size())}, DType::I32);
    std::copy(v.begin(), v.end(), c.data<int32_t>());
    return {c, gpu_->load_tensor(c)};
  }
  Both inv_freq(int64_t F) {
    // DeepSeek's rope base 10000 frequencies: long positions reach large angles.
    Tensor c = Tensor::empty({F}, DType::F32);
    for (int64_t i = 0; i < F; ++i) c.data<float>()[i] = float(std::pow(10000.0, -2.0 * double(i) / double(2 * F)));
    return {c, gpu_->load_tensor(c)};
  }
  std::vector<float> gpu_floats(const Tensor& t) {
    const Tensor h = gpu_->to_host(t);
    std::vector<float> out(size_t(h.numel()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(h.data<uint16_t>()[i]);
    return out;
  }
  // rel L2 of the GPU tensor against the CPU one over the elements `keep` selects;
  // every other GPU element must still be NaN.
  template <typename Keep>
  double compare(const Both& t, Keep keep, const char* what) {
    const std::vector<float> g = gpu_floats(t.gpu);
    std::vector<float> got;
    std::vector<double> want;
    int64_t written_outside = 0;
    for (int64_t i = 0; i < t.cpu.numel(); ++i) {
      if (keep(i)) {
        got.push_back(g[size_t(i)]);
        want.push_back(t.cpu.data<float>()[i]);
      } else if (!std::isnan(g[size_t(i)])) {
        ++written_outside;
      }
    }
    EXPECT_EQ(written_outside, 0) << what << ": elements written outside the op's columns or slots";
    return rel_l2(got, want);
  }

  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  std::unique_ptr<CudaBackend> gpu_;
  std::mt19937 rng_{2024};
};

struct Shape3 {
  const char* name;
  int64_t tokens, heads, nope, rope, latent, q_lora;  // q_lora 0: V2's q_proj
};

void report(const Shape3& s, const char* part, double err) {
  std::printf("[rel_l2] mla_prepare %-9s T=%-3lld %-14s %.2e\n", s.name, (long long)s.tokens, part, err);
}

class MlaPrepareShapes : public MlaPrepareCuda, public ::testing::WithParamInterface<Shape3> {};

TEST_P(MlaPrepareShapes, MatchesCpu) {
  if (!gpu_) return;
  const Shape3 s = GetParam();
  const int64_t T = s.tokens, H = s.heads, Dn = s.nope, R = s.rope, L = s.latent, Q = s.q_lora;
  const int64_t Nq = H * (Dn + R), S = 3 * T + 5;
  const float eps = 1e-6f, cs_scale = 1.1f;
  std::vector<int32_t> pos(static_cast<size_t>(T)), slot(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    pos[size_t(t)] = int32_t(t * 977 % 33000);
    slot[size_t(t)] = int32_t((t * 7 + 3) % S);  // distinct for T < S
  }
  const Both positions = i32(pos), slots = i32(slot), freq = inv_freq(R / 2);
  const Both kv_norm = random(Shape{L}, 1.5f);
  const Both cache = nan({S, L + R});
  const std::vector<bool> slot_used = [&] {
    std::vector<bool> used(size_t(S), false);
    for (int32_t x : slot) used[size_t(x)] = true;
    return used;
  }();
  auto in_slot = [&](int64_t i) { return bool(slot_used[size_t(i / (L + R))]); };

  // Fused rows [q or q_a | c_kv | k_pe], as the fused projection writes them.
  const int64_t first = Q ? Q : Nq;
  const Both rows = random({T, first + L + R});
  Both q_a_norm, q_a_out, q;
  MlaPrepare pc, pg;
  auto both = [&](auto set) {
    set(pc, [](const Both& b) { return b.cpu; });
    set(pg, [](const Both& b) { return b.gpu; });
  };
  both([&](MlaPrepare& p, auto pick) {
    p.kv = pick(rows);
    p.kv_col = first;
    p.kv_norm = pick(kv_norm);
    p.cache = pick(cache);
    p.eps = eps;
  });
  if (Q) {
    q_a_norm = random(Shape{Q}, 1.5f);
    q_a_out = nan({T, Q});
    both([&](MlaPrepare& p, auto pick) {
      p.q_a = pick(rows);
      p.q_a_norm = pick(q_a_norm);
      p.q_a_out = pick(q_a_out);
    });
    cpu_->mla_prepare(pc, positions.cpu, slots.cpu, freq.cpu, cs_scale);
    gpu_->mla_prepare(pg, positions.gpu, slots.gpu, freq.gpu, cs_scale);
    double err = compare(q_a_out, [](int64_t) { return true; }, "q_a_out");
    report(s, "q_a norm", err);
    EXPECT_LT(err, kTol);
    pc = pg = MlaPrepare{};
    q = random({T, Nq});  // q_b_proj's output
  }

  // q split into the absorbed attention's rows: q_nope copied out, q_pe roped into q_cat[:, :, L:].
  const Both q_nope = nan({T, H, Dn}), q_cat = nan({T, H, L + R});
  both([&](MlaPrepare& p, auto pick) {
    p.q = Q ? pick(q) : pick(rows);
    p.nope_dim = Dn;
    p.q_nope_out = pick(q_nope);
    p.q_pe_out = pick(q_cat);
    p.q_pe_col = L;
  });
  cpu_->mla_prepare(pc, positions.cpu, slots.cpu, freq.cpu, cs_scale);
  gpu_->mla_prepare(pg, positions.gpu, slots.gpu, freq.gpu, cs_scale);

  double err = compare(cache, in_slot, "cache");
  report(s, "latent rows", err);
  EXPECT_LT(err, kTol);
  err = compare(q_nope, [](int64_t) { return true; }, "q_nope_out");
  report(s, "q_nope", err);
  EXPECT_EQ(err, 0.0) << "q_nope is a copy";
  err = compare(q_cat, [&](int64_t i) { return i % (L + R) >= L; }, "q_cat");
  report(s, "q_pe", err);
  EXPECT_LT(err, kTol);

  // q_nope · W_UK into q_cat's first L columns, against the CPU's product on its own q_cat.
  const Both w_uk = random({H, Dn, L}, 0.1f);
  cpu_->head_bmm(q_nope.cpu, Weight{w_uk.cpu, {}}, false, q_cat.cpu);
  gpu_->head_bmm(q_nope.gpu, Weight{w_uk.gpu, {}}, false, q_cat.gpu);
  err = compare(q_cat, [](int64_t) { return true; }, "q_cat after W_UK");
  report(s, "q_cat", err);
  EXPECT_LT(err, kTol);
}

INSTANTIATE_TEST_SUITE_P(Widths, MlaPrepareShapes,
                         ::testing::Values(Shape3{"tiny-v2", 5, 4, 16, 16, 32, 0},
                                           Shape3{"tiny", 5, 4, 16, 16, 32, 48},
                                           Shape3{"v2-lite", 1, 16, 128, 64, 512, 0},
                                           Shape3{"v2-lite", 64, 16, 128, 64, 512, 0},
                                           Shape3{"v3-slice", 4, 128, 128, 64, 512, 1536}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.name) + "_t" + std::to_string(info.param.tokens);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST_F(MlaPrepareCuda, InPlaceRopeLeavesQNopeAlone) {
  if (!gpu_) return;
  const int64_t T = 3, H = 2, Dn = 16, R = 64;
  const Both positions = i32({0, 5, 4095}), freq = inv_freq(R / 2), q = random({T, H * (Dn + R)});
  const std::vector<float> before = gpu_floats(q.gpu);
  MlaPrepare pc, pg;
  pc.q = q.cpu;
  pg.q = q.gpu;
  pc.q_pe_out = q.cpu.view({T, H, Dn + R});
  pg.q_pe_out = q.gpu.view({T, H, Dn + R});
  pc.nope_dim = pg.nope_dim = Dn;
  pc.q_pe_col = pg.q_pe_col = Dn;
  cpu_->mla_prepare(pc, positions.cpu, Tensor(), freq.cpu, 1.0f);
  gpu_->mla_prepare(pg, positions.gpu, Tensor(), freq.gpu, 1.0f);
  const std::vector<float> after = gpu_floats(q.gpu);
  std::vector<float> got;
  std::vector<double> want;
  for (int64_t i = 0; i < q.cpu.numel(); ++i) {
    if (i % (Dn + R) < Dn) {
      EXPECT_EQ(after[size_t(i)], before[size_t(i)]) << "q_nope element " << i << " changed";
    } else {
      got.push_back(after[size_t(i)]);
      want.push_back(q.cpu.data<float>()[i]);
    }
  }
  const double err = rel_l2(got, want);
  std::printf("[rel_l2] mla_prepare in-place q_pe %.2e\n", err);
  EXPECT_LT(err, kTol);
}

}  // namespace
}  // namespace mlaserve::cuda::testing

// The one-kernel absorbed MLA of a one-token decode step (mla_decode_chain.h)
// at V2-Lite widths: against the op-by-op CUDA path and the f32 CPU
// reference on random weights and contexts from 1 row to many splits of
// several tiles, and inside a model, eager and replayed from a CUDA graph.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "../model/model_fixture.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_graph_runner.h"
#include "kernels/cuda/mla_decode_chain.h"
#include "model/mla_attention.h"
#include "model/yarn_rope.h"

namespace mlaserve::cuda::testing {
namespace {

// Both CUDA paths round the same intermediates to bf16 and differ in
// summation order only: measured ~1e-3. Against the f32 reference the bf16
// intermediates give a few 1e-3.
constexpr double kChainVsOps = 1e-2;
constexpr double kChainVsCpu = 2e-2;
// Through two layers of random weights the rounding differences grow
// (measured 9e-3 .. 1.1e-2 on the H200); model_cuda_test's bound for close rows.
constexpr double kModelChainVsOps = 3e-2;

ModelConfig v2_lite() { return mlaserve::testing::TempCheckpoint::config_of("v2-lite", "bf16"); }

// A host tensor of bf16-representable values in the dtype a backend takes.
struct HostValues {
  Shape shape;
  std::vector<float> v;
  Tensor as(DType dtype) const {
    Tensor t = Tensor::empty(shape, dtype);
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::F32) t.data<float>()[i] = v[i];
      else t.data<uint16_t>()[i] = f32_to_bf16(v[i]);
    }
    return t;
  }
};

HostValues random_values(Shape shape, std::mt19937& rng, float lo, float hi) {
  HostValues h{shape, std::vector<float>(size_t(shape_numel(shape)))};
  std::uniform_real_distribution<float> dist(lo, hi);
  for (auto& x : h.v) x = bf16_to_f32(f32_to_bf16(dist(rng)));
  return h;
}

struct RandomMla {
  HostValues qkv, kv_norm, w_uk, w_uv, o_proj;
  explicit RandomMla(const ModelConfig& c, std::mt19937& rng) {
    const int64_t D = c.hidden_size, H = c.num_attention_heads, Dn = c.qk_nope_head_dim, R = c.qk_rope_head_dim;
    const int64_t L = c.kv_lora_rank, Dv = c.v_head_dim;
    auto scaled = [&](Shape s, int64_t fan_in) {
      const float a = 1.7f / std::sqrt(float(fan_in));
      return random_values(s, rng, -a, a);
    };
    qkv = scaled({H * (Dn + R) + L + R, D}, D);
    kv_norm = random_values({L}, rng, 0.5f, 1.5f);
    w_uk = scaled({H, Dn, L}, Dn);
    w_uv = scaled({H, Dv, L}, L);
    o_proj = scaled({D, H * Dv}, H * Dv);
  }
  MlaWeights on(Backend& be) const {
    MlaWeights w;
    w.fused_qkv_a_proj = be.load_weight(qkv.as(DType::F32), Tensor());
    w.kv_a_layernorm = be.load_tensor(kv_norm.as(be.act_dtype()));
    w.w_uk = Weight{be.load_tensor(w_uk.as(be.act_dtype())), {}};
    w.w_uv = Weight{be.load_tensor(w_uv.as(be.act_dtype())), {}};
    w.o_proj = be.load_weight(o_proj.as(DType::F32), Tensor());
    return w;
  }
};

MlaContext context_on(Backend& be, const ModelConfig& c) {
  const RopeTable rope = make_rope_table(c);
  Tensor inv_freq = Tensor::empty({int64_t(rope.inv_freq.size())}, DType::F32);
  std::copy(rope.inv_freq.begin(), rope.inv_freq.end(), inv_freq.data<float>());
  MlaContext ctx;
  ctx.config = &c;
  ctx.inv_freq = be.load_tensor(inv_freq);
  ctx.cos_sin_scale = rope.cos_sin_scale;
  ctx.softmax_scale = attention_softmax_scale(c);
  return ctx;
}

// One decode token attending to kv_len rows spread over a larger pool.
ForwardBatch decode_batch(int kv_len, int pool, std::mt19937& rng) {
  std::vector<int32_t> slots(static_cast<size_t>(pool));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  ForwardBatch b;
  b.input_ids = {0};
  b.positions = {kv_len - 1};
  b.kv_slots.assign(slots.begin(), slots.begin() + kv_len);
  b.out_slots = {b.kv_slots.back()};
  b.q_indptr = {0, 1};
  b.kv_indptr = {0, kv_len};
  b.logit_rows = {0};
  return b;
}

std::vector<float> host_floats(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  if (h.dtype() == DType::F32) return {h.data<float>(), h.data<float>() + h.numel()};
  std::vector<float> f(size_t(h.numel()));
  for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(h.data<uint16_t>()[i]);
  return f;
}

double rel_l2_of(const std::vector<float>& a, const std::vector<float>& ref) {
  std::vector<double> r(ref.begin(), ref.end());
  return rel_l2(a, r);
}

// Whether the chain kernel runs on this GPU at c's widths.
bool chain_runs(const ModelConfig& c, const CudaBackend& gpu) {
  const MlaDecodeChainShape shape{c.hidden_size, c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
                                  c.kv_lora_rank, c.v_head_dim};
  return mla_decode_chain_applies(shape, gpu.sm_count());
}

// The suite's preamble: a CUDA backend on a GPU where the chain kernel runs
// at V2-Lite's widths (every test skips elsewhere).
class MlaDecodeChain : public ::testing::Test {
 protected:
  void SetUp() override {
    MLA_SKIP_WITHOUT_GPU();
    backend_ = make_cuda_backend(0);
    ASSERT_TRUE(backend_);
    gpu_ = &dynamic_cast<CudaBackend&>(*backend_);
    if (!chain_runs(v2_lite(), *gpu_)) GTEST_SKIP() << "the chain kernel needs a Hopper GPU";
  }
  std::unique_ptr<Backend> backend_;
  CudaBackend* gpu_ = nullptr;
};

TEST_F(MlaDecodeChain, MatchesTheOpByOpPathAndTheCpuReference) {
  const ModelConfig c = v2_lite();
  CudaBackend& gpu = *gpu_;
  auto cpu = make_cpu_backend();
  std::mt19937 rng(11);
  const RandomMla weights(c, rng);
  const MlaWeights w_gpu = weights.on(gpu), w_cpu = weights.on(*cpu);
  const MlaContext ctx_gpu = context_on(gpu, c), ctx_cpu = context_on(*cpu, c);
  const int64_t D = c.hidden_size, row = c.kv_lora_rank + c.qk_rope_head_dim;

  // 1 row; one partial tile; two splits; the bench's 640; tens of splits of
  // one tile; splits of three tiles with a ragged last one.
  for (int kv_len : {1, 31, 33, 640, 4100, 9000}) {
    SCOPED_TRACE(kv_len);
    const int pool = kv_len + 29;
    const ForwardBatch fb = decode_batch(kv_len, pool, rng);
    const HostValues h = random_values({1, D}, rng, -2.0f, 2.0f);
    const HostValues cache = random_values({pool, row}, rng, -2.0f, 2.0f);

    // Op by op and as one kernel, each on its own copy of the cache.
    const DeviceBatch db = gpu.prepare_batch(fb);
    Tensor h_gpu = gpu.load_tensor(h.as(DType::BF16));
    Tensor cache_ops = gpu.load_tensor(cache.as(DType::BF16)), cache_chain = gpu.load_tensor(cache.as(DType::BF16));
    Tensor out_ops = gpu.alloc({1, D}, DType::BF16), out_chain = gpu.alloc({1, D}, DType::BF16);
    gpu.set_mla_chain(false);
    mla_attention(gpu, ctx_gpu, w_gpu, h_gpu, db, MlaBatchPlan::whole(true), cache_ops, out_ops);
    gpu.set_mla_chain(true);
    const auto chain = decode_chain(ctx_gpu, w_gpu, h_gpu, cache_chain);
    ASSERT_TRUE(chain && gpu.mla_decode_chain(*chain, db, out_chain));

    const DeviceBatch db_cpu = cpu->prepare_batch(fb);
    Tensor cache_cpu = cpu->load_tensor(cache.as(DType::F32)), out_cpu = cpu->alloc({1, D}, DType::F32);
    mla_attention(*cpu, ctx_cpu, w_cpu, cpu->load_tensor(h.as(DType::F32)), db_cpu, MlaBatchPlan::whole(true), cache_cpu, out_cpu);

    const auto chain_out = host_floats(gpu, out_chain), ops_out = host_floats(gpu, out_ops);
    const auto ref_out = host_floats(*cpu, out_cpu);
    const int64_t slot = fb.out_slots[0];
    auto latent_row = [&](Backend& be, const Tensor& t) {
      const auto all = host_floats(be, t);
      return std::vector<float>(all.begin() + slot * row, all.begin() + (slot + 1) * row);
    };
    const double vs_ops = rel_l2_of(chain_out, ops_out), vs_cpu = rel_l2_of(chain_out, ref_out);
    const double ops_vs_cpu = rel_l2_of(ops_out, ref_out);
    const double row_vs_ops = rel_l2_of(latent_row(gpu, cache_chain), latent_row(gpu, cache_ops));
    const double row_vs_cpu = rel_l2_of(latent_row(gpu, cache_chain), latent_row(*cpu, cache_cpu));
    std::printf("[mla-chain] kv_len %5d: out rel_l2 vs ops %.2e, vs cpu %.2e (ops vs cpu %.2e); "
                "latent row vs ops %.2e, vs cpu %.2e\n",
                kv_len, vs_ops, vs_cpu, ops_vs_cpu, row_vs_ops, row_vs_cpu);
    EXPECT_LT(vs_ops, kChainVsOps);
    EXPECT_LT(vs_cpu, kChainVsCpu);
    EXPECT_LT(row_vs_ops, kChainVsOps);
    EXPECT_LT(row_vs_cpu, kChainVsCpu);
  }
}

// With the block's input norm folded in (ResidualNorm): the kernel forms
// h from the residual stream and the previous block's output itself (or,
// in the first block, from the embeddings alone: no residual). Against
// rms_norm (with the residual) and the op-by-op attention: the same output
// up to summation order, and the same residual stream bit for bit (both
// round residual + x to bf16 once).
TEST_F(MlaDecodeChain, NormHeadMatchesRmsNormThenTheOps) {
  const ModelConfig c = v2_lite();
  CudaBackend& gpu = *gpu_;
  std::mt19937 rng(31);
  const RandomMla weights(c, rng);
  const MlaWeights w_gpu = weights.on(gpu);
  const MlaContext ctx = context_on(gpu, c);
  const int64_t D = c.hidden_size, row = c.kv_lora_rank + c.qk_rope_head_dim;
  const HostValues norm_w = random_values({D}, rng, 0.5f, 1.5f);
  const Tensor gn = gpu.load_tensor(norm_w.as(DType::BF16));
  constexpr float kEps = 1e-6f;

  for (bool with_residual : {true, false}) {
    for (int kv_len : {1, 640}) {
      SCOPED_TRACE(::testing::Message() << "kv_len " << kv_len << ", residual " << with_residual);
      const ForwardBatch fb = decode_batch(kv_len, kv_len + 3, rng);
      const DeviceBatch db = gpu.prepare_batch(fb);
      const HostValues x = random_values({1, D}, rng, -2.0f, 2.0f);
      const HostValues residual = random_values({1, D}, rng, -3.0f, 3.0f);
      const HostValues cache = random_values({kv_len + 3, row}, rng, -2.0f, 2.0f);
      const Tensor x_gpu = gpu.load_tensor(x.as(DType::BF16));
      auto residual_on_gpu = [&] { return with_residual ? gpu.load_tensor(residual.as(DType::BF16)) : Tensor(); };

      gpu.set_mla_chain(false);
      Tensor ops_h = gpu.alloc({1, D}, DType::BF16), ops_out = gpu.alloc({1, D}, DType::BF16);
      Tensor ops_residual = residual_on_gpu();
      gpu.rms_norm(x_gpu, gn, kEps, ops_h, ops_residual);
      mla_attention(gpu, ctx, w_gpu, ops_h, db, MlaBatchPlan::whole(true), gpu.load_tensor(cache.as(DType::BF16)),
                    ops_out);

      gpu.set_mla_chain(true);
      const ResidualNorm head{x_gpu, residual_on_gpu(), gn, kEps};
      Tensor chain_h = gpu.alloc({1, D}, DType::BF16), chain_out = gpu.alloc({1, D}, DType::BF16);
      auto chain = decode_chain(ctx, w_gpu, chain_h, gpu.load_tensor(cache.as(DType::BF16)));
      ASSERT_TRUE(chain);
      chain->norm_head = &head;
      ASSERT_TRUE(gpu.mla_decode_chain(*chain, db, chain_out));

      const double out_err = rel_l2_of(host_floats(gpu, chain_out), host_floats(gpu, ops_out));
      std::printf("[mla-chain] norm head, kv_len %d, residual %d: out rel_l2 vs rms_norm + ops %.2e\n", kv_len,
                  int(with_residual), out_err);
      EXPECT_LT(out_err, kChainVsOps);
      if (with_residual) EXPECT_EQ(host_floats(gpu, head.residual), host_floats(gpu, ops_residual));
      EXPECT_EQ(host_floats(gpu, x_gpu), x.v) << "x is the chain's input only";
    }
  }
}

// The router logits through the fold (mla_decode_chain_router_fold) skip
// three bf16 roundings of the op-by-op path (out, residual + out, the normed
// row), each within 2^-9 relative of its value: a few 1e-3 relative.
constexpr double kFoldedLogitsVsCpu = 1e-2;

// The fold against a host triple product in f64 on random V2-Lite-width
// weights (every product of bf16 values is exact in f32, so only the f32
// sums round): rows of the first, a middle and the last expert.
TEST_F(MlaDecodeChain, RouterFoldIsTheRouterThroughTheNormAndOProj) {
  const ModelConfig c = v2_lite();
  CudaBackend& gpu = *gpu_;
  const int E = c.n_routed_experts;
  const int64_t D = c.hidden_size, K = int64_t(c.num_attention_heads) * c.v_head_dim;
  if (!mla_decode_chain_takes_fold(int(D), int(K), E, gpu.sm_count())) GTEST_SKIP() << "no fold on this GPU";
  std::mt19937 rng(41);
  const HostValues router = random_values({E, D}, rng, -0.05f, 0.05f);
  const HostValues norm_w = random_values({D}, rng, 0.5f, 1.5f);
  const HostValues o_proj = random_values({D, K}, rng, -0.03f, 0.03f);
  const Tensor fold = gpu.mla_chain_router_fold(gpu.load_weight(router.as(DType::F32), Tensor()),
                                                gpu.load_tensor(norm_w.as(DType::BF16)),
                                                gpu.load_weight(o_proj.as(DType::F32), Tensor()));
  ASSERT_TRUE(fold.defined());
  ASSERT_EQ(fold.shape(), Shape({E, K}));
  const auto got = host_floats(gpu, fold);
  for (int e : {0, E / 2, E - 1}) {
    std::vector<double> want(size_t(K), 0.0);
    for (int64_t i = 0; i < D; ++i) {
      const double rg = double(router.v[size_t(e * D + i)]) * norm_w.v[size_t(i)];
      for (int64_t k = 0; k < K; ++k) want[size_t(k)] += rg * o_proj.v[size_t(i * K + k)];
    }
    const std::vector<float> row(got.begin() + e * K, got.begin() + (e + 1) * K);
    const double err = rel_l2(row, want);
    std::printf("[mla-chain] router fold, expert %d: rel_l2 vs f64 %.2e\n", e, err);
    EXPECT_LT(err, 1e-5);
  }
}

// With the MoE layer's start folded in (MlaChainMoeTail), its norm left
// pending and completed by finish_pending_norm (as moe_route_experts would):
// the residual and the normed row against the op-by-op path (attention,
// rms_norm), and the router logits against the CPU backend's on that normed
// row, within the fold's rounding (kFoldedLogitsVsCpu).
TEST_F(MlaDecodeChain, MoeTailMatchesTheNormAndTheRouterLogits) {
  const ModelConfig c = v2_lite();
  CudaBackend& gpu = *gpu_;
  const int E = c.n_routed_experts;
  if (!mla_decode_chain_routes(E, gpu.sm_count())) GTEST_SKIP() << "fewer SMs than routed experts";
  auto cpu = make_cpu_backend();
  std::mt19937 rng(23);
  const RandomMla weights(c, rng);
  const MlaWeights w_gpu = weights.on(gpu);
  const MlaContext ctx = context_on(gpu, c);
  const int64_t D = c.hidden_size, row = c.kv_lora_rank + c.qk_rope_head_dim;
  const HostValues router = random_values({E, D}, rng, -0.05f, 0.05f);
  const HostValues norm_w = random_values({D}, rng, 0.5f, 1.5f);
  const Weight router_gpu = gpu.load_weight(router.as(DType::F32), Tensor());
  const Weight router_cpu = cpu->load_weight(router.as(DType::F32), Tensor());

  for (int kv_len : {7, 640}) {
    SCOPED_TRACE(kv_len);
    const ForwardBatch fb = decode_batch(kv_len, kv_len + 5, rng);
    const DeviceBatch db = gpu.prepare_batch(fb);
    const HostValues h = random_values({1, D}, rng, -2.0f, 2.0f);
    const HostValues cache = random_values({kv_len + 5, row}, rng, -2.0f, 2.0f);
    const HostValues residual = random_values({1, D}, rng, -1.0f, 1.0f);
    Tensor h_gpu = gpu.load_tensor(h.as(DType::BF16)), gn = gpu.load_tensor(norm_w.as(DType::BF16));

    // Op by op: attention, then rms_norm with the residual.
    gpu.set_mla_chain(false);
    Tensor ops_out = gpu.alloc({1, D}, DType::BF16), ops_normed = gpu.alloc({1, D}, DType::BF16);
    Tensor ops_residual = gpu.load_tensor(residual.as(DType::BF16));
    mla_attention(gpu, ctx, w_gpu, h_gpu, db, MlaBatchPlan::whole(true), gpu.load_tensor(cache.as(DType::BF16)), ops_out);
    gpu.rms_norm(ops_out, gn, 1e-6f, ops_normed, ops_residual);

    // One kernel with the tail.
    gpu.set_mla_chain(true);
    MlaChainMoeTail tail;
    tail.norm_weight = gn;
    tail.residual = gpu.load_tensor(residual.as(DType::BF16));
    tail.normed = gpu.alloc({1, D}, DType::BF16);
    tail.router = &router_gpu;
    tail.logits = gpu.alloc({1, E}, DType::F32);
    tail.router_fold = gpu.mla_chain_router_fold(router_gpu, gn, w_gpu.o_proj);
    ASSERT_TRUE(tail.router_fold.defined());
    PendingNorm pending;
    tail.pending = &pending;
    Tensor chain_out = gpu.alloc({1, D}, DType::BF16);
    ASSERT_TRUE(mla_attention(gpu, ctx, w_gpu, h_gpu, db, MlaBatchPlan::whole(true), gpu.load_tensor(cache.as(DType::BF16)), chain_out,
                              &tail));
    ASSERT_TRUE(pending.parts.defined());
    gpu.finish_pending_norm(pending, tail.normed, tail.logits);

    const auto normed = host_floats(gpu, tail.normed);
    const double residual_err = rel_l2_of(host_floats(gpu, tail.residual), host_floats(gpu, ops_residual));
    const double normed_err = rel_l2_of(normed, host_floats(gpu, ops_normed));

    // The CPU router on the kernel's normed row.
    Tensor normed_cpu = Tensor::empty({1, D}, DType::F32);
    std::copy(normed.begin(), normed.end(), normed_cpu.data<float>());
    Tensor logits_cpu = cpu->alloc({1, E}, DType::F32);
    cpu->linear_f32_out(cpu->load_tensor(normed_cpu), router_cpu, logits_cpu);
    const auto logits = host_floats(gpu, tail.logits);
    const float* want = logits_cpu.data<float>();
    const double logits_err = rel_l2_of(logits, std::vector<float>(want, want + E));
    std::printf("[mla-chain] moe tail, kv_len %d: residual rel_l2 vs ops %.2e, normed %.2e, logits vs cpu %.2e\n",
                kv_len, residual_err, normed_err, logits_err);
    EXPECT_LT(residual_err, kChainVsOps);
    EXPECT_LT(normed_err, kChainVsOps);
    EXPECT_LT(logits_err, kFoldedLogitsVsCpu);
  }
}

// Inside a two-layer V2-Lite-width model (a dense and a MoE layer, small
// experts and vocabulary):
// decode steps as one kernel (with the MoE layer's start in the second),
// eager and replayed from a graph captured at a shorter context, against
// the op-by-op steps.
TEST_F(MlaDecodeChain, ModelStepsEagerAndReplayedMatchTheOpByOpSteps) {
  ModelConfig c = v2_lite();
  c.num_hidden_layers = 2;
  c.first_k_dense_replace = 1;
  c.intermediate_size = 1024;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 256;
  c.vocab_size = 512;
  c.num_nextn_predict_layers = 0;
  mlaserve::testing::TempCheckpoint ckpt(c, "v2_lite_width_two_layers", 9);
  Backend* backend = backend_.get();
  CudaBackend& gpu = *gpu_;
  DeepseekModel model(ckpt.get(), *backend, {MlaMode::Auto, false});
  constexpr int kPrompt = 200, kSteps = 4, kSlots = 256;
  auto ops_cache = allocate_kv_cache(*backend, model.config(), kSlots);
  auto eager_cache = allocate_kv_cache(*backend, model.config(), kSlots);
  auto graph_cache = allocate_kv_cache(*backend, model.config(), kSlots);
  std::vector<int32_t> prompt(kPrompt);
  for (int i = 0; i < kPrompt; ++i) prompt[size_t(i)] = (i * 37 + 5) % c.vocab_size;
  const ForwardBatch prefill = contiguous_sequence_batch(prompt, 0, false);
  for (auto* cache : {&ops_cache, &eager_cache}) model.forward(prefill, *cache);
  const auto first = mlaserve::testing::to_logits(*backend, model.forward(prefill, graph_cache));

  DecodeGraphOptions opt;
  opt.batch_sizes = {1};
  opt.max_kv_len = kPrompt + kSteps;
  opt.scratch_slot = kSlots - 1;
  auto runner = make_decode_graph_runner(*backend, opt, [&](const ForwardBatch& b) {
    return model.forward(b, graph_cache);
  });
  ASSERT_TRUE(runner);

  int32_t token = mlaserve::testing::argmax(first.row(0));
  for (int step = 0; step < kSteps; ++step) {
    const ForwardBatch b = contiguous_sequence_batch({&token, 1}, kPrompt + step, false);
    gpu.set_mla_chain(false);
    const auto ops = mlaserve::testing::to_logits(*backend, model.forward(b, ops_cache));
    gpu.set_mla_chain(true);
    const auto eager = mlaserve::testing::to_logits(*backend, model.forward(b, eager_cache));
    ASSERT_TRUE(runner->can_replay(b));
    const auto graph = mlaserve::testing::to_logits(*backend, runner->replay(b));
    const double eager_vs_ops = mlaserve::testing::row_rel_l2(eager.row(0), ops.row(0));
    const double graph_vs_eager = mlaserve::testing::row_rel_l2(graph.row(0), eager.row(0));
    std::printf("[mla-chain] model step %d: logits rel_l2 chain vs ops %.2e, graph vs eager chain %.2e\n", step,
                eager_vs_ops, graph_vs_eager);
    EXPECT_LT(eager_vs_ops, kModelChainVsOps);
    EXPECT_LT(graph_vs_eager, 1e-6) << "the same kernels on the same inputs";
    token = mlaserve::testing::argmax(ops.row(0));
  }
}

}  // namespace
}  // namespace mlaserve::cuda::testing

// Kernel benchmarks for the CUDA backend at v2-lite widths (hidden 2048,
// 16 heads, latent 512 + 64, 64 experts of 1408, top-6), each timed with
// CUDA events (median of the benchmark's repetitions) and reported against
// the ceilings measured in the same run: device-to-device copy bandwidth
// and a large cuBLASLt bf16 GEMM.
//
// Counters: GB_s (bytes that must move / time), frac_copy (of the measured
// copy bandwidth), TFLOP_s, frac_gemm (of the measured bf16 GEMM rate).
// Random inputs everywhere (METHOD.md: never time zeros); MoE routing is
// uniform random, the balanced case.
#include <benchmark/benchmark.h>

#ifdef MLASERVE_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fp8_kv_cache.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/head_bmm_small.h"
#include "kernels/cuda/mla_absorbed.h"
#include "kernels/cuda/mla_expanded.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/moe_select.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_gemm.h"

namespace mlaserve::cuda {
namespace {

using bench::run_timed;
using bench::upload;

constexpr int kHidden = 2048, kHeads = 16, kLatent = 512, kRope = 64, kExperts = 64, kInter = 1408, kTopK = 6;

DeviceBuffer random_bf16(size_t n, uint32_t seed) {
  DeviceBuffer b(n * 2);
  fill_random_bf16(b.get<__nv_bfloat16>(), n, seed, nullptr);
  return b;
}

double g_copy_gbs = 0, g_gemm_tflops = 0;  // ceilings, measured first

// Rates from the median iteration, and their fractions of the ceilings.
void report(benchmark::State& state, double seconds, double bytes, double flops) {
  if (seconds <= 0) return;
  state.counters["median_us"] = seconds * 1e6;
  if (bytes > 0) {
    state.counters["GB_s"] = bytes / seconds / 1e9;
    if (g_copy_gbs > 0) state.counters["frac_copy"] = bytes / seconds / 1e9 / g_copy_gbs;
  }
  if (flops > 0) {
    state.counters["TFLOP_s"] = flops / seconds / 1e12;
    if (g_gemm_tflops > 0) state.counters["frac_gemm"] = flops / seconds / 1e12 / g_gemm_tflops;
  }
}

// ---- ceilings -------------------------------------------------------------

void BM_CopyBandwidth(benchmark::State& state) {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer a(bytes), b(bytes);
  MLA_CUDA_CHECK(cudaMemset(a.get(), 1, bytes), "bench");
  const double s = run_timed(state, [&] { cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice); });
  report(state, s, 2.0 * bytes, 0);  // read + write
  g_copy_gbs = 2.0 * bytes / s / 1e9;
}

void BM_GemmBf16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto x = random_bf16(m * k, 1), w = random_bf16(n * k, 2);
  DeviceBuffer out(m * n * 2);
  CublasLtGemm gemm;
  const double s = run_timed(state, [&] {
    gemm.linear(x.get<__nv_bfloat16>(), w.get<__nv_bfloat16>(), m, n, k, out.get(), false, nullptr);
  });
  report(state, s, double(m * k + n * k + m * n) * 2, 2.0 * m * n * k);
  if (m == 8192 && n == 8192 && k == 8192) g_gemm_tflops = 2.0 * m * n * k / s / 1e12;
}

// Decode-sized products: the skinny weight-streaming kernel vs cuBLASLt
// (args m, n, k, mode: 0 skinny, 1 skinny in a graph, 2 cuBLASLt, 3 cuBLASLt
// in a graph). The weights rotate over copies that together exceed L2, as a
// decode step's layers do; the graph mode times kGraphLaunches back-to-back
// launches in one captured graph (what the model replays) and reports one.
void BM_SkinnyGemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int mode = int(state.range(3));
  const bool skinny = mode < 2, graph = mode % 2 == 1;
  const int64_t copies = std::max<int64_t>(2, (int64_t(256) << 20) / (n * k * 2));
  auto x = random_bf16(m * k, 1);
  std::vector<DeviceBuffer> w;
  for (int64_t i = 0; i < copies; ++i) w.push_back(random_bf16(n * k, uint32_t(2 + i)));
  DeviceBuffer out(m * n * 2);
  CublasLtGemm gemm;
  cudaStream_t stream;
  MLA_CUDA_CHECK(cudaStreamCreate(&stream), "bench stream");
  size_t next = 0;
  auto one = [&] {
    const auto* wi = w[next].get<__nv_bfloat16>();
    next = (next + 1) % w.size();
    if (skinny) skinny_gemm(x.get<__nv_bfloat16>(), wi, m, n, k, out.get(), false, stream);
    else gemm.linear(x.get<__nv_bfloat16>(), wi, m, n, k, out.get(), false, stream);
  };
  constexpr int kGraphLaunches = 20;
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    one();  // plans and attributes outside the capture
    MLA_CUDA_CHECK(cudaStreamSynchronize(stream), "bench warm-up");
    cudaGraph_t g;
    MLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "bench capture");
    for (int i = 0; i < kGraphLaunches; ++i) one();
    MLA_CUDA_CHECK(cudaStreamEndCapture(stream, &g), "bench capture");
    MLA_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0), "bench graph");
    cudaGraphDestroy(g);
  }
  // The stream is a blocking one: run_timed's events on the legacy default
  // stream order around it.
  const double s = graph ? run_timed(state, [&] { cudaGraphLaunch(exec, stream); }) / kGraphLaunches
                         : run_timed(state, one);
  if (exec) cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
  state.SetLabel(std::string(skinny ? "skinny" : "cublaslt") + (graph ? " graph" : " eager"));
  report(state, s, double(m * k + n * k + m * n) * 2, 2.0 * m * n * k);
}

// ---- MLA --------------------------------------------------------------------

// Absorbed MLA's per-head products at decode sizes: the weight-streaming
// kernel (small = 1) vs cuBLASLt's batched GEMM (small = 0). Args: tokens,
// transposed (0: q_nope · W_UK {H, Dn, L} into q{L + R} rows; 1: o_latent ·
// W_UVᵀ {H, Dv, L}), small. 32 weight copies (64 MB) are cycled so each
// iteration reads its 2 MB from HBM, not L2, as a decode step's layers do.
void BM_HeadBmm(benchmark::State& state) {
  const int64_t T = state.range(0), H = kHeads, Dn = 128;
  const bool transpose = state.range(1) != 0, small = state.range(2) != 0;
  const int64_t K = transpose ? kLatent : Dn, N = transpose ? Dn : kLatent;
  const int64_t Kx = transpose ? kLatent : Dn + kRope, No = transpose ? Dn : kLatent + kRope;
  constexpr int kCopies = 32;
  auto x = random_bf16(T * H * Kx, 1), w = random_bf16(kCopies * H * K * N, 2);
  DeviceBuffer out(T * H * No * 2);
  CublasLtGemm gemm;
  int copy = 0;
  const double s = run_timed(state, [&] {
    const __nv_bfloat16* wc = w.get<__nv_bfloat16>() + (copy++ % kCopies) * H * K * N;
    if (small)
      head_bmm_small(x.get<__nv_bfloat16>(), wc, transpose, T, H, Kx, K, N, out.get<__nv_bfloat16>(), No, nullptr);
    else
      gemm.head_bmm(x.get<__nv_bfloat16>(), wc, transpose, T, H, Kx, K, N, out.get<__nv_bfloat16>(), No, nullptr);
  });
  report(state, s, double(H * K * N + T * H * (K + N)) * 2, 2.0 * T * H * K * N);
}


// Args: batch, context, splits (0: the launcher's), heads, kernel (-1 the
// launcher's, 0 16-head blocks, 1 64-head wgmma blocks).
void BM_MlaDecode(benchmark::State& state) {
  const int B = int(state.range(0)), ctx = int(state.range(1)), D = kLatent + kRope, heads = int(state.range(3));
  const int wide = int(state.range(4));
  if (wide == 1 && !mla_absorbed_uses_wide_blocks(heads, kLatent, kRope)) {
    state.SkipWithError("the 64-head wgmma kernel needs a Hopper GPU and heads a multiple of 64");
    return;
  }
  const size_t slots = size_t(B) * ctx;
  auto cache = random_bf16(slots * D, 3), q = random_bf16(size_t(B) * heads * D, 4);
  std::vector<int32_t> q_indptr(B + 1), kv_indptr(B + 1), kv_slots(slots);
  for (int b = 0; b <= B; ++b) {
    q_indptr[b] = b;
    kv_indptr[b] = b * ctx;
  }
  std::iota(kv_slots.begin(), kv_slots.end(), 0);  // pages laid out in order
  auto dq_indptr = upload(q_indptr), dkv_indptr = upload(kv_indptr), dslots = upload(kv_slots);
  DeviceBuffer out(size_t(B) * heads * kLatent * 2);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  MlaAbsorbedParams p;
  p.q = q.get<__nv_bfloat16>();
  p.cache = cache.get<__nv_bfloat16>();
  p.q_indptr = dq_indptr.get<int32_t>();
  p.kv_indptr = dkv_indptr.get<int32_t>();
  p.kv_slots = dslots.get<int32_t>();
  p.num_seqs = B;
  p.num_tokens = B;
  p.num_heads = heads;
  p.latent_dim = kLatent;
  p.rope_dim = kRope;
  p.scale = 0.1f;
  p.out = out.get<__nv_bfloat16>();
  const bool wide_blocks = wide < 0 ? mla_absorbed_uses_wide_blocks(heads, kLatent, kRope) : wide != 0;
  p.wide_blocks = wide;
  p.num_splits = state.range(2) ? int(state.range(2)) : mla_absorbed_num_splits(B, heads, sms, ctx, wide_blocks);
  DeviceBuffer work(mla_absorbed_workspace_bytes(B, heads, kLatent, p.num_splits));
  if (p.num_splits > 1) {
    p.partial_out = work.get<float>();
    p.partial_lse = p.partial_out + size_t(p.num_splits) * B * heads * kLatent;
  }
  const double s = run_timed(state, [&] { mla_attention_absorbed(p, nullptr); });
  const double bytes = double(slots) * D * 2 + double(slots) * 4 + double(B) * heads * (D + kLatent) * 2;
  const double flops = 2.0 * B * heads * double(ctx) * (D + kLatent);
  report(state, s, bytes, flops);
  state.counters["splits"] = p.num_splits;
}

// The same decode over an FP8 latent cache (--kv-cache-dtype fp8_e4m3):
// bytes count the 656-byte slots actually read.
// Args: batch, context, heads, kernel (as BM_MlaDecode).
void BM_MlaDecodeFp8Cache(benchmark::State& state) {
  const int B = int(state.range(0)), ctx = int(state.range(1)), D = kLatent + kRope, heads = int(state.range(2));
  const int wide = int(state.range(3));
  if (wide == 1 && !mla_absorbed_uses_wide_blocks(heads, kLatent, kRope)) {
    state.SkipWithError("the 64-head wgmma kernel needs a Hopper GPU and heads a multiple of 64");
    return;
  }
  const Fp8KvLayout layout{kLatent, kRope};
  const size_t slots = size_t(B) * ctx;
  std::vector<int32_t> q_indptr(B + 1), kv_indptr(B + 1), kv_slots(slots);
  for (int b = 0; b <= B; ++b) {
    q_indptr[b] = b;
    kv_indptr[b] = b * ctx;
  }
  std::iota(kv_slots.begin(), kv_slots.end(), 0);
  auto dq_indptr = upload(q_indptr), dkv_indptr = upload(kv_indptr), dslots = upload(kv_slots);
  DeviceBuffer cache(slots * layout.slot_bytes());
  {  // rows quantized in chunks (a bf16 copy of the whole cache would double its memory)
    constexpr size_t kChunk = 1 << 16;
    auto rows = random_bf16(kChunk * D, 3);
    for (size_t s0 = 0; s0 < slots; s0 += kChunk)
      fp8_kv_store(layout, rows.get<__nv_bfloat16>(), dslots.get<int32_t>() + s0, int64_t(std::min(kChunk, slots - s0)),
                   cache.get<uint8_t>(), nullptr);
  }
  auto q = random_bf16(size_t(B) * heads * D, 4);
  DeviceBuffer out(size_t(B) * heads * kLatent * 2);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  MlaAbsorbedParams p;
  p.q = q.get<__nv_bfloat16>();
  p.fp8_cache = cache.get<uint8_t>();
  p.q_indptr = dq_indptr.get<int32_t>();
  p.kv_indptr = dkv_indptr.get<int32_t>();
  p.kv_slots = dslots.get<int32_t>();
  p.num_seqs = B;
  p.num_tokens = B;
  p.num_heads = heads;
  p.latent_dim = kLatent;
  p.rope_dim = kRope;
  p.scale = 0.1f;
  p.out = out.get<__nv_bfloat16>();
  const bool wide_blocks = wide < 0 ? mla_absorbed_uses_wide_blocks(heads, kLatent, kRope) : wide != 0;
  p.wide_blocks = wide;
  p.num_splits = mla_absorbed_num_splits(B, heads, sms, ctx, wide_blocks);
  DeviceBuffer work(mla_absorbed_workspace_bytes(B, heads, kLatent, p.num_splits));
  if (p.num_splits > 1) {
    p.partial_out = work.get<float>();
    p.partial_lse = p.partial_out + size_t(p.num_splits) * B * heads * kLatent;
  }
  const double s = run_timed(state, [&] { mla_attention_absorbed(p, nullptr); });
  const double bytes =
      double(slots) * layout.slot_bytes() + double(slots) * 4 + double(B) * heads * (D + kLatent) * 2;
  const double flops = 2.0 * B * heads * double(ctx) * (D + kLatent);
  report(state, s, bytes, flops);
  state.counters["splits"] = p.num_splits;
}

// Args: sequences, length, heads (v2-lite 16, V3 128), the Hopper kernel (1) or the mma.sync one (0).
void BM_MlaPrefill(benchmark::State& state) {
  const int B = int(state.range(0)), len = int(state.range(1)), T = B * len, heads = int(state.range(2));
  const int dqk = 192, dkv = 256;
  auto q = random_bf16(size_t(T) * heads * dqk, 5), kv = random_bf16(size_t(T) * heads * dkv, 6),
       kpe = random_bf16(size_t(T) * kRope, 7);
  std::vector<int32_t> indptr(B + 1);
  for (int b = 0; b <= B; ++b) indptr[b] = b * len;
  auto dindptr = upload(indptr);
  DeviceBuffer out(size_t(T) * heads * 128 * 2);
  MlaExpandedParams p;
  p.q = q.get<__nv_bfloat16>();
  p.kv = kv.get<__nv_bfloat16>();
  p.k_pe = kpe.get<__nv_bfloat16>();
  p.q_indptr = p.kv_indptr = dindptr.get<int32_t>();
  p.num_seqs = B;
  p.num_tokens = T;
  p.num_heads = heads;
  p.kv_rows = T;
  p.max_q_len = len;
  p.nope_dim = 128;
  p.rope_dim = kRope;
  p.v_dim = 128;
  p.scale = 0.07f;
  p.out = out.get<__nv_bfloat16>();
  p.sm90 = int(state.range(3));
  const double s = run_timed(state, [&] { mla_attention_expanded(p, nullptr); });
  // Causal: about half of the len x len score matrix, q·k over 192 and p·v over 128.
  const double flops = 2.0 * B * heads * (double(len) * (len + 1) / 2) * (dqk + 128);
  report(state, s, 0, flops);
}

// ---- MoE --------------------------------------------------------------------

struct MoeInputs {
  int T;
  DeviceBuffer x, w_gate_up, w_down, ids, weights, out;
  std::vector<int32_t> host_ids;
  int distinct_experts = 0;  // routed ones touched
};

// v2-lite's MoE: 64 routed experts and the 2 shared ones stacked after them.
constexpr int kShared = 2;

MoeInputs make_moe(int T) {
  MoeInputs m{T, random_bf16(size_t(T) * kHidden, 8),
              random_bf16(size_t(kExperts + kShared) * 2 * kInter * kHidden, 9),
              random_bf16(size_t(kExperts + kShared) * kHidden * kInter, 10), {}, {},
              DeviceBuffer(size_t(T) * kHidden * 2)};
  std::mt19937 rng(T);
  std::vector<float> w(size_t(T) * kTopK);
  m.host_ids.resize(size_t(T) * kTopK);
  std::vector<bool> used(kExperts, false);
  for (int t = 0; t < T; ++t) {
    std::vector<int> e(kExperts);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    for (int j = 0; j < kTopK; ++j) {
      m.host_ids[t * kTopK + j] = e[j];
      w[t * kTopK + j] = 1.0f / kTopK;
      used[e[j]] = true;
    }
  }
  m.distinct_experts = int(std::count(used.begin(), used.end(), true));
  m.ids = upload(m.host_ids);
  m.weights = upload(w);
  return m;
}

// Bytes: the touched experts' weights (routed + `shared`), x in, out.
void moe_counters(benchmark::State& state, double seconds, const MoeInputs& m, int shared) {
  const double weight_bytes = double(m.distinct_experts + shared) * 3 * kHidden * kInter * 2;
  const double act_bytes = double(m.T) * kHidden * 2 * 2;
  const double flops = 2.0 * m.T * (kTopK + shared) * 3 * double(kHidden) * kInter;
  report(state, seconds, weight_bytes + act_bytes, flops);
  state.counters["experts"] = m.distinct_experts + shared;
}

// The fused op with the shared experts folded in. Args: tokens, path (0 auto,
// 1 grouped, 2 small, 3 the Hopper kernels), then the small path's tuning: gate_up columns per
// warp, down rows per warp (one run ranks the variants).
// Router logits + selection at decode sizes, V2-Lite (64 experts, top-6,
// softmax): moe_select's one launch (fused = 1) vs the skinny GEMM into f32
// logits then the router kernel (fused = 0). Args: tokens, fused.
void BM_MoeSelect(benchmark::State& state) {
  const int64_t T = state.range(0);
  const bool fused = state.range(1) != 0;
  auto h = random_bf16(T * kHidden, 1), w = random_bf16(kExperts * kHidden, 2);
  DeviceBuffer logits(T * kExperts * 4), ids(T * kTopK * 4), weights(T * kTopK * 4);
  MoeSelectWorkspace ws;
  MoeRouteParams p;
  p.num_tokens = int(T);
  p.num_experts = kExperts;
  p.top_k = kTopK;
  p.logits = logits.get<float>();
  p.topk_ids = ids.get<int32_t>();
  p.topk_weights = weights.get<float>();
  const double s = run_timed(state, [&] {
    if (fused) {
      moe_select(h.get<__nv_bfloat16>(), w.get<__nv_bfloat16>(), kHidden, p, ws, nullptr);
    } else {
      skinny_gemm(h.get<__nv_bfloat16>(), w.get<__nv_bfloat16>(), T, kExperts, kHidden, logits.get(), true, nullptr);
      moe_route(p, nullptr);
    }
  });
  report(state, s, double(kExperts * kHidden + T * kHidden) * 2, 2.0 * T * kExperts * kHidden);
}

// moe_select at DeepSeek-V3's routing (256 experts, hidden 7168, sigmoid
// scores with the correction bias, 4 of 8 groups, top-8): as a decode step
// runs it, in a CUDA graph, each call on its own router copy (16 copies, 59
// MB, past L2: a step's expert weights evict the router between layers).
// Args: tokens, part (0: the whole op, 1: moe_route's selection alone on
// logits already in memory, 2: the skinny GEMM into f32 logits alone).
void BM_MoeSelectV3(benchmark::State& state) {
  constexpr int kE = 256, kD = 7168, kK = 8, kCopies = 16;
  const int64_t T = state.range(0);
  const int part = int(state.range(1));
  DeviceBuffer logits(T * kE * 4);
  fill_random_bf16(logits.get<__nv_bfloat16>(), size_t(T) * kE * 2, 5, nullptr);  // any finite floats
  auto h = random_bf16(T * kD, 1), w = random_bf16(size_t(kCopies) * kE * kD, 2);
  std::vector<float> bias_host(kE);
  for (int e = 0; e < kE; ++e) bias_host[size_t(e)] = 0.01f * float((e * 37) % 11);
  DeviceBuffer bias = upload(bias_host), ids(T * kK * 4), weights(T * kK * 4);
  MoeSelectWorkspace ws;
  MoeRouteParams p;
  p.num_tokens = int(T);
  p.num_experts = kE;
  p.bias = bias.get<float>();
  p.method = RouteMethod::NoauxTc;
  p.sigmoid = true;
  p.top_k = kK;
  p.n_group = 8;
  p.topk_group = 4;
  p.renormalize = true;
  p.scaling = 2.5f;
  p.topk_ids = ids.get<int32_t>();
  p.topk_weights = weights.get<float>();
  p.logits = logits.get<float>();
  const double s = bench::run_timed_graph(state, kCopies, [&](cudaStream_t stream, int i) {
    const __nv_bfloat16* wc = w.get<__nv_bfloat16>() + size_t(i) * kE * kD;
    if (part == 0) moe_select(h.get<__nv_bfloat16>(), wc, kD, p, ws, stream);
    else if (part == 1) moe_route(p, stream);
    else skinny_gemm(h.get<__nv_bfloat16>(), wc, T, kE, kD, logits.get(), true, stream);
  });
  report(state, s, double(kE * kD + T * kD) * 2, 2.0 * T * kE * kD);
}

void BM_MoeFused(benchmark::State& state) {
  MoeInputs m = make_moe(int(state.range(0)));
  MoeExpertsParams p;
  p.x = m.x.get<__nv_bfloat16>();
  p.w_gate_up = m.w_gate_up.get<__nv_bfloat16>();
  p.w_down = m.w_down.get<__nv_bfloat16>();
  p.topk_ids = m.ids.get<int32_t>();
  p.topk_weights = m.weights.get<float>();
  p.num_tokens = m.T;
  p.hidden = kHidden;
  p.inter = kInter;
  p.num_experts = kExperts;
  p.top_k = kTopK;
  p.num_shared = kShared;
  const MoePath paths[] = {MoePath::Auto, MoePath::Grouped, MoePath::Small, MoePath::Sm90};
  p.path = paths[state.range(1)];
  p.tuning.gate_up_cols_per_warp = int(state.range(2));
  p.tuning.down_rows_per_warp = int(state.range(3));
  p.out = m.out.get<__nv_bfloat16>();
  DeviceBuffer work(moe_workspace_bytes(p));
  const double s = run_timed(state, [&] { moe_experts(p, work.get(), nullptr); });
  moe_counters(state, s, m, kShared);
  state.counters["path"] = int(moe_path(p));  // MoePath: 1 grouped, 2 small, 3 sm90
}

// The simple path: per active expert, gather its rows and run three cuBLASLt
// GEMMs (routing known on the host, as a per-expert loop must know it). It
// reads each expert's gate_up block as [gate; up] rather than the fused
// kernel's interleaving: the same random bytes, the same cost.
void BM_MoePerExpertCublas(benchmark::State& state) {
  MoeInputs m = make_moe(int(state.range(0)));
  std::vector<std::vector<int32_t>> rows(kExperts);
  for (int i = 0; i < m.T * kTopK; ++i) rows[m.host_ids[i]].push_back(i / kTopK);
  std::vector<DeviceBuffer> row_ids;
  for (auto& r : rows) row_ids.push_back(r.empty() ? DeviceBuffer() : upload(r));
  const size_t max_rows = size_t(m.T);
  DeviceBuffer xg(max_rows * kHidden * 2), gu(max_rows * 2 * kInter * 2), act(max_rows * kInter * 2),
      y(max_rows * kHidden * 2);
  CublasLtGemm gemm;
  const size_t gu_mat = size_t(2) * kInter * kHidden, d_mat = size_t(kHidden) * kInter;
  const double s = run_timed(state, [&] {
    for (int e = 0; e < kExperts; ++e) {
      const int64_t n = int64_t(rows[e].size());
      if (!n) continue;
      gather_rows(xg.get(), m.x.get(), row_ids[e].get<int32_t>(), n, kHidden * 2, nullptr);
      gemm.linear(xg.get<__nv_bfloat16>(), m.w_gate_up.get<__nv_bfloat16>() + e * gu_mat, n, 2 * kInter, kHidden,
                  gu.get(), false, nullptr);
      silu_and_mul(gu.get<__nv_bfloat16>(), gu.get<__nv_bfloat16>() + kInter, 2 * kInter, n, kInter,
                   act.get<__nv_bfloat16>(), nullptr);
      gemm.linear(act.get<__nv_bfloat16>(), m.w_down.get<__nv_bfloat16>() + e * d_mat, n, kHidden, kInter, y.get(),
                  false, nullptr);
      // (the weighted scatter-add back to tokens is left out: this path is a lower bound)
    }
  });
  moe_counters(state, s, m, 0);
}

// Next-token sampling over V3's vocabulary (129,280) from f32 logits,
// N(0, 3) a word: one launch of sample_tokens for every row of the batch, as
// the runtime runs it after each step. Args: rows, settings (0: greedy, 1:
// temperature 0.7, 2: + top_p 0.95, 3: + top_k 50 and top_p 0.9, 4: +
// min_p 0.05). Bytes: the logits read once.
void BM_SampleTokens(benchmark::State& state) {
  constexpr int64_t kVocab = 129280;
  const int64_t rows = state.range(0);
  const int settings = int(state.range(1));
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> host(size_t(rows * kVocab));
  for (float& v : host) v = normal(rng);
  DeviceBuffer logits = upload(host), ids(rows * 4);
  std::vector<RowSamplingParams> params(static_cast<size_t>(rows));
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (RowSamplingParams& p : params) {
    p.temperature = settings == 0 ? 0.0f : 0.7f;
    p.top_p = settings == 2 ? 0.95f : settings == 3 ? 0.9f : 1.0f;
    p.top_k = settings == 3 ? 50 : -1;
    p.min_p = settings == 4 ? 0.05f : 0.0f;
    p.uniform = uniform(rng);
  }
  DeviceBuffer dparams = upload(params);
  const double s = run_timed(state, [&] {
    sample_tokens(logits.get<float>(), rows, kVocab, dparams.get<RowSamplingParams>(), ids.get<int32_t>(), nullptr);
  });
  report(state, s, double(rows * kVocab) * 4, 0);
}

}  // namespace
}  // namespace mlaserve::cuda

using namespace mlaserve::cuda;

BENCHMARK(BM_CopyBandwidth)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
BENCHMARK(BM_GemmBf16)->Args({8192, 8192, 8192})->Args({4096, 2048, 10944})->Args({1, 10944, 2048})
    ->Args({1, 2816, 2048})->Args({1, 576, 2048})->Args({4, 2816, 2048})->Args({8, 2816, 2048})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
// v2-lite decode shapes: fused q/kv_a (3648), dense gate_up and down, o_proj,
// shared-expert gate_up, kv_a alone; m up to 8 for batched decode.
BENCHMARK(BM_SkinnyGemm)
    ->ArgsProduct({{1, 4, 8}, {3648, 2048, 21888, 2816, 576}, {2048}, {0, 1, 2, 3}})
    ->ArgsProduct({{1, 8}, {2048}, {10944}, {0, 1, 2, 3}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_HeadBmm)->ArgsProduct({{1, 4, 8}, {0, 1}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.1);
BENCHMARK(BM_MlaDecode)
    ->ArgsProduct({{1, 32, 128}, {4096, 32768}, {0}, {16}, {-1}})
    ->Args({128, 4096, 1, 16, -1})->Args({64, 8192, 0, 16, -1})
    // Small batches: the launcher's split count against fixed ones.
    ->ArgsProduct({{1, 4}, {512, 1024, 4096}, {0, 8, 16}, {16}, {-1}})
    // V3's 128 heads: 16-head blocks against 64-head wgmma blocks.
    ->ArgsProduct({{1, 64}, {4096, 8192}, {0}, {128}, {0, 1}})
    // V3 at one token and short contexts (v3-slice's bs-1 step: 512): both
    // kernels, the launcher's split count against fixed ones.
    ->ArgsProduct({{1}, {512, 2048}, {0, 1, 2, 4, 16}, {128}, {0, 1}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_MlaDecodeFp8Cache)
    ->Args({1, 4096, 16, -1})->Args({1, 32768, 16, -1})->Args({64, 8192, 16, -1})->Args({128, 4096, 16, -1})
    ->ArgsProduct({{1, 64}, {4096, 8192}, {128}, {0, 1}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_MlaPrefill)
    ->ArgsProduct({{1}, {4096}, {16, 128}, {0, 1}})
    ->ArgsProduct({{8}, {512}, {16}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.2);
BENCHMARK(BM_MoeSelect)->ArgsProduct({{1, 4, 8}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.1);
BENCHMARK(BM_MoeSelectV3)->ArgsProduct({{1, 8}, {0, 1, 2}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.1);
BENCHMARK(BM_MoeFused)
    ->ArgsProduct({{1, 2, 4, 8}, {1, 2}, {4}, {8}})
    ->Args({16, 0, 4, 8})->Args({64, 0, 4, 8})->Args({512, 0, 4, 8})->Args({512, 1, 4, 8})
    ->ArgsProduct({{32, 64, 96, 128, 192, 256}, {1, 3}, {4}, {8}})
    ->Args({4096, 0, 4, 8})->Args({4096, 1, 4, 8})
    ->ArgsProduct({{1, 4}, {2}, {1, 2, 4}, {2, 4, 8}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.1);
BENCHMARK(BM_MoePerExpertCublas)->Arg(1)->Arg(64)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_SampleTokens)->ArgsProduct({{1, 8, 64}, {0, 1, 2, 3, 4}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.1);

#endif  // MLASERVE_WITH_CUDA: without it there is nothing to benchmark

BENCHMARK_MAIN();

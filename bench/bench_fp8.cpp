// Block-FP8 kernel benchmarks at DeepSeek-V3 width (the v3-slice preset:
// hidden 7168, 128 heads, q_lora 1536, kv_lora 512 + 64, 256 experts of
// 2048, top-8, dense MLP 18432), timed with CUDA events (median of the
// iterations) on random FP8 weights and activations.
//
// Counters: TFLOP_s and frac_fp8_peak (of the 1979 TFLOP/s FP8 dense spec;
// the measured bf16 rate is ~790), GB_s (bytes that must move: weights,
// activations, outputs) and frac_copy (of the device-to-device copy
// bandwidth measured first in the same run), weight_GB_s for the weight
// bytes alone. The label says which GEMM ran (own kernel or cuBLASLt).
// MoE routing is uniform random over distinct experts, the balanced case.
#include <benchmark/benchmark.h>

#ifdef MLASERVE_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fp8_kv_cache.h"
#include "kernels/cuda/fp8_linear.h"
#include "kernels/cuda/fp8_moe.h"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/fp8_random_fill.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/head_bmm_fp8.h"
#include "kernels/cuda/head_bmm_small.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/skinny_gemm.h"

namespace mlaserve::cuda {
namespace {

using bench::run_timed;
using bench::run_timed_graph;
using bench::upload;

constexpr double kFp8PeakTflops = 1979.0;
constexpr int kHidden = 7168, kHeads = 128, kNope = 128, kV = 128, kLora = 512, kRope = 64;
constexpr int kExperts = 256, kTopK = 8, kMoeInter = 2048;

double g_copy_gbs = 0;

void report(benchmark::State& state, double seconds, double bytes, double weight_bytes, double flops) {
  if (seconds <= 0) return;
  state.counters["median_us"] = seconds * 1e6;
  state.counters["GB_s"] = bytes / seconds / 1e9;
  if (g_copy_gbs > 0) state.counters["frac_copy"] = bytes / seconds / 1e9 / g_copy_gbs;
  state.counters["weight_GB_s"] = weight_bytes / seconds / 1e9;
  state.counters["TFLOP_s"] = flops / seconds / 1e12;
  state.counters["frac_fp8_peak"] = flops / seconds / 1e12 / kFp8PeakTflops;
}

struct DeviceFp8Weight {
  DeviceBuffer q, scale;
  DeviceFp8Weight(int64_t count, int64_t n, int64_t k, uint32_t seed)
      : q(size_t(count) * n * k), scale(size_t(count) * ((n + 127) / 128) * ((k + 127) / 128) * 4) {
    fill_random_e4m3(q.get<uint8_t>(), q.bytes(), seed, nullptr);
    fill_random_scales(scale.get<float>(), scale.bytes() / 4, 1e-4f, 2e-4f, seed + 1, nullptr);
  }
};

// Random bf16 activations {m, k}, quantized with their scales.
struct DeviceFp8Act {
  int64_t ld;
  DeviceBuffer x, q, scale;
  DeviceFp8Act(int64_t m, int64_t k, uint32_t seed)
      : ld(fp8_act_scale_ld(m)), x(size_t(m) * k * 2), q(size_t(ld) * k), scale(size_t(ld) * (k / 128) * 4) {
    fill_random_bf16(x.get<__nv_bfloat16>(), size_t(m) * k, seed, nullptr);
    quantize_fp8_act(x.get<__nv_bfloat16>(), m, k, k, q.get<uint8_t>(), scale.get<float>(), ld, nullptr);
  }
};

// ---- ceiling ---------------------------------------------------------------

void BM_CopyBandwidth(benchmark::State& state) {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer a(bytes), b(bytes);
  MLA_CUDA_CHECK(cudaMemset(a.get(), 1, bytes), "bench");
  const double s = run_timed(state, [&] { cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice); });
  state.counters["GB_s"] = 2.0 * bytes / s / 1e9;
  g_copy_gbs = 2.0 * bytes / s / 1e9;
}

// ---- dense FP8 GEMMs ---------------------------------------------------------

enum class Force { Dispatch, Own, CublasLt, Sm90, Bf16Input, Skinny };

// Decode-like timing: calls replayed in a CUDA graph over copies of the
// weights that together exceed L2 (run_timed_graph).
void fp8_linear_bench(benchmark::State& state, Force force) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int64_t copies = std::clamp<int64_t>((int64_t(256) << 20) / (n * k) + 1, 2, 64);
  DeviceFp8Weight w(copies, n, k, 7);
  const int64_t scale_count = ((n + 127) / 128) * (k / 128);
  DeviceFp8Act x(m, k, 9);
  DeviceBuffer out(size_t(m) * n * 2), workspace(Fp8Linear::workspace_bytes(m, n, k));
  Fp8Linear linear;
  Fp8GemmPath path = Fp8GemmPath::OwnKernel;
  bool ok = true;
  const int calls = int(std::max<int64_t>(copies, 16));
  const double s = run_timed_graph(state, calls, [&](cudaStream_t stream, int i) {
    const uint8_t* wq = w.q.get<uint8_t>() + (i % copies) * n * k;
    const float* ws = w.scale.get<float>() + (i % copies) * scale_count;
    switch (force) {
      case Force::Dispatch:
        path = linear.run(x.q.get<uint8_t>(), x.scale.get<float>(), x.ld, wq, ws, m, n, k, out.get<__nv_bfloat16>(),
                          workspace.get(), stream);
        break;
      case Force::Own:
        linear.run_own_kernel(x.q.get<uint8_t>(), x.scale.get<float>(), x.ld, wq, ws, m, n, k,
                              out.get<__nv_bfloat16>(), workspace.get(), stream);
        break;
      case Force::Sm90:
        path = Fp8GemmPath::Sm90SplitK;
        linear.run_sm90(x.q.get<uint8_t>(), x.scale.get<float>(), x.ld, wq, ws, m, n, k, out.get<__nv_bfloat16>(),
                        workspace.get(), stream);
        break;
      case Force::Bf16Input:  // as the backend runs decode rows: no quantization kernel
        path = Fp8GemmPath::Sm90SplitK;  // or the skinny kernel (labelled below)
        ok = ok && linear.run_bf16(x.x.get<__nv_bfloat16>(), k, wq, ws, m, n, k, out.get<__nv_bfloat16>(),
                                   workspace.get(), stream);
        break;
      case Force::Skinny:  // bf16 rows, unquantized, on the weight-streaming kernel
        skinny_gemm_fp8(x.x.get<__nv_bfloat16>(), k, wq, ws, m, n, k, out.get<__nv_bfloat16>(), stream);
        break;
      case Force::CublasLt:
        path = Fp8GemmPath::CublasLt;
        ok = ok && linear.run_cublaslt(x.q.get<uint8_t>(), x.scale.get<float>(), x.ld, wq, ws, m, n, k,
                                       out.get<__nv_bfloat16>(), stream);
        break;
    }
  });
  if (!ok) {
    state.SkipWithError("no such path for this shape (cuBLASLt algorithm, or quantizing in the GEMM)");
    return;
  }
  const bool skinny = force == Force::Skinny ||
                      (force == Force::Bf16Input && Fp8Linear::skinny_takes(m, n, k, Fp8GemmDevice::current()));
  state.SetLabel(skinny ? "skinny" : fp8_gemm_path_name(path));
  const double weight_bytes = double(n) * k;
  report(state, s, weight_bytes + double(m) * k + double(m) * n * 2, weight_bytes, 2.0 * m * n * k);
}

void BM_Fp8Linear(benchmark::State& state) { fp8_linear_bench(state, Force::Dispatch); }
void BM_Fp8LinearOwnKernel(benchmark::State& state) { fp8_linear_bench(state, Force::Own); }
void BM_Fp8LinearCublasLt(benchmark::State& state) { fp8_linear_bench(state, Force::CublasLt); }
void BM_Fp8LinearSm90(benchmark::State& state) { fp8_linear_bench(state, Force::Sm90); }
void BM_Fp8LinearBf16Input(benchmark::State& state) { fp8_linear_bench(state, Force::Bf16Input); }
void BM_Fp8LinearSkinny(benchmark::State& state) { fp8_linear_bench(state, Force::Skinny); }

// V3 linear shapes {N, K}: q_a, q_b, kv_a, kv_b (expanded prefill), o_proj,
// shared expert gate_up / down, dense MLP gate_up / down, and q_a + kv_a
// fused as the model runs them.
const std::vector<std::pair<int64_t, int64_t>> kV3Shapes = {
    {1536, 7168}, {24576, 1536}, {576, 7168},   {32768, 512},  {7168, 16384},
    {4096, 7168}, {7168, 2048},  {36864, 7168}, {7168, 18432}, {2112, 7168}};

void dense_args(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 64, 128, 4096})
    for (auto [n, k] : kV3Shapes) b->Args({m, n, k});
}

// Graph replays a split-K case runs: a fixed count, since min_time counts
// the manual time of one call (~10 us) while each iteration replays 16-64 of
// them, which made a case cost ~1-5 s of device time.
constexpr int kSplitsIterations = 200;

// The sm90 kernel's split-K choice at decode rows: {m, n, k, splits,
// cluster, block_m, block_n, bf16}, splits 0 = the plan's own, cluster,
// block_m and block_n as Sm90GemmVariant's fp8_cluster_splits, fp8_block_m
// and fp8_block_n (0: the plan's), bf16 1: bf16 rows quantized inside the
// GEMM (as decode rows run); graph-replayed over weight copies like the
// linears.
void BM_Fp8Sm90Splits(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int64_t copies = std::clamp<int64_t>((int64_t(256) << 20) / (n * k) + 1, 2, 64);
  const int64_t scale_count = ((n + 127) / 128) * (k / 128);
  DeviceFp8Weight w(copies, n, k, 7);
  DeviceFp8Act x(m, k, 9);
  DeviceBuffer out(size_t(m) * n * 2);
  Sm90Fp8GemmParams p;
  p.a = x.q.get<uint8_t>();
  p.a_scale = x.scale.get<float>();
  p.a_scale_ld = x.ld;
  p.out = out.get<__nv_bfloat16>();
  p.m = int(m);
  p.n = int(n);
  p.k = int(k);
  p.variant.fp8_k_splits = int(state.range(3));
  p.variant.fp8_cluster_splits = int(state.range(4));
  p.variant.fp8_block_m = int(state.range(5));
  p.variant.fp8_block_n = int(state.range(6));
  if (state.range(7)) {
    p.a_bf16 = x.x.get<__nv_bfloat16>();
    p.a_bf16_ld = k;
  }
  DeviceBuffer workspace(fp8_gemm_sm90_workspace_bytes(p));
  p.workspace = workspace.get();
  state.SetLabel(fp8_gemm_sm90_plan(p));
  const double s = run_timed_graph(state, int(std::max<int64_t>(copies, 16)), [&](cudaStream_t stream, int i) {
    p.w = w.q.get<uint8_t>() + (i % copies) * n * k;
    p.w_scale = w.scale.get<float>() + (i % copies) * scale_count;
    fp8_gemm_sm90(p, stream);
  });
  const double weight_bytes = double(n) * k;
  report(state, s, weight_bytes + double(m) * k + double(m) * n * 2, weight_bytes, 2.0 * m * n * k);
}

// ---- fused MoE ---------------------------------------------------------------

// V3's MoE with its shared expert folded in (stacked after the routed ones).
// Args: tokens, shared experts (0 or 1), path (0 auto, 1 grouped, 2 small),
// then the small path's tuning: gate_up columns per warp, down rows per warp
// (one run ranks the variants).
void BM_Fp8Moe(benchmark::State& state) {
  const int tokens = int(state.range(0)), shared = int(state.range(1));
  DeviceFp8Weight gate_up(kExperts + shared, 2 * kMoeInter, kHidden, 11),
      down(kExperts + shared, kHidden, kMoeInter, 13);
  DeviceBuffer x(size_t(tokens) * kHidden * 2), out(size_t(tokens) * kHidden * 2);
  fill_random_bf16(x.get<__nv_bfloat16>(), size_t(tokens) * kHidden, 15, nullptr);
  std::mt19937 rng(17);
  std::vector<int32_t> ids(size_t(tokens) * kTopK);
  std::vector<float> weights(ids.size(), 1.0f / kTopK);
  std::set<int> touched;
  std::vector<int> perm(kExperts);
  std::iota(perm.begin(), perm.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < kTopK; ++j) touched.insert(ids[t * kTopK + j] = perm[j]);
  }
  DeviceBuffer dids(ids.size() * 4), dw(weights.size() * 4);
  MLA_CUDA_CHECK(cudaMemcpy(dids.get(), ids.data(), dids.bytes(), cudaMemcpyHostToDevice), "bench");
  MLA_CUDA_CHECK(cudaMemcpy(dw.get(), weights.data(), dw.bytes(), cudaMemcpyHostToDevice), "bench");
  Fp8MoeParams p;
  p.x = x.get<__nv_bfloat16>();
  p.w_gate_up = gate_up.q.get<uint8_t>();
  p.w_gate_up_scale = gate_up.scale.get<float>();
  p.w_down = down.q.get<uint8_t>();
  p.w_down_scale = down.scale.get<float>();
  p.topk_ids = dids.get<int32_t>();
  p.topk_weights = dw.get<float>();
  p.num_tokens = tokens;
  p.hidden = kHidden;
  p.inter = kMoeInter;
  p.num_experts = kExperts;
  p.top_k = kTopK;
  p.num_shared = shared;
  p.path = state.range(2) == 1 ? MoePath::Grouped : state.range(2) == 2 ? MoePath::Small : MoePath::Auto;
  p.tuning.gate_up_cols_per_warp = int(state.range(3));
  p.tuning.down_rows_per_warp = int(state.range(4));
  p.out = out.get<__nv_bfloat16>();
  DeviceBuffer workspace(fp8_moe_workspace_bytes(p));
  const double s = run_timed(state, [&] { fp8_moe_experts(p, workspace.get(), nullptr); });
  const double expert_bytes = 3.0 * kHidden * kMoeInter,
               weight_bytes = expert_bytes * double(touched.size() + size_t(shared));
  state.counters["experts_touched"] = double(touched.size() + size_t(shared));
  state.counters["path"] = int(fp8_moe_path(p));  // MoePath: 1 grouped, 2 small, 3 sm90
  state.counters["block_m"] = fp8_moe_block_m(tokens, kTopK + shared, kExperts + shared);
  report(state, s, weight_bytes + 4.0 * tokens * kHidden, weight_bytes,
         2.0 * tokens * (kTopK + shared) * 3.0 * kHidden * kMoeInter);
}

// ---- MLA absorbed BMMs -----------------------------------------------------------

// The two products as the model runs them at V3 width, each call on its own
// weight copy (copies cycled inside one CUDA graph, so weights come from
// HBM and launches overlap by PDL as in a decode step). Args: tokens,
// product (0: q_nope · W_UK into q{L + R} rows, 1: o_latent · W_UVᵀ), weights
// (0: block-FP8 as the model keeps them, W_UK transposed per head,
// head_bmm_fp8's choice; 1: the bf16 copy held before, W_UK {H, Dn, L}:
// head_bmm_small / cuBLASLt; 2: block-FP8 on head_bmm_fp8's tensor-core kernel).
void BM_MlaHeadBmm(benchmark::State& state) {
  const int tokens = int(state.range(0));
  const bool uv = state.range(1) != 0, fp8 = state.range(2) != 1;
  const HeadBmmFp8Path path = state.range(2) == 2 ? HeadBmmFp8Path::Mma : HeadBmmFp8Path::Auto;
  const int64_t K = uv ? kLora : kNope, N = uv ? kV : kLora;  // FP8 weights {H, N, K}
  const int64_t Kx = uv ? kLora : kNope + kRope, No = uv ? kV : kLora + kRope;
  const int copies = fp8 ? 12 : 6;  // > 100 MB: more than L2
  const size_t elems = size_t(kHeads) * N * K;
  std::vector<DeviceFp8Weight> w8;
  w8.reserve(copies);
  DeviceBuffer w16(fp8 ? 0 : copies * elems * 2);
  if (fp8)
    for (int c = 0; c < copies; ++c) w8.emplace_back(1, kHeads * N, K, 31 + c);
  else
    fill_random_bf16(w16.get<__nv_bfloat16>(), copies * elems, 31, nullptr);
  DeviceBuffer x(size_t(tokens) * kHeads * Kx * 2), out(size_t(tokens) * kHeads * No * 2);
  fill_random_bf16(x.get<__nv_bfloat16>(), size_t(tokens) * kHeads * Kx, 37, nullptr);
  CublasLtGemm gemm;
  const auto* xp = x.get<__nv_bfloat16>();
  auto* op = out.get<__nv_bfloat16>();
  const double s = run_timed_graph(state, copies, [&](cudaStream_t stream, int i) {
    if (fp8) {
      const DeviceFp8Weight& w = w8[size_t(i)];
      head_bmm_fp8(xp, w.q.get<uint8_t>(), w.scale.get<float>(), tokens, kHeads, Kx, K, N, op, No, stream, path);
      return;
    }
    const __nv_bfloat16* wb = w16.get<__nv_bfloat16>() + size_t(i) * elems;
    if (head_bmm_small_applies(wb, uv, tokens, K, N))
      head_bmm_small(xp, wb, uv, tokens, kHeads, Kx, K, N, op, No, stream);
    else
      gemm.head_bmm(xp, wb, uv, tokens, kHeads, Kx, K, N, op, No, stream);
  });
  const double weight_bytes = double(elems) * (fp8 ? 1 : 2);
  const bool streams = path == HeadBmmFp8Path::Auto && tokens <= kHeadBmmFp8StreamTokens;
  state.SetLabel(fp8 ? (streams ? "fp8 streaming" : "fp8 mma") : (tokens <= 8 ? "bf16 head_bmm_small" : "bf16 cublaslt"));
  report(state, s, weight_bytes + 2.0 * tokens * kHeads * (K + N), weight_bytes, 2.0 * tokens * kHeads * K * N);
}

// ---- activation quantization and the FP8 latent cache ----------------------------

void BM_Fp8RmsNormQuantize(benchmark::State& state) {
  const int64_t rows = state.range(0), ld = fp8_act_scale_ld(rows);
  DeviceBuffer x(size_t(rows) * kHidden * 2), w(kHidden * 2), q(size_t(ld) * kHidden), sc(size_t(ld) * 56 * 4);
  fill_random_bf16(x.get<__nv_bfloat16>(), size_t(rows) * kHidden, 25, nullptr);
  fill_random_bf16(w.get<__nv_bfloat16>(), kHidden, 27, nullptr);
  const double s = run_timed(state, [&] {
    rms_norm_quantize_fp8(x.get<__nv_bfloat16>(), w.get<__nv_bfloat16>(), 1e-6f, rows, kHidden, q.get<uint8_t>(),
                          sc.get<float>(), ld, nullptr, nullptr);
  });
  report(state, s, double(rows) * kHidden * (2 + 1 + 4.0 / 128), 0, 0);
}

// Reading a batch's whole latent context back from the FP8 cache (what an
// attention kernel reading the FP8 cache moves), against 1152 bytes a
// token for the bf16 cache.
void BM_Fp8KvLoad(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const Fp8KvLayout layout;
  DeviceBuffer cache(size_t(rows) * layout.slot_bytes()), out(size_t(rows) * (kLora + kRope) * 2);
  DeviceBuffer src(size_t(rows) * (kLora + kRope) * 2);
  fill_random_bf16(src.get<__nv_bfloat16>(), size_t(rows) * (kLora + kRope), 29, nullptr);
  std::vector<int32_t> slots(rows);
  std::iota(slots.begin(), slots.end(), 0);
  DeviceBuffer dslots(slots.size() * 4);
  MLA_CUDA_CHECK(cudaMemcpy(dslots.get(), slots.data(), dslots.bytes(), cudaMemcpyHostToDevice), "bench");
  fp8_kv_store(layout, src.get<__nv_bfloat16>(), dslots.get<int32_t>(), rows, cache.get<uint8_t>(), nullptr);
  const double s = run_timed(state, [&] {
    fp8_kv_load(layout, cache.get<uint8_t>(), dslots.get<int32_t>(), rows, out.get<__nv_bfloat16>(), nullptr);
  });
  report(state, s, double(rows) * (layout.slot_bytes() + (kLora + kRope) * 2), 0, 0);
}

}  // namespace
}  // namespace mlaserve::cuda

using namespace mlaserve::cuda;

BENCHMARK(BM_CopyBandwidth)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
BENCHMARK(BM_Fp8Linear)->Apply(dense_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
// Each GEMM path forced where the dispatcher picks the other: the evidence
// for the split (fp8_linear.h).
BENCHMARK(BM_Fp8LinearOwnKernel)
    ->Args({1, 2112, 7168})->Args({1, 24576, 1536})->Args({1, 7168, 16384})->Args({1, 36864, 7168})
    ->Args({8, 7168, 16384})->Args({64, 7168, 16384})->Args({64, 4096, 7168})
    ->Args({4096, 24576, 1536})->Args({4096, 7168, 16384})->Args({4096, 36864, 7168})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
BENCHMARK(BM_Fp8LinearBf16Input)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int64_t m : {1, 8})
        for (auto [n, k] : kV3Shapes) b->Args({m, n, k});
    })
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
// Decode rows from bf16 on the two kernels that take them (Fp8Linear::
// kMaxSkinnyRows): the skinny weight-streaming kernel against the sm90
// kernel quantizing them, at its planned splits.
void decode_rows_args(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 2, 4, 8})
    for (auto [n, k] : kV3Shapes) b->Args({m, n, k});
}
BENCHMARK(BM_Fp8LinearSkinny)->Apply(decode_rows_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
BENCHMARK(BM_Fp8Sm90Splits)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int64_t m : {1, 2, 4, 8})
        for (auto [n, k] : kV3Shapes) b->Args({m, n, k, 0, 0, 0, 0, 1});
    })
    ->Name("BM_Fp8Sm90Bf16Rows")
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(kSplitsIterations);
BENCHMARK(BM_Fp8Sm90Splits)
    ->Apply([](benchmark::internal::Benchmark* b) {
      const int64_t shapes[][2] = {{24576, 1536}, {7168, 16384}, {2112, 7168},
                                   {4096, 7168},  {7168, 18432}, {36864, 7168}};
      const int64_t runs[][2] = {{0, 0}, {1, 0}, {2, -1}, {2, 1}, {3, -1}, {4, -1}, {4, 1}, {8, -1}};
      for (int64_t m : {1, 64, 128})
        for (const auto& s : shapes) {
          for (const auto& r : runs) b->Args({m, s[0], s[1], r[0], r[1], 0, 0, 0});
          if (m == 64)  // 128 x 192 tiles, one consumer warpgroup's rows
            for (int64_t splits : {1, 2, 3, 4}) b->Args({m, s[0], s[1], splits, -1, 128, 192, 0});
          if (m == 1)  // as decode rows run: quantized in the GEMM
            for (int64_t splits : {0, 1, 2, 3, 4}) b->Args({m, s[0], s[1], splits, -1, 0, 0, 1});
        }
    })
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(kSplitsIterations);
// q_b {24576, 1536}: 64 x 256 tiles against 128 x 192 (one wave) across decode rows.
BENCHMARK(BM_Fp8Sm90Splits)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int64_t m : {8, 16, 24, 32, 40, 44, 48, 64}) {
        b->Args({m, 24576, 1536, 0, 0, 0, 0, 0});
        b->Args({m, 24576, 1536, 1, -1, 64, 0, 0});
        b->Args({m, 24576, 1536, 1, -1, 128, 192, 0});
      }
    })
    ->Name("BM_Fp8Sm90WideDecode")
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(kSplitsIterations);
// What a split costs beside its bytes, at one row as decode runs it (bf16
// rows quantized in the GEMM): a one-tile GEMM of 8 K blocks (the floor of
// a launch, then of the partials and the sum kernel) and q_a + kv_a past
// the plan's 8 splits.
BENCHMARK(BM_Fp8Sm90Splits)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int64_t splits : {1, 2, 4, 8}) b->Args({1, 256, 1024, splits, -1, 0, 0, 1});
      for (int64_t splits : {4, 8, 12, 14, 16}) b->Args({1, 2112, 7168, splits, -1, 0, 0, 1});
    })
    ->Name("BM_Fp8Sm90SplitCost")
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(kSplitsIterations);
// The two paths where they meet (32-128 rows, every V3 shape): the evidence
// for Fp8Linear's row limits of the sm90 kernel (80: between 64-row and
// 128-row tiles).
void crossover_args(benchmark::internal::Benchmark* b) {
  for (int64_t m : {32, 64, 80, 96, 128})
    for (auto [n, k] : kV3Shapes) b->Args({m, n, k});
}
BENCHMARK(BM_Fp8LinearSm90)
    ->Args({8, 7168, 16384})->Args({4096, 24576, 1536})->Args({4096, 7168, 16384})->Apply(crossover_args)
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
BENCHMARK(BM_Fp8LinearCublasLt)
    ->Args({4, 7168, 16384})->Args({8, 7168, 16384})->Args({8, 4096, 7168})->Args({16, 7168, 16384})
    ->Apply(crossover_args)
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
BENCHMARK(BM_Fp8Moe)
    ->ArgsProduct({{1, 8, 64, 512, 4096}, {1}, {0}, {4}, {8}})
    ->Args({512, 1, 1, 4, 8})
    ->ArgsProduct({{1, 8}, {1}, {1}, {4}, {8}})
    ->Args({4096, 0, 0, 4, 8})
    ->ArgsProduct({{1, 4}, {1}, {2}, {1, 2, 4}, {2, 4, 8}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.1);
BENCHMARK(BM_MlaHeadBmm)
    ->ArgsProduct({{1, 2, 4, 8, 16, 64, 256}, {0, 1}, {0, 1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.05);
BENCHMARK(BM_Fp8RmsNormQuantize)->Arg(1)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
BENCHMARK(BM_Fp8KvLoad)->Arg(64 * 8192)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);

#endif  // MLASERVE_WITH_CUDA: without it there is nothing to benchmark

BENCHMARK_MAIN();

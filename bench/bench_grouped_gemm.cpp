// Benchmarks of the Hopper (sm_90a) grouped GEMM paths (grouped_gemm_sm90.h):
//   - bf16 MoE experts at v2-lite widths (64 experts, hidden 2048, inter
//     1408, top-6): compare with bench_kernels_cuda's BM_MoeFused (mma.sync);
//   - block-FP8 MoE experts at V3 widths (256 experts, hidden 7168, inter
//     2048, top-8), beside fp8_moe.h's grouped path (BM_Fp8MoeGroupedPath,
//     the same routing) to place the switch between them;
//   - dense block-FP8 GEMMs of V3 shapes: compare with bench_fp8's
//     BM_Fp8LinearCublasLt.
// Counters: median_us (CUDA events), TFLOP_s (the useful flops: routed
// rows only, no padding) and its fraction of the bf16 (790, measured) or
// fp8 (1979, datasheet dense) tensor peak. Random data, uniform random
// routing (the balanced case).
#include <benchmark/benchmark.h>

#ifdef MLASERVE_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fp8_moe.h"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/fp8_random_fill.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/random_fill.h"

namespace mlaserve::cuda {
namespace {

using bench::run_timed;
using bench::upload;

constexpr double kBf16PeakTflops = 790.0, kFp8PeakTflops = 1979.0;

void report(benchmark::State& state, double seconds, double flops, double peak) {
  if (seconds <= 0) return;
  state.counters["median_us"] = seconds * 1e6;
  state.counters["TFLOP_s"] = flops / seconds / 1e12;
  state.counters["frac_peak"] = flops / seconds / 1e12 / peak;
}

struct Routing {
  DeviceBuffer ids, weights;
};

Routing random_routing(int tokens, int experts, int top_k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> wdist(0.1f, 1.0f);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int> perm(experts);
  for (int t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int j = 0; j < top_k; ++j) {
      std::swap(perm[j], perm[j + rng() % (experts - j)]);
      ids.push_back(perm[j]);
      weights.push_back(wdist(rng));
    }
  }
  return {upload(ids), upload(weights)};
}

bool skip_without_hopper(benchmark::State& state) {
  if (sm90_gemm_supported()) return false;
  state.SkipWithError("needs a compute capability 9.0 GPU");
  return true;
}

void BM_Sm90MoeBf16(benchmark::State& state) {
  if (skip_without_hopper(state)) return;
  constexpr int kExperts = 64, kHidden = 2048, kInter = 1408, kTopK = 6;
  const int tokens = int(state.range(0));
  const Sm90GemmVariant variant{int(state.range(1)), -1, 0, int(state.range(2)), 0, int(state.range(3))};
  DeviceBuffer x(size_t(tokens) * kHidden * 2), gate_up(size_t(kExperts) * 2 * kInter * kHidden * 2),
      down(size_t(kExperts) * kHidden * kInter * 2), out(size_t(tokens) * kHidden * 2);
  fill_random_bf16(x.get<__nv_bfloat16>(), x.bytes() / 2, 8, nullptr);
  fill_random_bf16(gate_up.get<__nv_bfloat16>(), gate_up.bytes() / 2, 9, nullptr);
  fill_random_bf16(down.get<__nv_bfloat16>(), down.bytes() / 2, 10, nullptr);
  const Routing route = random_routing(tokens, kExperts, kTopK, 11);
  Sm90MoeParams p;
  p.x = x.get<__nv_bfloat16>();
  p.w_gate_up = gate_up.get();
  p.w_down = down.get();
  p.topk_ids = route.ids.get<int32_t>();
  p.topk_weights = route.weights.get<float>();
  p.num_tokens = tokens;
  p.hidden = kHidden;
  p.inter = kInter;
  p.num_experts = kExperts;
  p.top_k = kTopK;
  p.out = out.get<__nv_bfloat16>();
  p.variant = variant;
  DeviceBuffer workspace(moe_experts_sm90_workspace_bytes(p));
  const double s = run_timed(state, [&] { moe_experts_sm90(p, workspace.get(), nullptr); });
  report(state, s, 2.0 * tokens * kTopK * 3.0 * kHidden * kInter, kBf16PeakTflops);
}

// V3's routed experts and its shared one (stacked last) in block FP8,
// random weights and routing.
struct Fp8MoeData {
  static constexpr int kExperts = 256, kHidden = 7168, kInter = 2048, kTopK = 8, kStacked = kExperts + 1;
  explicit Fp8MoeData(int tokens)
      : x(size_t(tokens) * kHidden * 2),
        out(size_t(tokens) * kHidden * 2),
        gate_up(size_t(kStacked) * 2 * kInter * kHidden),
        down(size_t(kStacked) * kHidden * kInter),
        gate_up_scale(size_t(kStacked) * (2 * kInter / 128) * (kHidden / 128) * 4),
        down_scale(size_t(kStacked) * (kHidden / 128) * (kInter / 128) * 4),
        route(random_routing(tokens, kExperts, kTopK, 13)) {
    fill_random_bf16(x.get<__nv_bfloat16>(), x.bytes() / 2, 8, nullptr);
    fill_random_e4m3(gate_up.get<uint8_t>(), gate_up.bytes(), 9, nullptr);
    fill_random_e4m3(down.get<uint8_t>(), down.bytes(), 10, nullptr);
    fill_random_scales(gate_up_scale.get<float>(), gate_up_scale.bytes() / 4, 1e-4f, 2e-4f, 11, nullptr);
    fill_random_scales(down_scale.get<float>(), down_scale.bytes() / 4, 1e-4f, 2e-4f, 12, nullptr);
  }
  DeviceBuffer x, out, gate_up, down, gate_up_scale, down_scale;
  Routing route;
};

void BM_Sm90MoeFp8(benchmark::State& state) {
  if (skip_without_hopper(state)) return;
  const int tokens = int(state.range(0));
  Fp8MoeData d(tokens);
  Sm90MoeParams p;
  p.x = d.x.get<__nv_bfloat16>();
  p.w_gate_up = d.gate_up.get();
  p.w_gate_up_scale = d.gate_up_scale.get<float>();
  p.w_down = d.down.get();
  p.w_down_scale = d.down_scale.get<float>();
  p.topk_ids = d.route.ids.get<int32_t>();
  p.topk_weights = d.route.weights.get<float>();
  p.num_tokens = tokens;
  p.hidden = Fp8MoeData::kHidden;
  p.inter = Fp8MoeData::kInter;
  p.num_experts = Fp8MoeData::kExperts;
  p.top_k = Fp8MoeData::kTopK;
  p.out = d.out.get<__nv_bfloat16>();
  p.variant = Sm90GemmVariant{0, int(state.range(1)), 0, int(state.range(2)), 0, int(state.range(3)),
                              int(state.range(5))};
  p.num_shared = int(state.range(4));
  DeviceBuffer workspace(fp8_moe_experts_sm90_workspace_bytes(p));
  const double s = run_timed(state, [&] { fp8_moe_experts_sm90(p, workspace.get(), nullptr); });
  report(state, s,
         2.0 * tokens * (Fp8MoeData::kTopK + p.num_shared) * 3.0 * Fp8MoeData::kHidden * Fp8MoeData::kInter,
         kFp8PeakTflops);
}

// fp8_moe.h's grouped (pre-Hopper) path on the same data.
void BM_Fp8MoeGroupedPath(benchmark::State& state) {
  const int tokens = int(state.range(0));
  Fp8MoeData d(tokens);
  Fp8MoeParams p;
  p.x = d.x.get<__nv_bfloat16>();
  p.w_gate_up = d.gate_up.get<uint8_t>();
  p.w_gate_up_scale = d.gate_up_scale.get<float>();
  p.w_down = d.down.get<uint8_t>();
  p.w_down_scale = d.down_scale.get<float>();
  p.topk_ids = d.route.ids.get<int32_t>();
  p.topk_weights = d.route.weights.get<float>();
  p.num_tokens = tokens;
  p.hidden = Fp8MoeData::kHidden;
  p.inter = Fp8MoeData::kInter;
  p.num_experts = Fp8MoeData::kExperts;
  p.top_k = Fp8MoeData::kTopK;
  p.path = MoePath::Grouped;
  p.out = d.out.get<__nv_bfloat16>();
  DeviceBuffer workspace(fp8_moe_workspace_bytes(p));
  const double s = run_timed(state, [&] { fp8_moe_experts(p, workspace.get(), nullptr); });
  report(state, s, 2.0 * tokens * Fp8MoeData::kTopK * 3.0 * Fp8MoeData::kHidden * Fp8MoeData::kInter,
         kFp8PeakTflops);
}

void BM_Sm90Fp8Gemm(benchmark::State& state) {
  if (skip_without_hopper(state)) return;
  const int m = int(state.range(0)), n = int(state.range(1)), k = int(state.range(2));
  const Sm90GemmVariant variant{0,  int(state.range(3)), int(state.range(4)), -1, 0, int(state.range(5)),
                                0,  int(state.range(6))};
  const int64_t ld = fp8_act_scale_ld(m);
  DeviceBuffer x(size_t(m) * k * 2), a(size_t(ld) * k), a_scale(size_t(ld) * (k / 128) * 4);
  DeviceBuffer w(size_t(n) * k), w_scale(size_t((n + 127) / 128) * (k / 128) * 4), out(size_t(m) * n * 2);
  fill_random_bf16(x.get<__nv_bfloat16>(), x.bytes() / 2, 8, nullptr);
  quantize_fp8_act(x.get<__nv_bfloat16>(), m, k, k, a.get<uint8_t>(), a_scale.get<float>(), ld, nullptr);
  fill_random_e4m3(w.get<uint8_t>(), w.bytes(), 9, nullptr);
  fill_random_scales(w_scale.get<float>(), w_scale.bytes() / 4, 1e-4f, 2e-4f, 10, nullptr);
  Sm90Fp8GemmParams p;
  p.a = a.get<uint8_t>();
  p.a_scale = a_scale.get<float>();
  p.a_scale_ld = ld;
  p.w = w.get<uint8_t>();
  p.w_scale = w_scale.get<float>();
  p.out = out.get<__nv_bfloat16>();
  p.m = m;
  p.n = n;
  p.k = k;
  p.variant = variant;
  DeviceBuffer workspace(fp8_gemm_sm90_workspace_bytes(p));
  p.workspace = workspace.get();
  const double s = run_timed(state, [&] { fp8_gemm_sm90(p, nullptr); });
  report(state, s, 2.0 * m * n * k, kFp8PeakTflops);
}

// Variant sweeps (Sm90GemmVariant; 0 / -1: the default): bf16 {tokens,
// block_m, gather in producer, cluster_m}; fp8 {tokens, overlapped
// promotion, gather in producer, cluster_m, shared experts, block_m (192:
// runs of an expert's blocks on three consumer warpgroups)}; dense {m, n,
// k, overlapped, block_m, cluster_m, block_n} (cluster_m 1: a CTA a tile, 2:
// pairs sharing weights; block_n 192: 128 x 192 tiles).
void bf16_args(benchmark::internal::Benchmark* b) {
  for (int tokens : {128, 192}) b->Args({tokens, 0, 1, 0});
  for (int tokens : {256, 512, 1024, 2048, 4096}) {
    b->Args({tokens, 0, 1, 0});
    for (int cluster : {1, 2}) b->Args({tokens, 0, 0, cluster});
  }
  for (int block_m : {128, 64})
    for (int cluster : {1, 2}) b->Args({4096, block_m, 0, cluster});
  for (int tokens : {512, 1024, 2048, 4096}) b->Args({tokens, 192, 0, 1});
}
void fp8_moe_args(benchmark::internal::Benchmark* b) {
  for (int tokens : {6, 8, 12, 16, 32, 48, 64, 96, 128, 256, 512}) b->Args({tokens, 1, 1, 0, 0, 0});
  // Where the producer gather (64-row tiles) hands over to runs (TMA-fed A).
  for (int tokens : {512, 768, 1024, 1280, 1536, 2048}) {
    b->Args({tokens, 1, 1, 0, 0, 64});
    b->Args({tokens, 0, 0, 1, 0, 192});
  }
  for (int tokens : {1024, 2048, 4096}) {
    for (int cluster : {1, 2}) b->Args({tokens, 1, 0, cluster, 0, 64});
    b->Args({tokens, 0, 0, 1, 0, 192});
  }
  b->Args({4096, 0, 0, 2, 0, 64});
  for (int cluster : {1, 2}) b->Args({4096, 1, 0, cluster, 1, 64});
  b->Args({4096, 0, 0, 1, 1, 192});
}
// V3 shapes {n, k} at M = 4096: q_a, q_b, kv_a, o_proj, shared-expert gate_up
// and down, dense-MLP gate_up and down.
void dense_args(benchmark::internal::Benchmark* b) {
  const int shapes[][2] = {{1536, 7168}, {24576, 1536}, {576, 7168}, {7168, 16384},
                           {4096, 7168}, {7168, 2048},  {36864, 7168}, {7168, 18432}};
  for (const auto& s : shapes) {
    b->Args({4096, s[0], s[1], 1, 128, 1, 128});
    b->Args({4096, s[0], s[1], 1, 128, 2, 128});
    for (int cluster : {1, 2}) b->Args({4096, s[0], s[1], 0, 128, cluster, 128});
    b->Args({4096, s[0], s[1], 0, 192, 1, 128});
    for (int cluster : {1, 2}) b->Args({4096, s[0], s[1], 0, 128, cluster, 192});
  }
}
BENCHMARK(BM_Sm90MoeBf16)->Apply(bf16_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_Sm90MoeFp8)->Apply(fp8_moe_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_Fp8MoeGroupedPath)
    ->Arg(6)
    ->Arg(8)
    ->Arg(12)
    ->Arg(16)
    ->Arg(32)
    ->Arg(48)
    ->Arg(64)
    ->Arg(96)
    ->Arg(128)
    ->Arg(256)
    ->Arg(512)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.2);
BENCHMARK(BM_Sm90Fp8Gemm)->Apply(dense_args)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.1);

}  // namespace
}  // namespace mlaserve::cuda

BENCHMARK_MAIN();
#else
int main() { return 0; }
#endif

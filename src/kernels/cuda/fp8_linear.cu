#include "kernels/cuda/fp8_linear.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/skinny_gemm.h"

namespace mlaserve::cuda {

const char* fp8_gemm_path_name(Fp8GemmPath path) {
  switch (path) {
    case Fp8GemmPath::CublasLt: return "cublaslt";
    case Fp8GemmPath::Sm90SplitK: return "sm90";
    default: return "own";
  }
}

Fp8GemmDevice Fp8GemmDevice::current() {
  Fp8GemmDevice d;
  d.hopper = sm90_gemm_supported();
  if (!d.hopper) return d;  // the memory only moves the choice between Hopper's paths
  int device = 0, clock_khz = 0, bus_bits = 0;
  MLA_CUDA_CHECK(cudaGetDevice(&device), "fp8 linear");
  MLA_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device), "fp8 linear");
  MLA_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device), "fp8 linear");
  // Two transfers a clock (HBM's double data rate).
  d.fast_memory = 2.0 * clock_khz * 1e3 * bus_bits / 8 >= kFastMemoryBytesPerSecond;
  return d;
}

namespace {

// The own kernel's parameters for a plain linear.
Fp8GemmParams linear_params(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                            const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out) {
  Fp8GemmParams p;
  p.a = x_q;
  p.a_row_stride = k;
  p.a_scale = x_scale;
  p.a_scale_row_stride = 1;
  p.a_scale_kb_stride = scale_ld;
  p.w = w;
  p.w_scale = w_scale;
  p.w_scale_ld = (k + kFp8Group - 1) / kFp8Group;
  p.out = out;
  p.out_row_stride = n;
  p.m = m;
  p.n = n;
  p.k = k;
  return p;
}

Sm90Fp8GemmParams sm90_params(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                               const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out,
                               void* workspace) {
  Sm90Fp8GemmParams p;
  p.a = x_q;
  p.a_scale = x_scale;
  p.a_scale_ld = scale_ld;
  p.w = w;
  p.w_scale = w_scale;
  p.out = out;
  p.m = int(m);
  p.n = int(n);
  p.k = int(k);
  p.workspace = workspace;
  return p;
}

}  // namespace

// The row limits are the crossover measured on an H200 (BM_Fp8LinearSm90 vs
// BM_Fp8LinearCublasLt at 32-128 rows, docs/perf.md session 5): at 96 and
// 128 rows cuBLASLt took o_proj {7168, 16384} in 44-46 us against 58-59,
// dense down {7168, 18432} 48-50 against 53-66, q_b and kv_b 2-10% less;
// the split-K kernel kept q_a, kv_a and their fusion (8-13 us against cuBLASLt's
// ~16 us floor), and shared down {7168, 2048} within 4%. Since the split-K
// kernel adds a tile's splits in a cluster, it takes o_proj and dense down
// (K >= kSplitKMinK) at 96 / 128 rows ~9% faster than cuBLASLt on the H100
// (perf.md session 24), but not on the H200's faster memory, where
// cuBLASLt streams them 4-8% faster than the clusters (o_proj 42.0 / 43.9
// us against 44.6 / 45.8, dense down 46.2 / 48.4 against 49.8 / 51.2 at
// 96 / 128 rows, 9-11% at 80; at 64 rows the kernel's 64 x 256 tiles stay
// 12-17% ahead: 35.6 / 39.6 against 43.1 / 45.0; perf.md session 34). q_b, kv_b and the
// dense gate_up, whose 128-row plans do not split K, stay 4-7% faster on
// cuBLASLt on both (the shared gate_up ties on the H100).
// Above those rows, where cuBLASLt's layout rules fail (M not a multiple
// of 4: three prefill batches in four), the wgmma kernel takes any M: the
// portable mma.sync kernel was 12-16x slower than cuBLASLt at M = 4096 on
// q_b, o_proj and the dense gate_up (H100, perf.md session 22), the wgmma
// kernel 9-13% slower.
Fp8GemmPath Fp8Linear::path_for(int64_t m, int64_t n, int64_t k, const Fp8GemmDevice& device) {
  const bool sm90 = sm90_takes(n, k, device.hopper);
  if (sm90 && m <= kMaxSm90Rows) {
    const bool cublaslt_faster = m > kMaxSm90RowsLargeWeights && n * k >= kLargeWeightValues &&
                                 (k < kSplitKMinK || device.fast_memory) && Fp8CublasLtGemm::shape_allowed(m, n, k);
    if (!cublaslt_faster) return Fp8GemmPath::Sm90SplitK;
  }
  if (m > kMaxOwnKernelRows && Fp8CublasLtGemm::shape_allowed(m, n, k)) return Fp8GemmPath::CublasLt;
  return sm90 ? Fp8GemmPath::Sm90SplitK : Fp8GemmPath::OwnKernel;
}

bool Fp8Linear::sm90_takes(int64_t n, int64_t k, bool hopper) { return hopper && n % 8 == 0 && k % kFp8Group == 0; }

size_t Fp8Linear::workspace_bytes(int64_t m, int64_t n, int64_t k) {
  if (m == 0) return 0;
  const size_t own =
      plan_fp8_gemm(linear_params(nullptr, nullptr, fp8_act_scale_ld(m), nullptr, nullptr, m, n, k, nullptr))
          .workspace_bytes;
  // The wgmma kernel also stands in where cuBLASLt, picked, has no algorithm.
  if (!sm90_takes(n, k, sm90_gemm_supported())) return own;
  const Sm90Fp8GemmParams p = sm90_params(nullptr, nullptr, fp8_act_scale_ld(m), nullptr, nullptr, m, n, k, nullptr,
                                          nullptr);
  return std::max(own, fp8_gemm_sm90_workspace_bytes(p));
}

bool Fp8Linear::takes_bf16_rows(int64_t m, int64_t n, int64_t k, const Fp8GemmDevice& device) {
  return m >= 1 && m <= kSm90QuantizeMaxRows && path_for(m, n, k, device) == Fp8GemmPath::Sm90SplitK;
}

// One row in a CUDA graph on an H200 (perf.md session 38, us, skinny against
// the sm90 kernel quantizing the row): q_a + kv_a {2112, 7168} 7.5 / 9.1
// (7.3 since its one-wave plan, session 39),
// q_a 5.0 / 7.6, kv_a 3.3 / 6.2, q_b {24576, 1536} 12.3 / 13.5, the shared
// expert's gate_up / down 11.4 / 12.7 and 6.8 / 7.6. Alone o_proj {7168,
// 16384} is slower on it (36.8 / 34.2), yet in the model it saves ~3 us a
// layer: its stream starts under the W_UV product before it, where the sm90
// kernel's shared memory waits for that kernel's blocks to leave (v3-slice
// bs 1, 1.254 ms a step against 1.265). The dense MLP (126 and 252 MiB: 51 /
// 39 and 85 / 79 alone) costs ~8 us a step more on it in the model, and
// kv_b (K = 512) leaves half a warp's loads idle (8.5 / 7.3). At two rows
// the skinny kernel widens each weight once a row and wins only on q_a and
// kv_a alone.
bool Fp8Linear::skinny_takes(int64_t m, int64_t n, int64_t k, const Fp8GemmDevice& device) {
  return m <= kMaxSkinnyRows && n * k < kMaxSkinnyValues && k >= kMinSkinnyK && takes_bf16_rows(m, n, k, device) &&
         skinny_gemm_fp8_applies(m, k, k);
}

bool Fp8Linear::run_bf16(const __nv_bfloat16* x, int64_t x_ld, const uint8_t* w, const float* w_scale, int64_t m,
                         int64_t n, int64_t k, __nv_bfloat16* out, void* workspace, cudaStream_t stream,
                         int* deferred_splits) {
  if (!takes_bf16_rows(m, n, k)) return false;
  if (skinny_takes(m, n, k, device_) && skinny_gemm_fp8_applies(m, k, x_ld)) {
    if (deferred_splits) *deferred_splits = 0;
    skinny_gemm_fp8(x, x_ld, w, w_scale, m, n, k, out, stream);
    return true;
  }
  Sm90Fp8GemmParams p = sm90_params(nullptr, nullptr, fp8_act_scale_ld(m), w, w_scale, m, n, k, out, workspace);
  p.a_bf16 = x;
  p.a_bf16_ld = x_ld;
  if (deferred_splits) {
    *deferred_splits = fp8_gemm_sm90_partial_splits(p);
    p.defer_split_sum = *deferred_splits > 0;
  }
  fp8_gemm_sm90(p, stream);
  return true;
}

bool Fp8Linear::run_bf16_rms_norm(const SkinnyRmsNorm& norm, const uint8_t* w, const float* w_scale, int64_t n,
                                  int64_t k, __nv_bfloat16* out, cudaStream_t stream) {
  if (!skinny_takes(1, n, k, device_) || !skinny_gemm_fp8_rms_norm_applies(k)) return false;
  skinny_gemm_fp8_rms_norm(norm, w, w_scale, n, k, out, stream);
  return true;
}

void Fp8Linear::run_sm90(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                         const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, void* workspace,
                         cudaStream_t stream) {
  fp8_gemm_sm90(sm90_params(x_q, x_scale, scale_ld, w, w_scale, m, n, k, out, workspace), stream);
}

void Fp8Linear::run_own_kernel(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                               const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out,
                               void* workspace, cudaStream_t stream) {
  const Fp8GemmParams p = linear_params(x_q, x_scale, scale_ld, w, w_scale, m, n, k, out);
  run_fp8_gemm(p, plan_fp8_gemm(p), workspace, stream);
}

bool Fp8Linear::run_cublaslt(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                             const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out,
                             cudaStream_t stream) {
  // cuBLASLt reads the token scales M apart.
  if (scale_ld != m) return false;
  return lt_.linear(x_q, x_scale, w, w_scale, m, n, k, out, stream);
}

Fp8GemmPath Fp8Linear::run(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                           const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out,
                           void* workspace, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(scale_ld >= m, "fp8 linear: scale_ld is smaller than the row count");
  const Fp8GemmPath path = path_for(m, n, k, device_);
  if (path == Fp8GemmPath::Sm90SplitK) {
    run_sm90(x_q, x_scale, scale_ld, w, w_scale, m, n, k, out, workspace, stream);
    return path;
  }
  if (path == Fp8GemmPath::CublasLt &&
      run_cublaslt(x_q, x_scale, scale_ld, w, w_scale, m, n, k, out, stream))
    return Fp8GemmPath::CublasLt;
  if (sm90_takes(n, k, device_.hopper)) {  // cuBLASLt had no algorithm, or the scales are not M apart
    run_sm90(x_q, x_scale, scale_ld, w, w_scale, m, n, k, out, workspace, stream);
    return Fp8GemmPath::Sm90SplitK;
  }
  run_own_kernel(x_q, x_scale, scale_ld, w, w_scale, m, n, k, out, workspace, stream);
  return Fp8GemmPath::OwnKernel;
}

}  // namespace mlaserve::cuda

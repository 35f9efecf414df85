#pragma once
// A block-FP8 linear layer on quantized activations: out{M, N} bf16 =
// dequant(x_q{M, K}) · dequant(w{N, K})ᵀ, choosing the GEMM per shape and
// device (measured on the H100 and the H200, docs/fp8.md):
//   one decode row from bf16 on weights under 125 MiB (run_bf16) ->
//     the skinny weight-streaming kernel (skinny_gemm.h);
//   M <= 64 on Hopper, and up to 128 rows for weights under 2^24 values or
//     (on an H100's memory, under 4 TB/s) K of 8192 and more -> the wgmma
//     kernel with split K
//     (grouped_gemm_sm90.h: M = 1 included; weights streamed by TMA from
//     every SM; up to 8 rows it also quantizes bf16 x itself, run_bf16);
//   larger M -> cuBLASLt block-scaled FP8 (its wgmma kernels: 0.9-1.1
//     PFLOP/s at M = 4096; at 65-128 rows up to 7% faster than the split-K
//     kernel on weights of 2^24 values and more with K under 8192, where
//     the wgmma kernel's 128-row tiles do not split K, and on the H200 on
//     those with longer K too, 4-8% faster than its K splits in clusters);
//   where cuBLASLt's layout rules fail (M not a multiple of 4) or it has no
//     algorithm -> the wgmma kernel on Hopper (any M);
//   otherwise -> our portable mma.sync kernel (fp8_gemm.h), which any GPU
//     with e4m3 MMA runs.
// The activations come from fp8_quant.h (scale_ld = fp8_act_scale_ld(M));
// the weight scales are the checkpoint's {ceil(N/128), ceil(K/128)}.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_gemm_cublaslt.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/skinny_gemm.h"

namespace mlaserve::cuda {

enum class Fp8GemmPath { OwnKernel, CublasLt, Sm90SplitK };
const char* fp8_gemm_path_name(Fp8GemmPath path);

// What the dispatch reads of the device.
struct Fp8GemmDevice {
  bool hopper = false;       // runs grouped_gemm_sm90's kernels
  bool fast_memory = false;  // peak memory bandwidth of kFastMemoryBytesPerSecond or more (H200, not H100)
  static constexpr double kFastMemoryBytesPerSecond = 4e12;
  static Fp8GemmDevice current();
};

class Fp8Linear {
 public:
  static constexpr int64_t kMaxOwnKernelRows = 8, kMaxSm90Rows = 128, kMaxSm90RowsLargeWeights = 64;
  // One decode row on weights under 125 MiB with K >= 1024 (every V3
  // linear but the dense MLP and kv_b) runs faster on the skinny kernel
  // than on the sm90 kernel's TMA tiles and split-K partials (measured in
  // fp8_linear.cu).
  static constexpr int64_t kMaxSkinnyRows = 1, kMaxSkinnyValues = int64_t(125) << 20, kMinSkinnyK = 1024;
  static constexpr int64_t kLargeWeightValues = int64_t(1) << 24;  // N * K from which cuBLASLt takes 65-128 rows
  // ... unless K reaches this on a device without fast memory (the wgmma kernel splits K in clusters)
  static constexpr int64_t kSplitKMinK = 8192;

  static Fp8GemmPath path_for(int64_t m, int64_t n, int64_t k, const Fp8GemmDevice& device);
  // Whether the wgmma kernel takes this N and K (on Hopper).
  static bool sm90_takes(int64_t n, int64_t k, bool hopper);
  // Workspace `run` needs for this shape: the split-K sums of the path it
  // takes and of its fallback where cuBLASLt has no algorithm (the wgmma
  // kernel on Hopper, else the portable kernel).
  static size_t workspace_bytes(int64_t m, int64_t n, int64_t k);

  // Returns the path taken. x_scale[kb * scale_ld + r]; w_scale[nb * ceil(K/128) + kb].
  Fp8GemmPath run(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                  const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, void* workspace,
                  cudaStream_t stream);
  // The same product forced onto one path (tests and benchmarks compare them).
  void run_own_kernel(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                      const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, void* workspace,
                      cudaStream_t stream);
  // Decode rows straight from bf16, with no quantization kernel: on Hopper
  // with M <= kSm90QuantizeMaxRows (and N % 8 == 0). Up to kMaxSkinnyRows
  // rows the skinny weight-streaming kernel takes them, unquantized
  // (skinny_gemm.h); above, the sm90 kernel quantizes x itself, 1x128 as
  // quantize_fp8_act would. Returns false (and does nothing) for other
  // shapes and GPUs.
  static bool takes_bf16_rows(int64_t m, int64_t n, int64_t k, const Fp8GemmDevice& device);
  bool takes_bf16_rows(int64_t m, int64_t n, int64_t k) const { return takes_bf16_rows(m, n, k, device_); }
  static bool skinny_takes(int64_t m, int64_t n, int64_t k, const Fp8GemmDevice& device);
  // With deferred_splits, where the plan stores f32 split-K partials they
  // stay in the workspace ([(s * m + row) * n + col]) for the consumer to
  // add in split order, out is not written, and *deferred_splits says how
  // many (else 0, and out is written).
  bool run_bf16(const __nv_bfloat16* x, int64_t x_ld, const uint8_t* w, const float* w_scale, int64_t m, int64_t n,
                int64_t k, __nv_bfloat16* out, void* workspace, cudaStream_t stream, int* deferred_splits = nullptr);
  // One row of rms_norm's output, formed inside the skinny kernel's launch
  // (skinny_gemm_fp8_rms_norm), where skinny_takes holds for the row and
  // the norm's width fits; returns false (and does nothing) elsewhere.
  bool run_bf16_rms_norm(const SkinnyRmsNorm& norm, const uint8_t* w, const float* w_scale, int64_t n, int64_t k,
                         __nv_bfloat16* out, cudaStream_t stream);
  void run_sm90(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w, const float* w_scale,
                int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, void* workspace, cudaStream_t stream);
  bool run_cublaslt(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                    const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, cudaStream_t stream);

 private:
  Fp8CublasLtGemm lt_;
  Fp8GemmDevice device_ = Fp8GemmDevice::current();
};

}  // namespace mlaserve::cuda

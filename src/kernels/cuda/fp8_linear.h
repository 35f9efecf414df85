#pragma once
// A block-FP8 linear layer on quantized activations: out{M, N} bf16 =
// dequant(x_q{M, K}) · dequant(w{N, K})ᵀ, choosing the GEMM per shape
// (measured on the H200, docs/fp8.md):
//   M <= 8, or cuBLASLt's layout rules fail -> our own kernel (fp8_gemm.h:
//     M = 1 included, which cuBLASLt rejects; up to 2.7 TB/s of weights);
//   otherwise -> cuBLASLt block-scaled FP8 (its wgmma kernels: 0.9-1.1
//     PFLOP/s at M = 4096 and 2.4-2.8 TB/s of weights at M = 64-128, where
//     our mma.sync kernel, lowered to HMMA on sm_90, manages 0.2-0.5 TB/s).
// The activations come from fp8_quant.h (scale_ld = fp8_act_scale_ld(M));
// the weight scales are the checkpoint's {ceil(N/128), ceil(K/128)}.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_gemm_cublaslt.h"

namespace mlaserve::cuda {

enum class Fp8GemmPath { OwnKernel, CublasLt };
const char* fp8_gemm_path_name(Fp8GemmPath path);

class Fp8Linear {
 public:
  static constexpr int64_t kMaxOwnKernelRows = 8;

  static Fp8GemmPath path_for(int64_t m, int64_t n, int64_t k);
  // Workspace `run` needs for this shape (the own kernel's split-K sums;
  // sized for it even where cuBLASLt is chosen, the fallback if cuBLASLt
  // has no algorithm).
  static size_t workspace_bytes(int64_t m, int64_t n, int64_t k);

  // Returns the path taken. x_scale[kb * scale_ld + r]; w_scale[nb * ceil(K/128) + kb].
  Fp8GemmPath run(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                  const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, void* workspace,
                  cudaStream_t stream);
  // The same product forced onto one path (tests and benchmarks compare them).
  void run_own_kernel(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                      const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, void* workspace,
                      cudaStream_t stream);
  bool run_cublaslt(const uint8_t* x_q, const float* x_scale, int64_t scale_ld, const uint8_t* w,
                    const float* w_scale, int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, cudaStream_t stream);

 private:
  Fp8CublasLtGemm lt_;
};

}  // namespace mlaserve::cuda

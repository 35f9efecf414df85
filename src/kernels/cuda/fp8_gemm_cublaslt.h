#pragma once
// Block-scaled FP8 GEMM through cuBLASLt 13 (Hopper): the token operand with
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F (1x128 f32 scales, fp8_quant.h's
// token-contiguous layout), the weight with
// CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F (the checkpoint's
// weight_scale_inv, row-major {N/128, K/128}). cuBLASLt applies the scales
// per K block in f32. It is fast where the problem is large (prefill) and
// rejects or is slow at small M (see docs/fp8.md): fp8_linear.h picks.
//
// One plan (algorithm) per shape, chosen at first use and cached; the
// workspace is allocated once, so runs are graph-capturable after warm-up.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/cuda/device_buffer.h"

namespace mlaserve::cuda {

class Fp8CublasLtGemm {
 public:
  explicit Fp8CublasLtGemm(size_t workspace_bytes = size_t(32) << 20);
  ~Fp8CublasLtGemm();
  Fp8CublasLtGemm(const Fp8CublasLtGemm&) = delete;
  Fp8CublasLtGemm& operator=(const Fp8CublasLtGemm&) = delete;

  // The layout rules this wrapper relies on: M a multiple of 4 (the scale
  // columns are 16-byte aligned and M apart), N a multiple of 16, K a
  // multiple of 512 (K/128 weight-scale columns a multiple of 4).
  static bool shape_allowed(int64_t m, int64_t n, int64_t k);

  // out{M, N} = x{M, K} · wᵀ with x_scale[kb * M + r] and w_scale[nb * K/128 + kb].
  // Returns false, launching nothing, when cuBLASLt has no algorithm for
  // the shape (the caller falls back to its own kernel).
  bool linear(const uint8_t* x_q, const float* x_scale, const uint8_t* w, const float* w_scale, int64_t m,
              int64_t n, int64_t k, __nv_bfloat16* out, cudaStream_t stream);

 private:
  struct Plan;
  const Plan& plan_for(int64_t m, int64_t n, int64_t k);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
};

}  // namespace mlaserve::cuda

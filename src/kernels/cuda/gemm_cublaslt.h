#pragma once
// Dense GEMMs through cuBLASLt: bf16 operands, f32 accumulation, bf16 or f32
// output. The algorithm for each distinct problem is chosen once (first use,
// normally during start-up or graph capture) and cached; the cuBLASLt
// workspace is allocated once, so calls are graph-capturable.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/cuda/device_buffer.h"

namespace mlaserve::cuda {

class CublasLtGemm {
 public:
  explicit CublasLtGemm(size_t workspace_bytes = size_t(32) << 20);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // out{M, N} = x{M, K} · w{N, K}ᵀ (row-major, the checkpoint's Linear layout).
  // out is bf16 unless out_f32.
  void linear(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
              bool out_f32, cudaStream_t stream);

  // Per-head product: out{T, H, N} = x{T, H, Kx}[:, :, :K] · w[h], with w
  // {H, K, N} (transpose_w false) or {H, N, K} (transpose_w true). One
  // batched call; Kx >= K lets q_nope be read in place from q.
  void head_bmm(const __nv_bfloat16* x, const __nv_bfloat16* w, bool transpose_w, int64_t tokens,
                int64_t heads, int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out,
                cudaStream_t stream);
  // The same with out{T, H, out_head_stride}[:, :, :N] (out_head_stride >= n):
  // q_nope·W_UK written straight into the absorbed attention's q rows.
  void head_bmm(const __nv_bfloat16* x, const __nv_bfloat16* w, bool transpose_w, int64_t tokens,
                int64_t heads, int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out,
                int64_t out_head_stride, cudaStream_t stream);

 private:
  // A column-major problem D{m, n} = op(A){m, k} · B{k, n}, batched by strides.
  struct Problem {
    int64_t m, n, k, batch, lda, ldb, ldc, stride_a, stride_b, stride_c;
    bool trans_a, out_f32;
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, bool, bool>;
    Key key() const { return {m, n, k, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, trans_a, out_f32}; }
  };
  struct Plan;
  const Plan& plan_for(const Problem& p);
  void run(const Problem& p, const void* a, const void* b, void* d, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<Problem::Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace mlaserve::cuda

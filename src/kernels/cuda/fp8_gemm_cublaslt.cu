#include "kernels/cuda/fp8_gemm_cublaslt.h"

#include <string>

#include "kernels/cuda/cublaslt_plan.h"
#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {
namespace {

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value, const char* what) {
  check_cublaslt(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
}

}  // namespace

struct Fp8CublasLtGemm::Plan : CublasLtMatmulPlan {
  bool supported = false;
};

Fp8CublasLtGemm::Fp8CublasLtGemm(size_t workspace_bytes) : workspace_(workspace_bytes) {
  check_cublaslt(cublasLtCreate(&handle_), "cublasLtCreate");
}

Fp8CublasLtGemm::~Fp8CublasLtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

bool Fp8CublasLtGemm::shape_allowed(int64_t m, int64_t n, int64_t k) {
  return m > 0 && m % 4 == 0 && n > 0 && n % 16 == 0 && k > 0 && k % 512 == 0;
}

// cuBLAS is column-major, so it computes outᵀ{N, M} = w{N, K} · xᵀ{K, M}:
// A = w (K x N, ld K, transposed), B = x (K x M, ld K), D = out (N x M, ld N).
// The weight is A, so its 128x128 blocks run along cuBLAS's M; the tokens
// are B, whose 1x128 scales are stored with the token index contiguous.
const Fp8CublasLtGemm::Plan& Fp8CublasLtGemm::plan_for(int64_t m, int64_t n, int64_t k) {
  auto& slot = plans_[{m, n, k}];
  if (slot) return *slot;
  auto plan = std::make_unique<Plan>();
  check_cublaslt(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc create");
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "transa");
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "transb");
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
           "A scale mode");
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F),
           "B scale mode");
  check_cublaslt(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, k, n, k), "layout a");
  check_cublaslt(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, k, m, k), "layout b");
  check_cublaslt(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_16BF, n, m, n), "layout d");
  // The heuristic checks the scale modes too, so it needs placeholder
  // (non-null, aligned) scale pointers; the real ones are set per call.
  const void* placeholder = workspace_.get();
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, placeholder, "A scale pointer");
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, placeholder, "B scale pointer");

  cublasLtMatmulPreference_t pref;
  check_cublaslt(cublasLtMatmulPreferenceCreate(&pref), "preference create");
  const size_t ws = workspace_.bytes();
  check_cublaslt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "preference workspace");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                                          pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  plan->supported = s == CUBLAS_STATUS_SUCCESS && found > 0;
  if (plan->supported) plan->algo = result.algo;
  slot = std::move(plan);
  return *slot;
}

bool Fp8CublasLtGemm::linear(const uint8_t* x_q, const float* x_scale, const uint8_t* w, const float* w_scale,
                             int64_t m, int64_t n, int64_t k, __nv_bfloat16* out, cudaStream_t stream) {
  if (!shape_allowed(m, n, k)) return false;
  const Plan& plan = plan_for(m, n, k);
  if (!plan.supported) return false;
  set_attr(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scale), "A scale pointer");
  set_attr(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x_scale), "B scale pointer");
  const float alpha = 1.0f, beta = 0.0f;
  check_cublaslt(cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.a, x_q, plan.b, &beta, out, plan.d, out, plan.d,
                          &plan.algo, workspace_.get(), workspace_.bytes(), stream),
           "cublasLtMatmul");
  return true;
}

}  // namespace mlaserve::cuda

#include "kernels/cuda/gemm_cublaslt.h"

#include <memory>

#include "core/error.h"
#include "kernels/cuda/cublaslt_plan.h"

namespace mlaserve::cuda {

struct CublasLtGemm::Plan : CublasLtMatmulPlan {};

CublasLtGemm::CublasLtGemm(size_t workspace_bytes) : workspace_(workspace_bytes) {
  check_cublaslt(cublasLtCreate(&handle_), "cublasLtCreate");
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

const CublasLtGemm::Plan& CublasLtGemm::plan_for(const Problem& p) {
  auto it = plans_.find(p.key());
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  check_cublaslt(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc create");
  const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  check_cublaslt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "transa");
  check_cublaslt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "transb");
  const uint64_t a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
  check_cublaslt(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, a_rows, a_cols, p.lda), "layout a");
  check_cublaslt(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, p.k, p.n, p.ldb), "layout b");
  check_cublaslt(cublasLtMatrixLayoutCreate(&plan->d, p.out_f32 ? CUDA_R_32F : CUDA_R_16BF, p.m, p.n, p.ldc),
           "layout d");
  if (p.batch > 1) {
    const int32_t count = int32_t(p.batch);
    struct {
      cublasLtMatrixLayout_t layout;
      int64_t stride;
    } batched[] = {{plan->a, p.stride_a}, {plan->b, p.stride_b}, {plan->d, p.stride_c}};
    for (auto& l : batched) {
      check_cublaslt(cublasLtMatrixLayoutSetAttribute(l.layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
               "batch count");
      check_cublaslt(cublasLtMatrixLayoutSetAttribute(l.layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &l.stride,
                                                sizeof(l.stride)),
               "batch stride");
    }
  }
  cublasLtMatmulPreference_t pref;
  check_cublaslt(cublasLtMatmulPreferenceCreate(&pref), "preference create");
  const uint64_t ws = workspace_.bytes();
  check_cublaslt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "preference workspace");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                                          pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MLA_CHECK(s == CUBLAS_STATUS_SUCCESS && found > 0,
            "gemm: cuBLASLt has no algorithm for m={} n={} k={} batch={} (status {})", p.m, p.n, p.k, p.batch,
            int(s));
  plan->algo = result.algo;
  const Plan& ref = *plan;
  plans_.emplace(p.key(), std::move(plan));
  return ref;
}

void CublasLtGemm::run(const Problem& p, const void* a, const void* b, void* d, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  const Plan& plan = plan_for(p);
  const float alpha = 1.0f, beta = 0.0f;
  check_cublaslt(cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d, &plan.algo,
                          workspace_.get(), workspace_.bytes(), stream),
           "cublasLtMatmul");
}

void CublasLtGemm::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k,
                          void* out, bool out_f32, cudaStream_t stream) {
  // Row-major out{m, n} is column-major out^T{n, m} = w{N,K} (col-major K x N, transposed) · x^T.
  Problem p{.m = n, .n = m, .k = k, .batch = 1, .lda = k, .ldb = k, .ldc = n, .stride_a = 0, .stride_b = 0,
            .stride_c = 0, .trans_a = true, .out_f32 = out_f32};
  run(p, w, x, out, stream);
}

void CublasLtGemm::head_bmm(const __nv_bfloat16* x, const __nv_bfloat16* w, bool transpose_w, int64_t tokens,
                            int64_t heads, int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out,
                            cudaStream_t stream) {
  head_bmm(x, w, transpose_w, tokens, heads, x_head_stride, k, n, out, n, stream);
}

void CublasLtGemm::head_bmm(const __nv_bfloat16* x, const __nv_bfloat16* w, bool transpose_w, int64_t tokens,
                            int64_t heads, int64_t x_head_stride, int64_t k, int64_t n, __nv_bfloat16* out,
                            int64_t out_head_stride, cudaStream_t stream) {
  // Per head h, column-major out_h^T{n, T} (ld H*out_head_stride) = op(w_h){n, k} · x_h^T{k, T} (ld H*Kx).
  // w_h {K, N} row-major is column-major n x k (ld n, no transpose);
  // w_h {N, K} row-major is column-major k x n (ld k, transposed).
  Problem p{.m = n, .n = tokens, .k = k, .batch = heads, .lda = transpose_w ? k : n, .ldb = heads * x_head_stride,
            .ldc = heads * out_head_stride, .stride_a = k * n, .stride_b = x_head_stride, .stride_c = out_head_stride,
            .trans_a = transpose_w,
            .out_f32 = false};
  run(p, w, x, out, stream);
}

}  // namespace mlaserve::cuda

#pragma once
// What the bf16 and FP8 cuBLASLt wrappers share: the status check and the
// descriptors one matmul plan owns (made once per shape, reused per call).
#include <cublasLt.h>

#include <string>

#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {

inline void check_cublaslt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) raise_error(std::string("cuBLASLt (") + what + "): " + cublasLtGetStatusString(s));
}

struct CublasLtMatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  CublasLtMatmulPlan() = default;
  CublasLtMatmulPlan(const CublasLtMatmulPlan&) = delete;
  CublasLtMatmulPlan& operator=(const CublasLtMatmulPlan&) = delete;
  ~CublasLtMatmulPlan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

}  // namespace mlaserve::cuda

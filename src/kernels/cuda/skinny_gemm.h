#pragma once
// GEMMs with few activation rows (decode steps of small batches):
// out{M, N} = x{M, K} · w{N, K}ᵀ with M <= kSkinnyMaxRows. Pure weight
// streaming: one warp per output column reads that weight row once with
// 16-byte loads and dots it with every activation row (served from L1/L2).
// cuBLASLt's kernels for M = 1 reach about 1/3 of the bandwidth on the
// 2-12 MB matrices of a decode step.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

constexpr int kSkinnyMaxRows = 8;

// True when the shape suits the kernel (M small, K a multiple of 8).
bool skinny_gemm_applies(int64_t m, int64_t k);

void skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
                 bool out_f32, cudaStream_t stream);

}  // namespace mlaserve::cuda

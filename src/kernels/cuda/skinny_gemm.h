#pragma once
// GEMMs with few activation rows (decode steps of small batches):
// out{M, N} = x{M, K} · w{N, K}ᵀ with M <= kSkinnyMaxRows. Pure weight
// streaming: each warp reads one to four weight rows (or a slice of a long
// row) once, with all its 16-byte loads issued together before it waits for
// the previous kernel, and dots them with every activation row (served from
// L1/L2). cuBLASLt's kernels for M = 1 reach about 1/3 of the bandwidth on
// the 2-15 MB matrices of a decode step.
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

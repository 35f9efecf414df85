#pragma once
// GEMMs with few activation rows (decode steps of small batches):
// out{M, N} = x{M, K} · w{N, K}ᵀ with M <= kSkinnyMaxRows. Pure weight
// streaming: each warp reads one to four weight rows (or a slice of a long
// row) once, with all its 16-byte loads issued together before it waits for
// the previous kernel, and dots them with every activation row (served from
// L1/L2). cuBLASLt's kernels for M = 1 reach about 1/3 of the bandwidth on
// the 2-15 MB matrices of a decode step. The weights are bf16 or block-FP8
// (e4m3 with the checkpoint's 128 x 128 scales; x stays bf16, unquantized,
// as in the small MoE and head_bmm's streaming kernel).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

constexpr int kSkinnyMaxRows = 8;

// One row of rms_norm (elementwise.h) formed inside the GEMM's launch: x
// (plus residual, when set, which then receives the sums) normed by weight.
// arrivals: a zeroed device counter, left zeroed, which no other launch
// uses at the same time.
struct SkinnyRmsNorm {
  const __nv_bfloat16* x = nullptr;
  __nv_bfloat16* residual = nullptr;
  const __nv_bfloat16* weight = nullptr;
  float eps = 0.0f;
  unsigned* arrivals = nullptr;
};
// rms_norm's 256-thread rows (its bits) from 2048 columns; the row is
// held in shared memory.
constexpr int64_t kSkinnyNormMinWidth = 2048, kSkinnyNormMaxWidth = 16384;

// True when the shape suits the kernel (M small, K a multiple of 8).
bool skinny_gemm_applies(int64_t m, int64_t k);

void skinny_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, void* out,
                 bool out_f32, cudaStream_t stream);

// The block-FP8 form: w{N, K} e4m3, w_scale[n / 128][k / 128] (ceil(K / 128)
// a row), x rows x_ld apart (16-byte aligned), bf16 out{M, N}.
bool skinny_gemm_fp8_applies(int64_t m, int64_t k, int64_t x_ld);
void skinny_gemm_fp8(const __nv_bfloat16* x, int64_t x_ld, const uint8_t* w, const float* w_scale, int64_t m,
                     int64_t n, int64_t k, __nv_bfloat16* out, cudaStream_t stream);

// out{1, N} = rms_norm(x [+ residual]) · w{N, K}ᵀ, block-FP8 w: the norm's
// bits, then skinny_gemm_fp8's, in one launch (the decode step's input norm
// and q_a + kv_a projection).
bool skinny_gemm_fp8_rms_norm_applies(int64_t k);
void skinny_gemm_fp8_rms_norm(const SkinnyRmsNorm& norm, const uint8_t* w, const float* w_scale, int64_t n, int64_t k,
                              __nv_bfloat16* out, cudaStream_t stream);

}  // namespace mlaserve::cuda

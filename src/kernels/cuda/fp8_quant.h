#pragma once
// Dynamic block-FP8 activation quantization (DeepSeek-V3's 1x128 scheme,
// seed 002 §3.1): every 128-wide group of a row gets its own f32 scale
//   scale = max(amax(group), 1e-10) / 448,   q = e4m3(x / scale)
// so x ≈ q * scale. Fused into the ops that produce GEMM inputs (RMSNorm,
// SiLU-and-mul) so the bf16 activation is never written.
//
// Scale layout ("token-contiguous"): scale[kb * scale_ld + row], with
// scale_ld = fp8_act_scale_ld(rows), the layout cuBLASLt's
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F expects for the token operand.
// Rows in [rows, scale_ld) of q and scale are written as zeros, so a GEMM
// over the padded row count reads only defined memory.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

constexpr int kFp8Group = 128;
constexpr float kFp8ScaleEps = 1e-10f;

// Leading dimension of the scale array: rows padded to a multiple of 4
// (cuBLASLt wants 16-byte aligned scale columns).
inline int64_t fp8_act_scale_ld(int64_t rows) { return (rows + 3) / 4 * 4; }

// q{rows, width} and scale for x rows of `width` bf16 values, x_row_stride
// apart (>= width; q_nope is quantized in place from q{T, H, 192}).
// width % 128 == 0.
void quantize_fp8_act(const __nv_bfloat16* x, int64_t rows, int64_t width, int64_t x_row_stride, uint8_t* q,
                      float* scale, int64_t scale_ld, cudaStream_t stream);

// q, scale of rmsnorm(x) * w, the normalized row rounded to bf16 first (as
// the unfused path would store it). With residual != null: residual += x,
// and the sum is normalized (the fused pre-norm residual add).
void rms_norm_quantize_fp8(const __nv_bfloat16* x, const __nv_bfloat16* w, float eps, int64_t rows, int64_t dim,
                           uint8_t* q, float* scale, int64_t scale_ld, __nv_bfloat16* residual,
                           cudaStream_t stream);

// q, scale of silu(gate) * up (rounded to bf16 first), gate/up rows
// in_stride apart (2I for one [gate | up] tensor). inter % 128 == 0.
void silu_and_mul_quantize_fp8(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                               int64_t rows, int64_t inter, uint8_t* q, float* scale, int64_t scale_ld,
                               cudaStream_t stream);

}  // namespace mlaserve::cuda

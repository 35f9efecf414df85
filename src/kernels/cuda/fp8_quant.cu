#include "kernels/cuda/fp8_quant.h"

#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kThreads = 256, kGroupsPerPass = kThreads / 16;

// Rows [rows, scale_ld) of q and scale: zeros (see fp8_quant.h).
__device__ __forceinline__ bool write_pad_row(int64_t row, int64_t rows, int64_t width, uint8_t* q, float* scale,
                                              int64_t scale_ld) {
  if (row < rows) return false;
  for (int64_t i = threadIdx.x * 16; i < width; i += kThreads * 16)
    *reinterpret_cast<uint4*>(q + row * width + i) = make_uint4(0, 0, 0, 0);
  for (int64_t g = threadIdx.x; g < width / kFp8Group; g += kThreads) scale[g * scale_ld + row] = 0.0f;
  return true;
}

__device__ __forceinline__ void store_group_part(const QuantizedGroupPart& part, uint8_t* q_group, float* scale) {
  const int j = threadIdx.x & 15;
  *reinterpret_cast<uint2*>(q_group + 8 * j) = part.q;
  if (j == 0) *scale = part.scale;
}

// One block a row; 16 lanes a 128-wide group.
__global__ void __launch_bounds__(kThreads) quantize_kernel(const __nv_bfloat16* x, int64_t rows, int64_t width,
                                                             int64_t x_row_stride, uint8_t* q, float* scale,
                                                             int64_t scale_ld) {
  const int64_t row = blockIdx.x;
  if (write_pad_row(row, rows, width, q, scale, scale_ld)) return;
  const int64_t groups = width / kFp8Group;
  // Every lane of a warp runs the same number of iterations (the shuffles
  // need the whole warp): lanes past the last group quantize zeros and store nothing.
  const int64_t passes = (groups + kGroupsPerPass - 1) / kGroupsPerPass;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t g = p * kGroupsPerPass + threadIdx.x / 16;
    const bool live = g < groups;
    float v[8] = {};
    if (live) Bf16x8::load(x + row * x_row_stride + g * kFp8Group + (threadIdx.x & 15) * 8).to_float(v);
    const QuantizedGroupPart part = quantize_group_16lanes(v);
    if (live) store_group_part(part, q + row * width + g * kFp8Group, scale + g * scale_ld + row);
  }
}

__global__ void __launch_bounds__(kThreads) rms_norm_quantize_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                                      float eps, int64_t rows, int64_t dim, uint8_t* q,
                                                                      float* scale, int64_t scale_ld,
                                                                      __nv_bfloat16* residual) {
  const int64_t row = blockIdx.x;
  if (write_pad_row(row, rows, dim, q, scale, scale_ld)) return;
  const __nv_bfloat16* xr = x + row * dim;
  __nv_bfloat16* rr = residual ? residual + row * dim : nullptr;
  const __nv_bfloat16* src = rr ? rr : xr;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x * 8; i < dim; i += kThreads * 8) {
    float v[8];
    Bf16x8::load(xr + i).to_float(v);
    if (rr) {
      float r[8];
      Bf16x8::load(rr + i).to_float(r);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += r[j];
      const Bf16x8 s = Bf16x8::from_float(v);
      s.store(rr + i);
      s.to_float(v);  // normalize what the residual stream now holds
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  // block_sum's __syncthreads also orders the residual stores before the
  // rereads below.
  const float inv_rms = rsqrtf(block_sum(ss) / float(dim) + eps);
  const int64_t groups = dim / kFp8Group, passes = (groups + kGroupsPerPass - 1) / kGroupsPerPass;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t g = p * kGroupsPerPass + threadIdx.x / 16;
    const bool live = g < groups;
    float v[8] = {};
    if (live) {
      const int64_t i = g * kFp8Group + (threadIdx.x & 15) * 8;
      float wv[8];
      Bf16x8::load(src + i).to_float(v);
      Bf16x8::load(w + i).to_float(wv);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(__float2bfloat16(v[j] * inv_rms * wv[j]));
    }
    const QuantizedGroupPart part = quantize_group_16lanes(v);
    if (live) store_group_part(part, q + row * dim + g * kFp8Group, scale + g * scale_ld + row);
  }
}

__global__ void __launch_bounds__(kThreads) silu_and_mul_quantize_kernel(const __nv_bfloat16* gate,
                                                                          const __nv_bfloat16* up,
                                                                          int64_t in_stride, int64_t rows,
                                                                          int64_t inter, uint8_t* q, float* scale,
                                                                          int64_t scale_ld) {
  const int64_t row = blockIdx.x;
  if (write_pad_row(row, rows, inter, q, scale, scale_ld)) return;
  const int64_t groups = inter / kFp8Group, passes = (groups + kGroupsPerPass - 1) / kGroupsPerPass;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t g = p * kGroupsPerPass + threadIdx.x / 16;
    const bool live = g < groups;
    float v[8] = {};
    if (live) {
      const int64_t i = row * in_stride + g * kFp8Group + (threadIdx.x & 15) * 8;
      float u[8];
      Bf16x8::load(gate + i).to_float(v);
      Bf16x8::load(up + i).to_float(u);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        v[j] = __bfloat162float(__float2bfloat16(v[j] / (1.0f + __expf(-v[j])) * u[j]));
    }
    const QuantizedGroupPart part = quantize_group_16lanes(v);
    if (live) store_group_part(part, q + row * inter + g * kFp8Group, scale + g * scale_ld + row);
  }
}

void check_shape(const char* op, int64_t rows, int64_t width, int64_t scale_ld) {
  MLA_CUDA_REQUIRE(width > 0 && width % kFp8Group == 0,
                   std::string(op) + ": width " + std::to_string(width) + " is not a positive multiple of 128");
  MLA_CUDA_REQUIRE(rows >= 0 && scale_ld >= rows,
                   std::string(op) + ": scale_ld " + std::to_string(scale_ld) + " < rows " + std::to_string(rows));
}

}  // namespace

void quantize_fp8_act(const __nv_bfloat16* x, int64_t rows, int64_t width, int64_t x_row_stride, uint8_t* q,
                      float* scale, int64_t scale_ld, cudaStream_t stream) {
  check_shape("quantize_fp8_act", rows, width, scale_ld);
  MLA_CUDA_REQUIRE(x_row_stride >= width && x_row_stride % 8 == 0,
                   "quantize_fp8_act: row stride " + std::to_string(x_row_stride) +
                       " must be >= width and a multiple of 8");
  if (scale_ld == 0) return;
  quantize_kernel<<<scale_ld, kThreads, 0, stream>>>(x, rows, width, x_row_stride, q, scale, scale_ld);
  check_launch("quantize_fp8_act");
}

void rms_norm_quantize_fp8(const __nv_bfloat16* x, const __nv_bfloat16* w, float eps, int64_t rows, int64_t dim,
                           uint8_t* q, float* scale, int64_t scale_ld, __nv_bfloat16* residual,
                           cudaStream_t stream) {
  check_shape("rms_norm_quantize_fp8", rows, dim, scale_ld);
  if (scale_ld == 0) return;
  rms_norm_quantize_kernel<<<scale_ld, kThreads, 0, stream>>>(x, w, eps, rows, dim, q, scale, scale_ld, residual);
  check_launch("rms_norm_quantize_fp8");
}

void silu_and_mul_quantize_fp8(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                               int64_t rows, int64_t inter, uint8_t* q, float* scale, int64_t scale_ld,
                               cudaStream_t stream) {
  check_shape("silu_and_mul_quantize_fp8", rows, inter, scale_ld);
  MLA_CUDA_REQUIRE(in_stride >= inter && in_stride % 8 == 0,
                   "silu_and_mul_quantize_fp8: input row stride must be >= inter and a multiple of 8");
  if (scale_ld == 0) return;
  silu_and_mul_quantize_kernel<<<scale_ld, kThreads, 0, stream>>>(gate, up, in_stride, rows, inter, q, scale,
                                                                   scale_ld);
  check_launch("silu_and_mul_quantize_fp8");
}

}  // namespace mlaserve::cuda

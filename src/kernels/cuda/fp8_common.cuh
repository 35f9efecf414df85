#pragma once
// Device helpers shared by the FP8 kernels: e4m3 packing and widening, weight
// streaming loads, the 1x128 group quantizer run by 16 lanes, and the sm_89+
// FP8 tensor-core MMA.
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/l2_policy.cuh"

namespace mlaserve::cuda {

constexpr float kE4M3Max = 448.0f;

// Two values as e4m3 (round to nearest even, saturating), the first in the low byte.
__device__ __forceinline__ __nv_fp8x2_storage_t pack_e4m3x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  return uint32_t(pack_e4m3x2(a, b)) | (uint32_t(pack_e4m3x2(c, d)) << 16);
}

// The scale of a 1x128 group whose largest magnitude is amax (fp8_quant.h's
// scheme): the group is stored as e4m3(v / scale).
__device__ __forceinline__ float fp8_group_scale(float amax) { return fmaxf(amax, kFp8ScaleEps) / kE4M3Max; }

// Σ e4m3(w[i]) · x[i] over the 16 bytes of w, in f32 (e4m3 widens to f16 exactly).
__device__ __forceinline__ float e4m3x16_dot(uint4 w, const float (&x)[16]) {
  const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&w);
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3)));
    acc = fmaf(f.x, x[2 * i], acc);
    acc = fmaf(f.y, x[2 * i + 1], acc);
  }
  return acc;
}

__device__ __forceinline__ float e4m3_to_float(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

// Quantizes one 128-wide group held by 16 consecutive lanes (lane % 16 = j
// holds elements 8j..8j+7 in v): returns lane j's 8 e4m3 bytes and the
// group's scale. All 32 lanes of the warp must call it together.
struct QuantizedGroupPart {
  uint2 q;
  float scale;
};
__device__ __forceinline__ QuantizedGroupPart quantize_group_16lanes(const float (&v)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = fp8_group_scale(amax);
  const float inv = 1.0f / s;
  QuantizedGroupPart r;
  r.q.x = pack_e4m3x4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv);
  r.q.y = pack_e4m3x4(v[4] * inv, v[5] * inv, v[6] * inv, v[7] * inv);
  r.scale = s;
  return r;
}

// c += a · b for one m16n8k32 e4m3 tile, f32 accumulation. Fragments as
// mma.m16n8k32 with 8-bit types (PTX ISA), g = lane / 4, t = lane % 4:
//   A 16x32: a0 = (g, 4t..4t+3), a1 = (g+8, 4t..), a2 = (g, 16+4t..), a3 = (g+8, 16+4t..)
//   B 32x8:  b0 = (k 4t..4t+3, n g), b1 = (k 16+4t.., n g)
//   C 16x8:  c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
__device__ __forceinline__ void mma_e4m3_16832(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace mlaserve::cuda

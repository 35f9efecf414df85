#pragma once
// Writing and reading the FP8 latent cache (kernels/fp8_kv_layout.h) inside
// kernels: the attention kernels dequantize 8 channels of c_kv at a time;
// the generic forms serve any layout (tiny test models) one value at a time.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/fp8_kv_cache.h"

namespace mlaserve::cuda {

// Eight e4m3 values (packed little-endian in q) times scale s, as f32.
__device__ __forceinline__ void widen_e4m3x8(uint2 q, float s, float (&v)[8]) {
  const uint32_t words[2] = {q.x, q.y};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[w] >> (16 * h)), __NV_E4M3);
      const float2 f = __half22float2(__half2(pair));
      v[4 * w + 2 * h] = f.x * s;
      v[4 * w + 2 * h + 1] = f.y * s;
    }
  }
}

// Eight e4m3 values (packed little-endian in q) times s, as four f16 pairs:
// the widening is exact and the product is rounded once (2^-11 relative, so
// finer than bf16). For kernels whose tensor-core operands are f16.
__device__ __forceinline__ uint4 widen_e4m3x8_f16(uint2 q, __half2 s) {
  uint32_t out[4];
  const uint32_t words[2] = {q.x, q.y};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2 v =
          __hmul2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[w] >> (16 * h)), __NV_E4M3)), s);
      out[2 * w + h] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// c_kv[c .. c+7] of a slot (c a multiple of 8) as f32.
__device__ __forceinline__ void load_fp8_kv_latent8(const uint8_t* slot, const Fp8KvLayout& layout, int c,
                                                    float (&v)[8]) {
  const float s = reinterpret_cast<const float*>(slot + layout.scale_offset())[c / kFp8KvGroup];
  widen_e4m3x8(*reinterpret_cast<const uint2*>(slot + c), s, v);
}

// Value c of a slot's row [c_kv | k_pe] (c < L + R) as f32, any layout.
__device__ __forceinline__ float load_fp8_kv_value(const uint8_t* slot, const Fp8KvLayout& layout, int c) {
  if (c < layout.kv_lora_rank)
    return e4m3_to_float(slot[c]) * reinterpret_cast<const float*>(slot + layout.scale_offset())[c / kFp8KvGroup];
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(slot + layout.rope_offset())[c - layout.kv_lora_rank]);
}

// slot = fp8(row) for one bf16 row{L + R} (global or shared memory), by the
// whole block (blockDim.x a multiple of 32): warp w quantizes groups w,
// w + warps, ... Any layout; the arithmetic of quantize_group_16lanes.
__device__ inline void store_fp8_kv_row(const __nv_bfloat16* row, const Fp8KvLayout& layout, uint8_t* slot) {
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto* scales = reinterpret_cast<float*>(slot + layout.scale_offset());
  for (int g = warp; g < layout.num_groups(); g += warps) {
    const int c0 = g * kFp8KvGroup, n = min(kFp8KvGroup, layout.kv_lora_rank - c0);
    float amax = 0.0f;
    for (int i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(__bfloat162float(row[c0 + i])));
    amax = warp_max(amax);
    const float s = fmaxf(amax, kFp8KvScaleEps) / kFp8KvMax;
    const float inv = 1.0f / s;
    for (int i = lane; i < n; i += 32)
      slot[c0 + i] = __nv_cvt_float_to_fp8(__bfloat162float(row[c0 + i]) * inv, __NV_SATFINITE, __NV_E4M3);
    if (lane == 0) scales[g] = s;
  }
  auto* rope = reinterpret_cast<__nv_bfloat16*>(slot + layout.rope_offset());
  for (int i = threadIdx.x; i < layout.rope_dim; i += blockDim.x) rope[i] = row[layout.kv_lora_rank + i];
}

}  // namespace mlaserve::cuda

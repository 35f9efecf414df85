#pragma once
// Reading the FP8 latent cache (fp8_kv_cache.h) inside attention kernels:
// 8 channels of c_kv at a time, dequantized with their group's scale.
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/fp8_kv_cache.h"

namespace mlaserve::cuda {

// c_kv[c .. c+7] of a slot (c a multiple of 8) as f32.
__device__ __forceinline__ void load_fp8_kv_latent8(const uint8_t* slot, const Fp8KvLayout& layout, int c,
                                                    float (&v)[8]) {
  const uint2 q = *reinterpret_cast<const uint2*>(slot + c);
  const float s = reinterpret_cast<const float*>(slot + layout.scale_offset())[c / 128];
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

}  // namespace mlaserve::cuda

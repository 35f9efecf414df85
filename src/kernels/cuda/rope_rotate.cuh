#pragma once
// DeepSeek's interleaved RoPE rotation (Backend::rope) as device helpers, so
// every kernel that ropes q_pe or k_pe (rope_kernel, mla_prepare) writes the
// same bits: the angle formed in f32 as the reference does, sincosf (not
// __sincosf) so long positions stay accurate, cos and sin scaled by YaRN's
// factor before the rotation.
#include <cuda_bf16.h>

namespace mlaserve::cuda {

// {cos, sin} of position * inv_freq, both times scale.
__device__ __forceinline__ float2 rope_cos_sin(float position, float inv_freq, float scale) {
  float s, c;
  sincosf(position * inv_freq, &s, &c);
  return make_float2(c * scale, s * scale);
}

// The pair (a, b) rotated by cs = rope_cos_sin(...), rounded to bf16.
__device__ __forceinline__ __nv_bfloat162 rope_rotate(float a, float b, float2 cs) {
  return __floats2bfloat162_rn(a * cs.x - b * cs.y, b * cs.x + a * cs.y);
}

}  // namespace mlaserve::cuda

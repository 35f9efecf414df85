#pragma once
// 16-byte vectors of eight bf16 values, the unit of every memory-bound
// kernel here (HOPPER.md: 16-byte accesses per thread, coalesced).
#include <cuda_bf16.h>

#include <cstdint>

namespace mlaserve::cuda {

// The two bf16 of a 32-bit word as floats (low half first), exactly, in two
// integer ops where __bfloat1622float2 takes three (a PRMT, then a shift for
// each half): what bounds a GEMV from shared memory, and a step's small
// kernels a little too (perf.md, session 29).
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];

  __device__ __forceinline__ static Bf16x8 load(const __nv_bfloat16* p) {
    Bf16x8 v;
    *reinterpret_cast<uint4*>(&v) = *reinterpret_cast<const uint4*>(p);
    return v;
  }
  __device__ __forceinline__ void store(__nv_bfloat16* p) const {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(this);
  }
  __device__ __forceinline__ void to_float(float (&f)[8]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = bf16x2_to_float2(reinterpret_cast<const uint32_t*>(h)[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
  __device__ __forceinline__ static Bf16x8 from_float(const float (&f)[8]) {
    Bf16x8 v;
#pragma unroll
    for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return v;
  }
};

// 16 bytes of bf16 (a weight chunk loaded as uint4) as 8 floats.
__device__ __forceinline__ void bf16x8_to_float(uint4 v, float (&f)[8]) {
  Bf16x8 b;
  *reinterpret_cast<uint4*>(&b) = v;
  b.to_float(f);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x * blockDim.y threads (blockDim.x a multiple
// of 32, at most 1024 in all): the warps in order of their linear thread
// index, so a 2D block sums as a 1D block of as many threads.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int t = threadIdx.y * blockDim.x + threadIdx.x, lane = t & 31, warp = t >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x * blockDim.y) >> 5;
  v = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

}  // namespace mlaserve::cuda

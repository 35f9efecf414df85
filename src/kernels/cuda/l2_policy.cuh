#pragma once
// L2 eviction policies for loads and bulk copies (.L2::cache_hint operands),
// and the streamed weights' load that uses one.
#include <cstdint>

namespace mlaserve::cuda {

// Data read once a step (weights): first to leave L2, so that a step's
// gigabytes of weights do not push out what the next kernels re-read (their
// code, the latent cache, activations).
__device__ __forceinline__ uint64_t stream_once_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes read once (weights streamed by the decode GEMVs): kept out of L1,
// where the activations every warp re-reads stay, and first to leave L2.
__device__ __forceinline__ uint4 load_streamed_16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(stream_once_policy()));
  return v;
}

}  // namespace mlaserve::cuda

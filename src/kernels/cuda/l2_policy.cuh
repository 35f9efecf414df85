#pragma once
// L2 eviction policies for loads and bulk copies (.L2::cache_hint operands).
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

}  // namespace mlaserve::cuda

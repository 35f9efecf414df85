#pragma once
// L2 residency hints for weight streams (PTX createpolicy / .L2::cache_hint).
// NOTES: a decode step reads most weights exactly once, so their lines are
// worthless after the load; marked evict-first, they leave L2 before the
// lines l2_prefetch pulled in ahead of their reader (l2_prefetch.h), which
// otherwise the ~30 MB a V2-Lite attention chain streams would push out.
#include <cstdint>

namespace mlaserve::cuda {

__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes read once: kept out of L1 (activations live there) and first out of L2.
__device__ __forceinline__ uint4 load_streamed_16(const void* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

}  // namespace mlaserve::cuda

#pragma once
// The FP8 latent KV cache's CUDA store and load (layout and scheme:
// kernels/fp8_kv_layout.h). The attention kernels dequantize with
// fp8_kv_cache.cuh while reading a slot.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/fp8_kv_layout.h"

namespace mlaserve::cuda {

using ::mlaserve::Fp8KvLayout;

// cache[slots[t]] = fp8(rows[t]) for rows{T, L + R} bf16.
void fp8_kv_store(const Fp8KvLayout& layout, const __nv_bfloat16* rows, const int32_t* slots, int64_t num_rows,
                  uint8_t* cache, cudaStream_t stream);
// out[i] = bf16(dequant(cache[slots[i]])) for out{n, L + R}.
void fp8_kv_load(const Fp8KvLayout& layout, const uint8_t* cache, const int32_t* slots, int64_t num_rows,
                 __nv_bfloat16* out, cudaStream_t stream);
// Whether the vectorized kernels (16-byte accesses) fit the layout: L a
// multiple of 128, R of 8, and 16-byte aligned k_pe and slots (V3's 512/64).
constexpr bool fp8_kv_is_vectorizable(const Fp8KvLayout& l) {
  return l.kv_lora_rank % 128 == 0 && l.rope_dim % 8 == 0 && l.rope_offset() % 16 == 0 && l.slot_bytes() % 16 == 0;
}

}  // namespace mlaserve::cuda

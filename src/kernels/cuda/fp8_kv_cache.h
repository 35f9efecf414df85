#pragma once
// FP8 latent KV cache (--kv-cache-dtype fp8_e4m3). A slot holds one token's
// MLA latent row [c_kv (L) | k_pe (R)] as
//   [ L bytes e4m3 c_kv | L/128 f32 scales | R bf16 k_pe ]
// i.e. 656 bytes for DeepSeek-V3 (L 512, R 64) against 1152 in bf16: 1.76x
// the tokens in the same memory. c_kv is quantized per 128 channels with
// scale = max(amax, 1e-10) / 448 (the activation scheme, so no calibration
// and no outlier can saturate); k_pe stays bf16 because RoPE'd positions
// are what attention resolves order with and are only 64 of 576 values.
// This is FlashMLA's FP8 cache layout; the attention kernels dequantize
// with fp8_kv_cache.cuh while reading a slot.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mlaserve::cuda {

struct Fp8KvLayout {
  int kv_lora_rank = 512, rope_dim = 64;  // L (multiple of 128), R (multiple of 8)
  // constexpr: callable from device code too (--expt-relaxed-constexpr).
  constexpr int64_t scale_offset() const { return kv_lora_rank; }
  constexpr int64_t rope_offset() const { return kv_lora_rank + 4 * (kv_lora_rank / 128); }
  constexpr int64_t slot_bytes() const { return rope_offset() + 2 * int64_t(rope_dim); }
};

// cache[slots[t]] = fp8(rows[t]) for rows{T, L + R} bf16.
void fp8_kv_store(const Fp8KvLayout& layout, const __nv_bfloat16* rows, const int32_t* slots, int64_t num_rows,
                  uint8_t* cache, cudaStream_t stream);
// out[i] = bf16(dequant(cache[slots[i]])) for out{n, L + R}.
void fp8_kv_load(const Fp8KvLayout& layout, const uint8_t* cache, const int32_t* slots, int64_t num_rows,
                 __nv_bfloat16* out, cudaStream_t stream);

}  // namespace mlaserve::cuda

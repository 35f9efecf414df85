#pragma once
// The FP8 latent KV cache (--kv-cache-dtype fp8_e4m3), shared by every
// backend. A cache tensor of dtype U8 {slots, slot_bytes} holds one token's
// MLA latent row [c_kv (L) | k_pe (R)] per slot as
//   [ L bytes e4m3 c_kv | ceil(L/128) f32 scales | R bf16 k_pe ]
// (FlashMLA's layout): 656 bytes for DeepSeek-V3 (L 512, R 64) against 1152
// in bf16, 1.76x the tokens in the same memory. c_kv is quantized per 128
// channels (the last group may be narrower) with scale = max(amax, 1e-10) /
// 448 and e4m3 = round-to-nearest-even(v * (1 / scale)), saturating: the
// activation scheme, so no calibration and no outlier can saturate. k_pe
// stays bf16 because RoPE'd positions are what attention resolves order with
// and are only 64 of 576 values. A bf16/f32 cache is {slots, L + R} of that
// dtype; ops dispatch on the cache tensor's dtype, so caches of both kinds
// can coexist (the MTP block's, tests).
#include <cstdint>

namespace mlaserve {

constexpr int kFp8KvGroup = 128;    // c_kv channels sharing one scale
constexpr float kFp8KvMax = 448.0f;  // largest finite e4m3
constexpr float kFp8KvScaleEps = 1e-10f;

struct Fp8KvLayout {
  int kv_lora_rank = 512, rope_dim = 64;  // L (multiple of 8), R (even)
  // constexpr: callable from device code too (--expt-relaxed-constexpr).
  constexpr int64_t num_groups() const { return (kv_lora_rank + kFp8KvGroup - 1) / kFp8KvGroup; }
  constexpr int64_t scale_offset() const { return kv_lora_rank; }
  constexpr int64_t rope_offset() const { return kv_lora_rank + 4 * num_groups(); }
  constexpr int64_t slot_bytes() const { return rope_offset() + 2 * int64_t(rope_dim); }
  constexpr int64_t row_width() const { return int64_t(kv_lora_rank) + rope_dim; }
};

// The layout whose rows are row_width = L + R wide and whose slots are
// slot_bytes long. Unique: with L a multiple of 8, slot_bytes = 2 (L + R) -
// L + 4 ceil(L / 128) falls strictly as L grows. Throws naming both numbers
// when no layout fits.
Fp8KvLayout fp8_kv_layout_for(int64_t row_width, int64_t slot_bytes);
// Throws unless L is a multiple of 8 and R is even.
void check_fp8_kv_layout(const Fp8KvLayout& layout);

}  // namespace mlaserve

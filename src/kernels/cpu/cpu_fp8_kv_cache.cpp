#include "kernels/cpu/cpu_fp8_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace mlaserve::cpu {

void fp8_kv_store_row(const float* row, const Fp8KvLayout& layout, uint8_t* slot) {
  const int64_t L = layout.kv_lora_rank;
  for (int64_t g = 0; g < layout.num_groups(); ++g) {
    const int64_t c0 = g * kFp8KvGroup, c1 = std::min<int64_t>(c0 + kFp8KvGroup, L);
    float amax = 0.0f;
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(row[c]));
    // The CUDA kernels' arithmetic: f32 scale, multiply by its reciprocal.
    const float s = std::max(amax, kFp8KvScaleEps) / kFp8KvMax;
    const float inv = 1.0f / s;
    for (int64_t c = c0; c < c1; ++c) slot[c] = f32_to_fp8e4m3(row[c] * inv);
    std::memcpy(slot + layout.scale_offset() + 4 * g, &s, 4);
  }
  for (int64_t i = 0; i < layout.rope_dim; ++i) {
    const uint16_t b = f32_to_bf16(row[L + i]);
    std::memcpy(slot + layout.rope_offset() + 2 * i, &b, 2);
  }
}

void fp8_kv_load_row(const uint8_t* slot, const Fp8KvLayout& layout, float* row) {
  const int64_t L = layout.kv_lora_rank;
  for (int64_t g = 0; g < layout.num_groups(); ++g) {
    float s;
    std::memcpy(&s, slot + layout.scale_offset() + 4 * g, 4);
    const int64_t c0 = g * kFp8KvGroup, c1 = std::min<int64_t>(c0 + kFp8KvGroup, L);
    for (int64_t c = c0; c < c1; ++c) row[c] = fp8e4m3_to_f32(slot[c]) * s;
  }
  for (int64_t i = 0; i < layout.rope_dim; ++i) {
    uint16_t b;
    std::memcpy(&b, slot + layout.rope_offset() + 2 * i, 2);
    row[L + i] = bf16_to_f32(b);
  }
}

}  // namespace mlaserve::cpu

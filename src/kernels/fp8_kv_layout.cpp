#include "kernels/fp8_kv_layout.h"

#include "core/error.h"

namespace mlaserve {

void check_fp8_kv_layout(const Fp8KvLayout& l) {
  MLA_CHECK(l.kv_lora_rank > 0 && l.kv_lora_rank % 8 == 0 && l.rope_dim >= 0 && l.rope_dim % 2 == 0,
            "fp8 kv cache: kv_lora_rank {} must be a positive multiple of 8 and rope dim {} even", l.kv_lora_rank,
            l.rope_dim);
}

Fp8KvLayout fp8_kv_layout_for(int64_t row_width, int64_t slot_bytes) {
  for (int64_t L = 8; L <= row_width; L += 8) {
    const Fp8KvLayout l{int(L), int(row_width - L)};
    if (l.rope_dim % 2 == 0 && l.slot_bytes() == slot_bytes) return l;
  }
  MLA_CHECK(false, "fp8 kv cache: no layout has {}-wide rows in {}-byte slots", row_width, slot_bytes);
  return {};
}

}  // namespace mlaserve

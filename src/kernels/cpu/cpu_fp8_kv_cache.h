#pragma once
// The FP8 latent cache's scheme (kernels/fp8_kv_layout.h) in plain C++: the
// CPU backend's cache writes and reads, and the reference the CUDA kernels
// are tested against.
#include <cstdint>

#include "kernels/fp8_kv_layout.h"

namespace mlaserve::cpu {

// slot = fp8(row) for row{L + R}: c_kv per 128-channel group, k_pe as bf16.
void fp8_kv_store_row(const float* row, const Fp8KvLayout& layout, uint8_t* slot);
// row{L + R} = the dequantized slot.
void fp8_kv_load_row(const uint8_t* slot, const Fp8KvLayout& layout, float* row);

}  // namespace mlaserve::cpu

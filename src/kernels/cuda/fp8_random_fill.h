#pragma once
// Device-side random FP8 weights for benchmarks (v3-slice-sized expert
// stacks are gigabytes): e4m3 bytes from a counter hash, NaN codes (0x7f,
// 0xff) replaced by 448, and f32 scales uniform in [lo, hi).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mlaserve::cuda {

void fill_random_e4m3(uint8_t* p, size_t n, uint32_t seed, cudaStream_t stream);
void fill_random_scales(float* p, size_t n, float lo, float hi, uint32_t seed, cudaStream_t stream);

}  // namespace mlaserve::cuda

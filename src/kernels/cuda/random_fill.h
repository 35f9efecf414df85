#pragma once
// Device-side random fill for benchmarks: uniform bf16 in [-1, 1) from a
// counter hash, so gigabytes of inputs cost milliseconds, not host uploads.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mlaserve::cuda {

void fill_random_bf16(__nv_bfloat16* p, size_t n, uint32_t seed, cudaStream_t stream);

}  // namespace mlaserve::cuda

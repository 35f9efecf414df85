#include "kernels/cuda/fp8_random_fill.h"

#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {
namespace {

__device__ __forceinline__ uint32_t hash(uint64_t i, uint32_t seed) {
  uint32_t x = uint32_t(i) ^ uint32_t(i >> 32) * 0x9e3779b9u ^ seed * 0x85ebca6bu;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__global__ void fill_e4m3_kernel(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint8_t b = uint8_t(hash(i, seed));
    if ((b & 0x7f) == 0x7f) b ^= 1;  // NaN -> +-448
    p[i] = b;
  }
}

__global__ void fill_scales_kernel(float* p, size_t n, float lo, float hi, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * float(hash(i, seed) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace

void fill_random_e4m3(uint8_t* p, size_t n, uint32_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_e4m3_kernel<<<2048, 256, 0, stream>>>(p, n, seed);
  check_launch("fill_random_e4m3");
}

void fill_random_scales(float* p, size_t n, float lo, float hi, uint32_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_scales_kernel<<<256, 256, 0, stream>>>(p, n, lo, hi, seed);
  check_launch("fill_random_scales");
}

}  // namespace mlaserve::cuda

#include "kernels/cuda/random_fill.h"

#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {
namespace {

__global__ void fill_random_kernel(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 0x9e3779b9u;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16(float(x & 0xffff) / 32768.0f - 1.0f);
  }
}

}  // namespace

void fill_random_bf16(__nv_bfloat16* p, size_t n, uint32_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<2048, 256, 0, stream>>>(p, n, seed);
  check_launch("fill_random_bf16");
}

}  // namespace mlaserve::cuda

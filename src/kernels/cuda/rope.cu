#include "kernels/cuda/rope.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope_rotate.cuh"

namespace mlaserve::cuda {
namespace {

// One thread a pair (rope_rotate.cuh's arithmetic).
__global__ void rope_kernel(__nv_bfloat16* x, int64_t num_pairs, int64_t heads, int64_t row_stride,
                            int64_t offset, const int32_t* positions, const float* inv_freq, int num_freqs,
                            float scale) {
  pdl_enter();
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p >= num_pairs) return;
  const int i = int(p % num_freqs);
  const int64_t row = p / num_freqs;
  auto* pair = reinterpret_cast<__nv_bfloat162*>(x + row * row_stride + offset) + i;
  const float2 v = __bfloat1622float2(*pair);
  *pair = rope_rotate(v.x, v.y, rope_cos_sin(float(positions[row / heads]), inv_freq[i], scale));
}

}  // namespace

void rope_inplace(__nv_bfloat16* x, int64_t num_tokens, int64_t heads, int64_t row_stride, int64_t offset,
                  const int32_t* positions, const float* inv_freq, int num_freqs, float cos_sin_scale,
                  cudaStream_t stream) {
  MLA_CUDA_REQUIRE(offset % 2 == 0 && row_stride % 2 == 0 && offset + 2 * num_freqs <= row_stride,
                   "rope: " + std::to_string(num_freqs) + " pairs at offset " + std::to_string(offset) +
                       " do not fit rows of " + std::to_string(row_stride));
  const int64_t pairs = num_tokens * heads * num_freqs;
  if (pairs == 0) return;
  launch_dependent(rope_kernel, unsigned((pairs + 255) / 256), 256, 0, stream, x, pairs, heads, row_stride, offset,
                   positions, inv_freq, num_freqs, cos_sin_scale);
  check_launch("rope");
}

}  // namespace mlaserve::cuda

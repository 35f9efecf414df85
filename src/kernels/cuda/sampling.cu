#include "kernels/cuda/sampling.h"

#include "kernels/cuda/cuda_check.h"

namespace mlaserve::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One block a row: strided scan (float4 loads), then a warp/block reduction.
__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* ids) {
  const float* row = logits + blockIdx.x * vocab;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) better(v, idx, row[i], int(i));
  for (int o = 16; o > 0; o >>= 1) better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  if (threadIdx.x % 32 == 0) {
    sv[threadIdx.x / 32] = v;
    si[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? sv[threadIdx.x] : -INFINITY;
    idx = threadIdx.x < kThreads / 32 ? si[threadIdx.x] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
    if (threadIdx.x == 0) ids[blockIdx.x] = idx;
  }
}

}  // namespace

void greedy_argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, ids);
  check_launch("greedy_argmax");
}

}  // namespace mlaserve::cuda

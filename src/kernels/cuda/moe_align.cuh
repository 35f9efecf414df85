#pragma once
// Token permutation for the grouped MoE GEMMs, shared by the bf16 and FP8
// expert paths.
#include <cstdint>

namespace mlaserve::cuda {
namespace {

// Groups assignments by expert (counting sort in one block): each expert's
// run starts on a block_m boundary; pads hold the sentinel `assignments`.
__global__ void moe_align_kernel(const int32_t* topk_ids, int assignments, int num_experts, int block_m,
                                 int max_rows, int32_t* sorted_ids, int32_t* block_expert, int32_t* num_padded,
                                 int32_t* position) {
  extern __shared__ int32_t sh[];
  int32_t* count = sh;                      // [E]
  int32_t* offset = count + num_experts;    // [E + 1]
  int32_t* cursor = offset + num_experts + 1;  // [E]
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) count[e] = cursor[e] = 0;
  for (int i = threadIdx.x; i < max_rows; i += blockDim.x) sorted_ids[i] = assignments;
  __syncthreads();
  for (int i = threadIdx.x; i < assignments; i += blockDim.x) atomicAdd(&count[topk_ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    offset[0] = 0;
    for (int e = 0; e < num_experts; ++e) offset[e + 1] = offset[e] + (count[e] + block_m - 1) / block_m * block_m;
    *num_padded = offset[num_experts];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
    for (int b = offset[e] / block_m; b < offset[e + 1] / block_m; ++b) block_expert[b] = e;
  for (int i = threadIdx.x; i < assignments; i += blockDim.x) {
    const int e = topk_ids[i];
    const int pos = offset[e] + atomicAdd(&cursor[e], 1);
    sorted_ids[pos] = i;
    position[i] = pos;
  }
}

}  // namespace
}  // namespace mlaserve::cuda

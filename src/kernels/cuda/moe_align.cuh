#pragma once
// Token permutation for the grouped MoE GEMMs and the combine after them,
// shared by the bf16, FP8 and sm90 expert paths.
//
// Assignment slots: each token has slots_per_token = top_k + num_shared
// slots; slot t * slots_per_token + j is the token's j-th routed expert
// (topk_ids[t * top_k + j], weight topk_weights[...]) for j < top_k, and
// shared expert j - top_k (stacked after the routed ones as expert
// num_experts + j - top_k, weight 1) otherwise. So slot / slots_per_token is
// always the token, as the GEMMs' row gather expects.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/bf16_vec.cuh"

namespace mlaserve::cuda {
namespace {

// The routing is read at L2 (ld.global.cg): the small-batch down kernel reads
// it before its PDL wait, while the kernel before it may still run.
struct MoeSlots {
  const int32_t* topk_ids;
  const float* topk_weights;
  int top_k, num_shared, num_experts;  // num_experts: routed ones

  __host__ __device__ __forceinline__ int per_token() const { return top_k + num_shared; }
  __device__ __forceinline__ int expert(int slot) const {
    const int t = slot / per_token(), j = slot % per_token();
    return j < top_k ? __ldcg(topk_ids + t * top_k + j) : num_experts + j - top_k;
  }
  __device__ __forceinline__ float weight(int slot) const {
    const int t = slot / per_token(), j = slot % per_token();
    return j < top_k ? __ldcg(topk_weights + t * top_k + j) : 1.0f;
  }
};

// Groups assignment slots by expert (counting sort in one block): each
// expert's run starts on a block_m boundary; pads hold the sentinel
// `assignments`. total_experts = routed + shared. With row_units, each
// expert's run of blocks is also cut into *num_row_units units of at most
// unit_blocks (<= 3) blocks, as even as possible: row_units[i] = first
// block * 4 + blocks. Shared memory: 3 (4 with row_units) * E + 1 ints.
__global__ void moe_align_kernel(MoeSlots slots, int assignments, int total_experts, int block_m, int max_rows,
                                 int32_t* sorted_ids, int32_t* block_expert, int32_t* num_padded,
                                 int32_t* position, int unit_blocks = 0, int32_t* row_units = nullptr,
                                 int32_t* num_row_units = nullptr) {
  extern __shared__ int32_t sh[];
  int32_t* count = sh;                           // [E]
  int32_t* offset = count + total_experts;       // [E + 1]
  int32_t* cursor = offset + total_experts + 1;  // [E]
  int32_t* unit_offset = cursor + total_experts;  // [E], with row_units
  for (int e = threadIdx.x; e < total_experts; e += blockDim.x) count[e] = cursor[e] = 0;
  for (int i = threadIdx.x; i < max_rows; i += blockDim.x) sorted_ids[i] = assignments;
  __syncthreads();
  // Each thread's expert ids are loaded kBatch at a time before their
  // atomics: one id per atomic made both loops wait on L2 once per slot.
  constexpr int kBatch = 8;
  auto load_experts = [&](int base, int (&e)[kBatch]) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + b * blockDim.x;
      e[b] = i < assignments ? slots.expert(i) : -1;
    }
  };
  for (int base = threadIdx.x; base < assignments; base += kBatch * blockDim.x) {
    int e[kBatch];
    load_experts(base, e);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (e[b] >= 0) atomicAdd(&count[e[b]], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    // Padded run lengths (and units) summed by warp 0: each lane a contiguous
    // range of experts, then a scan across the lanes.
    const int lane = threadIdx.x, per_lane = (total_experts + 31) / 32;
    const int e0 = min(lane * per_lane, total_experts), e1 = min(e0 + per_lane, total_experts);
    int rows = 0, units = 0;
    for (int e = e0; e < e1; ++e) {
      const int blocks = (count[e] + block_m - 1) / block_m;
      rows += blocks * block_m;
      if (row_units) units += (blocks + unit_blocks - 1) / unit_blocks;
    }
    int rows_before = rows, units_before = units;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int r = __shfl_up_sync(0xffffffffu, rows_before, o), u = __shfl_up_sync(0xffffffffu, units_before, o);
      if (lane >= o) rows_before += r, units_before += u;
    }
    rows_before -= rows;
    units_before -= units;
    for (int e = e0; e < e1; ++e) {
      const int blocks = (count[e] + block_m - 1) / block_m;
      offset[e] = rows_before;
      rows_before += blocks * block_m;
      if (row_units) {
        unit_offset[e] = units_before;
        units_before += (blocks + unit_blocks - 1) / unit_blocks;
      }
    }
    if (lane == 31) {
      offset[total_experts] = rows_before;
      *num_padded = rows_before;
      if (row_units) *num_row_units = units_before;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < total_experts; e += blockDim.x) {
    const int first = offset[e] / block_m, blocks = offset[e + 1] / block_m - first;
    for (int b = first; b < first + blocks; ++b) block_expert[b] = e;
    if (row_units) {
      const int n = (blocks + unit_blocks - 1) / unit_blocks;
      for (int i = 0; i < n; ++i)
        row_units[unit_offset[e] + i] = (first + i * blocks / n) * 4 + (i + 1) * blocks / n - i * blocks / n;
    }
  }
  for (int base = threadIdx.x; base < assignments; base += kBatch * blockDim.x) {
    int e[kBatch];
    load_experts(base, e);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (e[b] < 0) continue;
      const int i = base + b * blockDim.x, pos = offset[e[b]] + atomicAdd(&cursor[e[b]], 1);
      sorted_ids[pos] = i;
      position[i] = pos;
    }
  }
}

// Slots a token may have in moe_combine_kernel (its per-slot registers).
constexpr int kMoeCombineMaxSlots = 16;

// out[t] = addend[t] (if not null) + sum over the token's slots of weight *
// y[position[slot]], f32 sum in slot order. Positions and weights are read up
// front so the row loads that depend on them issue together (not one L2
// round trip each). One block per token.
__global__ void moe_combine_kernel(const __nv_bfloat16* y, const int32_t* position, MoeSlots slots,
                                   const __nv_bfloat16* addend, int hidden, __nv_bfloat16* out) {
  const int64_t t = blockIdx.x;
  const int per_token = slots.per_token();
  int64_t row[kMoeCombineMaxSlots];
  float wt[kMoeCombineMaxSlots];
#pragma unroll
  for (int j = 0; j < kMoeCombineMaxSlots; ++j) {
    const int slot = int(t) * per_token + j;
    row[j] = j < per_token ? int64_t(position[slot]) * hidden : 0;
    wt[j] = j < per_token ? slots.weight(slot) : 0.0f;
  }
  for (int d = threadIdx.x * 8; d < hidden; d += blockDim.x * 8) {
    float acc[8] = {};
    if (addend) Bf16x8::load(addend + t * hidden + d).to_float(acc);
#pragma unroll
    for (int j = 0; j < kMoeCombineMaxSlots; ++j) {
      if (j < per_token) {
        float v[8];
        Bf16x8::load(y + row[j] + d).to_float(v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += wt[j] * v[i];
      }
    }
    Bf16x8::from_float(acc).store(out + t * hidden + d);
  }
}

}  // namespace
}  // namespace mlaserve::cuda

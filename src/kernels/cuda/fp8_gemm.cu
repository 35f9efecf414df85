#include "kernels/cuda/fp8_gemm.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_common.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kRowsPerWarp = 16, kBlockN = kWarps * kRowsPerWarp;
static_assert(kBlockN == 128, "a block's weight rows must be one 128-row scale block");

// Where chunk z of the problem lives: its batch (weight index) and its rows.
struct Chunk {
  int batch;
  int64_t row0, row_end;  // logical rows [row0, row_end)
  bool live;
};

__device__ __forceinline__ Chunk resolve_chunk(const Fp8GemmParams& p, int block_m, int z) {
  Chunk c;
  if (p.chunk_batch) {
    c.row0 = int64_t(z) * block_m;
    c.live = c.row0 < *p.rows_in_use;
    c.batch = c.live ? p.chunk_batch[z] : 0;
  } else {
    const int64_t chunks_per_batch = (p.m + block_m - 1) / block_m;
    c.batch = int(z / chunks_per_batch);
    c.row0 = (z % chunks_per_batch) * block_m;
    c.live = true;
  }
  c.row_end = min(c.row0 + block_m, p.m);
  return c;
}

// The a-row read for logical row r (-1: padding or past the end, read as zeros).
__device__ __forceinline__ int64_t a_row_of(const Fp8GemmParams& p, const Chunk& c, int64_t r) {
  if (r >= c.row_end) return -1;
  if (!p.gather_ids) return r;
  const int id = p.gather_ids[r];
  return id == p.gather_sentinel ? -1 : id / p.gather_div;
}

__device__ __forceinline__ __nv_bfloat16* out_row(const Fp8GemmParams& p, const Chunk& c, int64_t r) {
  return p.out + (p.chunk_batch ? 0 : c.batch * p.out_batch_stride) + r * p.out_row_stride;
}

// Weights are read once: keep them out of L1 so the token rows stay there.
__device__ __forceinline__ uint4 load_streaming(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One K block (128) of a warp's two weight rows g and g+8: [g lo, g hi, g+8 lo, g+8 hi],
// lo/hi = bytes [16t, 16t+16) of the block's first/second 64.
__device__ __forceinline__ void load_weight_block(const uint8_t* row_g, const uint8_t* row_g8, int64_t kb, int t,
                                                  uint4 (&w)[4]) {
  const int64_t off = kb * kFp8Group + 16 * t;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  w[0] = row_g ? load_streaming(row_g + off) : zero;
  w[1] = row_g ? load_streaming(row_g + off + 64) : zero;
  w[2] = row_g8 ? load_streaming(row_g8 + off) : zero;
  w[3] = row_g8 ? load_streaming(row_g8 + off + 64) : zero;
}

template <int kNT>
__global__ void __launch_bounds__(kThreads, kNT >= 8 ? 1 : 2)
    fp8_gemm_kernel(const Fp8GemmParams p, int kb_per_split, float* partials) {
  constexpr int kBlockM = kNT * 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const Chunk chunk = resolve_chunk(p, kBlockM, blockIdx.z);
  if (!chunk.live) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBlockN + warp * kRowsPerWarp;
  if (n0 >= p.n) return;  // no cross-warp synchronization below

  const int64_t kblocks = p.k / kFp8Group;
  const int64_t kb_begin = int64_t(blockIdx.y) * kb_per_split, kb_end = min(kb_begin + kb_per_split, kblocks);
  const uint8_t* w = p.w + chunk.batch * p.w_batch_stride;
  const float* w_scale = p.w_scale + chunk.batch * p.w_scale_batch_stride + (n0 / kBlockN) * p.w_scale_ld;
  const uint8_t* row_g = n0 + g < p.n ? w + (n0 + g) * p.k : nullptr;
  const uint8_t* row_g8 = n0 + g + 8 < p.n ? w + (n0 + g + 8) * p.k : nullptr;
  const uint8_t* a = p.a + (p.chunk_batch ? 0 : chunk.batch * p.a_batch_stride);
  const float* a_scale = p.a_scale + (p.chunk_batch ? 0 : chunk.batch * p.a_scale_batch_stride);

  // The token row this lane feeds to the MMA's B operand, per 8-row tile.
  int64_t a_row[kNT];
#pragma unroll
  for (int j = 0; j < kNT; ++j) a_row[j] = a_row_of(p, chunk, chunk.row0 + j * 8 + g);

  float acc[kNT][4] = {};
  uint4 wc[4], wn[4];
  if (kb_begin < kb_end) load_weight_block(row_g, row_g8, kb_begin, t, wc);
  for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
    // NOTES: the next block's weights are requested before this block's
    // MMAs, so two blocks (128 B a thread) are in flight: enough to keep
    // HBM busy at 1-2 blocks of 8 warps an SM.
    if (kb + 1 < kb_end) load_weight_block(row_g, row_g8, kb + 1, t, wn);
    const float ws = w_scale[kb];
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
      float sa = 0.0f;
      if (a_row[j] >= 0) {
        const uint8_t* src = a + a_row[j] * p.a_row_stride + kb * kFp8Group + 16 * t;
        x0 = __ldg(reinterpret_cast<const uint4*>(src));
        x1 = __ldg(reinterpret_cast<const uint4*>(src + 64));
        sa = __ldg(a_scale + kb * p.a_scale_kb_stride + a_row[j] * p.a_scale_row_stride);
      }
      float part[4] = {};
      mma_e4m3_16832(part, wc[0].x, wc[2].x, wc[0].y, wc[2].y, x0.x, x0.y);
      mma_e4m3_16832(part, wc[0].z, wc[2].z, wc[0].w, wc[2].w, x0.z, x0.w);
      mma_e4m3_16832(part, wc[1].x, wc[3].x, wc[1].y, wc[3].y, x1.x, x1.y);
      mma_e4m3_16832(part, wc[1].z, wc[3].z, wc[1].w, wc[3].w, x1.z, x1.w);
      // Accumulator columns are tokens 2t and 2t+1; their scales sit with
      // the lanes whose g is that token (lanes 8t and 8t + 4).
      const float s0 = ws * __shfl_sync(0xffffffffu, sa, 8 * t);
      const float s1 = ws * __shfl_sync(0xffffffffu, sa, 8 * t + 4);
      acc[j][0] += part[0] * s0;
      acc[j][1] += part[1] * s1;
      acc[j][2] += part[2] * s0;
      acc[j][3] += part[3] * s1;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) wc[i] = wn[i];
  }

  // acc[j][i]: weight row n0 + g (+8 for i >= 2), logical row row0 + 8j + 2t (+1 for odd i).
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + g + (i >= 2 ? 8 : 0), r = chunk.row0 + j * 8 + 2 * t + (i & 1);
      if (n >= p.n || r >= chunk.row_end) continue;
      if (partials)
        partials[((int64_t(blockIdx.y) * gridDim.z + blockIdx.z) * kBlockM + (r - chunk.row0)) * p.n + n] = acc[j][i];
      else
        out_row(p, chunk, r)[n] = __float2bfloat16(acc[j][i]);
    }
  }
}

__global__ void fp8_gemm_reduce_kernel(const Fp8GemmParams p, int block_m, int num_chunks, int split_k,
                                       const float* partials) {
  const int64_t per_chunk = int64_t(block_m) * p.n, total = per_chunk * num_chunks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int z = int(i / per_chunk);
    const int64_t lr = (i % per_chunk) / p.n, n = i % p.n;
    const Chunk chunk = resolve_chunk(p, block_m, z);
    if (!chunk.live || chunk.row0 + lr >= chunk.row_end) continue;
    float sum = 0.0f;
    for (int s = 0; s < split_k; ++s) sum += partials[(int64_t(s) * num_chunks + z) * per_chunk + lr * p.n + n];
    out_row(p, chunk, chunk.row0 + lr)[n] = __float2bfloat16(sum);
  }
}

int sm_count() {
  static const int count = [] {
    int dev = 0, n = 0;
    MLA_CUDA_CHECK(cudaGetDevice(&dev), "fp8 gemm plan");
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "fp8 gemm plan");
    return n;
  }();
  return count;
}

template <int kNT>
void launch(const Fp8GemmParams& p, const Fp8GemmPlan& plan, float* partials, cudaStream_t stream) {
  const dim3 grid(unsigned((p.n + kBlockN - 1) / kBlockN), unsigned(plan.split_k), unsigned(plan.num_chunks));
  fp8_gemm_kernel<kNT><<<grid, kThreads, 0, stream>>>(p, plan.kb_per_split, partials);
}

}  // namespace

Fp8GemmPlan plan_fp8_gemm(const Fp8GemmParams& p, int block_m) {
  MLA_CUDA_REQUIRE(p.k > 0 && p.k % kFp8Group == 0,
                   "fp8 gemm: K = " + std::to_string(p.k) + " is not a positive multiple of 128");
  MLA_CUDA_REQUIRE(p.n > 0 && p.m >= 0 && p.batch >= 1, "fp8 gemm: empty or negative shape");
  MLA_CUDA_REQUIRE(p.a_row_stride % 16 == 0 && p.k <= p.a_row_stride,
                   "fp8 gemm: activation rows must be 16-byte aligned and hold K values");
  MLA_CUDA_REQUIRE(!p.chunk_batch || (block_m > 0 && p.rows_in_use && p.max_chunks > 0),
                   "fp8 gemm: grouped mode needs block_m, rows_in_use and max_chunks");
  Fp8GemmPlan plan;
  if (block_m == 0) {
    block_m = 8;
    while (block_m < p.m && block_m < 128) block_m *= 2;
  }
  MLA_CUDA_REQUIRE(block_m == 8 || block_m == 16 || block_m == 32 || block_m == 64 || block_m == 128,
                   "fp8 gemm: block_m " + std::to_string(block_m) + " is not one of 8, 16, 32, 64, 128");
  plan.block_m = block_m;
  plan.num_chunks = p.chunk_batch ? p.max_chunks : int(p.batch * ((p.m + block_m - 1) / block_m));
  MLA_CUDA_REQUIRE(plan.num_chunks <= 65535, "fp8 gemm: too many row chunks for one launch");
  const int64_t kblocks = p.k / kFp8Group, tiles = (p.n + kBlockN - 1) / kBlockN;
  // NOTES: aim at about 4 blocks of 8 warps an SM, so enough weight bytes
  // are in flight; split K only when the output tiles alone give fewer.
  const int64_t target = 4 * int64_t(sm_count()), blocks = tiles * std::max(plan.num_chunks, 1);
  int64_t split = blocks >= target ? 1 : std::min<int64_t>(kblocks, (target + blocks - 1) / blocks);
  plan.kb_per_split = int((kblocks + split - 1) / split);
  plan.split_k = int((kblocks + plan.kb_per_split - 1) / plan.kb_per_split);
  if (plan.split_k > 1)
    plan.workspace_bytes = size_t(plan.split_k) * plan.num_chunks * plan.block_m * p.n * sizeof(float);
  return plan;
}

void run_fp8_gemm(const Fp8GemmParams& p, const Fp8GemmPlan& plan, void* workspace, cudaStream_t stream) {
  if (plan.num_chunks == 0 || p.m == 0) return;
  MLA_CUDA_REQUIRE(plan.workspace_bytes == 0 || workspace, "fp8 gemm: split-K plan needs its workspace");
  float* partials = plan.split_k > 1 ? static_cast<float*>(workspace) : nullptr;
  switch (plan.block_m) {
    case 8: launch<1>(p, plan, partials, stream); break;
    case 16: launch<2>(p, plan, partials, stream); break;
    case 32: launch<4>(p, plan, partials, stream); break;
    case 64: launch<8>(p, plan, partials, stream); break;
    default: launch<16>(p, plan, partials, stream); break;
  }
  check_launch("fp8 gemm");
  if (partials) {
    const int64_t total = int64_t(plan.block_m) * p.n * plan.num_chunks;
    const int blocks = int(std::min<int64_t>((total + 255) / 256, 8 * int64_t(sm_count())));
    fp8_gemm_reduce_kernel<<<blocks, 256, 0, stream>>>(p, plan.block_m, plan.num_chunks, plan.split_k, partials);
    check_launch("fp8 gemm split-K reduce");
  }
}

}  // namespace mlaserve::cuda

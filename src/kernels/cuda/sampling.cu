#include "kernels/cuda/sampling.h"

#include <cooperative_groups.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

#include <string>

namespace mlaserve::cuda {
namespace {

// Threads a CTA (with 512, one CTA a row took 38% longer on top_p, H100);
// the sampler assumes blockDim.x == kThreads.
constexpr int kThreads = 1024;

__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxSlice = kArgmaxThreads * 8;  // logits a block scans: two float4 loads a thread

// Warp-wide `better` reduction: every lane ends with the warp's best.
__device__ __forceinline__ void warp_better(float& v, int& idx) {
  for (int o = 16; o > 0; o >>= 1) better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
}

// Block (slice blockIdx.x, row blockIdx.y): the best of kArgmaxSlice logits
// into partial[row][slice]. A row is spread over many blocks: one block a
// row took 88 us for a 102400-word vocabulary, bound by one SM's loads.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_slice_kernel(const float* logits, int64_t vocab,
                                                                      float2* partial) {
  pdl_enter();
  const float* row = logits + blockIdx.y * vocab;
  const int64_t base = int64_t(blockIdx.x) * kArgmaxSlice;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  const bool vec = vocab % 4 == 0;  // rows then start 16-byte aligned
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = base + (int64_t(half) * kArgmaxThreads + threadIdx.x) * 4;
    if (vec && i + 4 <= vocab) {
      const float4 f = *reinterpret_cast<const float4*>(row + i);
      better(v, idx, f.x, int(i));
      better(v, idx, f.y, int(i + 1));
      better(v, idx, f.z, int(i + 2));
      better(v, idx, f.w, int(i + 3));
    } else {
      for (int64_t j = i; j < i + 4 && j < vocab; ++j) better(v, idx, row[j], int(j));
    }
  }
  warp_better(v, idx);
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  if (threadIdx.x % 32 == 0) {
    sv[threadIdx.x / 32] = v;
    si[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kArgmaxThreads / 32 ? sv[threadIdx.x] : -INFINITY;
    idx = threadIdx.x < kArgmaxThreads / 32 ? si[threadIdx.x] : 0x7fffffff;
    warp_better(v, idx);
    if (threadIdx.x == 0) partial[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = make_float2(v, __int_as_float(idx));
  }
}

// One warp a row: the best of the row's slices (ties: lowest index).
__global__ void argmax_merge_kernel(const float2* partial, int slices, int32_t* ids) {
  pdl_enter();
  const float2* p = partial + int64_t(blockIdx.x) * slices;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int s = threadIdx.x; s < slices; s += 32) better(v, idx, p[s].x, __float_as_int(p[s].y));
  warp_better(v, idx);
  if (threadIdx.x == 0) ids[blockIdx.x] = idx;
}

// A row's CTAs: a cluster of kRanks (Hopper) each taking a slice of the
// vocabulary, exchanging histograms and totals through distributed shared
// memory; one CTA (kRanks 1) elsewhere. One CTA a row spent ~130 us on top_p
// over V3's vocabulary (H200, perf.md session 22), bound by its own passes.
template <int kRanks>
struct RowCluster {
  int rank = 0;
  int64_t begin = 0, end = 0;  // this CTA's slice of the row

  __device__ explicit RowCluster(int64_t vocab) {
    if constexpr (kRanks > 1) rank = int(cooperative_groups::this_cluster().block_rank());
    // Slices of a multiple of 4 words keep float4 reads aligned.
    const int64_t per = ((vocab + kRanks - 1) / kRanks + 3) / 4 * 4;
    begin = min(vocab, rank * per);
    end = min(vocab, begin + per);
  }
  // Every thread of every CTA of the row; shared writes before are visible to
  // the others' reads after.
  __device__ void sync() const {
    if constexpr (kRanks > 1) cooperative_groups::this_cluster().sync();
    else __syncthreads();
  }
  // Rank r's copy of the shared variable p.
  template <typename T>
  __device__ T* at(T* p, int r) const {
    if constexpr (kRanks > 1) return cooperative_groups::this_cluster().map_shared_rank(p, r);
    else return p;
  }
};

// Calls f(i, logit) for every logit of [begin, end), each thread taking
// float4 chunks a block apart (coalesced; begin is a multiple of 4 and rows
// start 16-byte aligned when vocab % 4 == 0, else one element at a time).
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* row, int64_t vocab, int64_t begin, int64_t end, F&& f) {
  if (vocab % 4 == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t c = begin / 4 + threadIdx.x; c < end / 4; c += blockDim.x) {
      const float4 v = row4[c];
      f(4 * c, v.x);
      f(4 * c + 1, v.y);
      f(4 * c + 2, v.z);
      f(4 * c + 3, v.w);
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) f(i, row[i]);
  }
}

// Argmax of the row (all threads of every CTA get the result).
template <int kRanks>
__device__ int row_argmax(const float* row, int64_t vocab, const RowCluster<kRanks>& rc) {
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  __shared__ float cta_v;
  __shared__ int cta_i;
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for_each_logit(row, vocab, rc.begin, rc.end, [&](int64_t i, float l) { better(v, idx, l, int(i)); });
  warp_better(v, idx);
  if (threadIdx.x % 32 == 0) {
    sv[threadIdx.x / 32] = v;
    si[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    v = sv[0];
    idx = si[0];
    for (int w = 1; w < kThreads / 32; ++w) better(v, idx, sv[w], si[w]);
    cta_v = v;
    cta_i = idx;
  }
  rc.sync();
  v = *rc.at(&cta_v, 0);
  idx = *rc.at(&cta_i, 0);
  for (int r = 1; r < kRanks; ++r) better(v, idx, *rc.at(&cta_v, r), *rc.at(&cta_i, r));
  return idx;
}

// The weight's bits order like the weight (w >= 0): radix-select keys.
__device__ __forceinline__ uint32_t weight_key(float w) { return __float_as_uint(w); }

// Radix histograms: a copy per lane (lane l adds into copy l), so the lanes
// of one atomic never collide on an address, and copies 257 words apart, so
// lanes adding to the same bin fall in different banks. With one shared copy
// the adds to a bin (a CAS loop each: f32 shared atomics have no native
// add, nor u64 ones) took turns: 0.74 ms a row for top_p (H100, 129,280
// words; perf.md session 22).
constexpr int kBins = 256, kCopyPitch = kBins + 1;

// Largest key K such that the elements with key >= K (among those with key >=
// floor_key) carry at least `target` of count (by_mass false) or of weight
// (by_mass true; target is then a share of the kept elements' total weight).
// Four passes of 8 bits, from the top byte; each CTA histograms its slice,
// then every CTA adds all the CTAs' histograms in rank order and walks the
// same bins (so all pick the same key). A pass's histogram is in one of two
// buffers by parity: the other CTAs read it between this pass's cluster sync
// and the next one, before it is written again.
template <int kRanks>
__device__ uint32_t radix_select(const float* row, int64_t vocab, const RowCluster<kRanks>& rc, float max_l,
                                 float inv_t, uint32_t floor_key, float target, bool by_mass) {
  __shared__ float hist[32 * kCopyPitch];
  __shared__ float merged[2][kBins];
  __shared__ float total[kBins];
  __shared__ uint32_t s_prefix;
  __shared__ float s_target;
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_target = target;
  }
  float* mine = hist + (threadIdx.x % 32) * kCopyPitch;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const uint32_t high_mask = pass ? ~0u << (shift + 8) : 0u;
    for (int b = threadIdx.x; b < 32 * kCopyPitch; b += blockDim.x) hist[b] = 0.0f;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for_each_logit(row, vocab, rc.begin, rc.end, [&](int64_t, float l) {
      const float w = __expf((l - max_l) * inv_t);
      const uint32_t key = weight_key(w);
      if (key >= floor_key && (key & high_mask) == prefix) atomicAdd(&mine[(key >> shift) & 255], by_mass ? w : 1.0f);
    });
    __syncthreads();
    float* own = merged[pass % 2];
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      float sum = 0.0f;
      for (int c = 0; c < 32; ++c) sum += hist[c * kCopyPitch + b];
      own[b] = sum;
    }
    rc.sync();
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      float sum = 0.0f;
      for (int r = 0; r < kRanks; ++r) sum += rc.at(own, r)[b];
      total[b] = sum;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // The highest bin b whose count / weight from the top reaches the
      // target: lane l holds bins 8l .. 8l + 7; a suffix scan over the lanes,
      // then the lane where it crosses walks its 8 bins.
      const int lane = threadIdx.x;
      float bins[8], group = 0.0f;
      for (int j = 0; j < 8; ++j) group += (bins[j] = total[8 * lane + j]);
      float from_top = group;  // this lane's bins and every higher lane's
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_down_sync(0xffffffffu, from_top, o);
        if (lane + o < 32) from_top += y;
      }
      float target = s_target;
      if (pass == 0 && by_mass) target *= __shfl_sync(0xffffffffu, from_top, 0);  // the first pass sees all kept
      const float higher = __shfl_down_sync(0xffffffffu, from_top, 1);
      const float above_lane = lane < 31 ? higher : 0.0f;  // the higher lanes' bins
      // The crossing lane: the highest whose suffix reaches the target (lane 0,
      // ending at bin 0, if none does, as a walk down from bin 255 would).
      const unsigned reach = __ballot_sync(0xffffffffu, from_top >= target);
      const int cross = reach ? 31 - __clz(reach) : 0;
      if (lane == cross) {
        float above = above_lane;
        int j = 7;
        while (j > 0 && above + bins[j] < target) above += bins[j--];
        s_target = target - above;
        s_prefix = prefix | (uint32_t(8 * lane + j) << shift);
      }
    }
    __syncthreads();
  }
  const uint32_t selected = s_prefix;
  __syncthreads();  // a second select resets s_prefix: every thread has read it first
  return selected;
}

// A row's CTAs (blockIdx.y the row): thresholds by radix select, then an
// inverse-CDF pick in vocabulary order (each thread scans a contiguous part
// of its CTA's slice; the CTAs' totals place each slice).
template <int kRanks>
__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t vocab,
                                                          const RowSamplingParams* params, int32_t* ids) {
  pdl_enter();
  const RowCluster<kRanks> rc(vocab);
  const float* row = logits + blockIdx.y * vocab;
  const RowSamplingParams p = params[blockIdx.y];
  const int argmax = row_argmax(row, vocab, rc);
  __shared__ float cta_total;
  if (p.temperature < 1e-5f || p.top_k == 1) {
    if (rc.rank == 0 && threadIdx.x == 0) ids[blockIdx.y] = argmax;
    rc.sync();  // no CTA leaves while another may read its shared memory
    return;
  }
  const float max_l = row[argmax], inv_t = 1.0f / p.temperature;
  uint32_t floor_key = 0;
  if (p.top_k > 0 && p.top_k < vocab)
    floor_key = radix_select(row, vocab, rc, max_l, inv_t, 0, float(p.top_k), false);
  if (p.min_p > 0.0f) floor_key = max(floor_key, weight_key(p.min_p));
  if (p.top_p < 1.0f) floor_key = radix_select(row, vocab, rc, max_l, inv_t, floor_key, p.top_p, true);
  // Inverse CDF over the kept weights in vocabulary order: slice sums, an
  // exclusive scan of them, then the one slice holding the target walks it.
  const int64_t per = (rc.end - rc.begin + blockDim.x - 1) / blockDim.x;
  const int64_t begin = min(rc.end, rc.begin + int64_t(threadIdx.x) * per), end = min(rc.end, begin + per);
  float local = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float w = __expf((row[i] - max_l) * inv_t);
    if (weight_key(w) >= floor_key) local += w;
  }
  // Exclusive scan of the slice sums: each warp's, then the warps' totals.
  __shared__ float warp_start[kThreads / 32];
  __shared__ int s_choice;
  static_assert(kThreads == 32 * 32, "one warp scans the warps' totals");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float inclusive = local;
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += y;
  }
  if (lane == 31) warp_start[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const float total = warp_start[lane];
    float below = total;
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, below, o);
      if (lane >= o) below += y;
    }
    warp_start[lane] = below - total;
    if (lane == 31) cta_total = below;
    // If rounding puts the target in no slice: the top token, always kept.
    if (lane == 0) s_choice = argmax;
  }
  rc.sync();
  // The CTAs' totals in rank order place this CTA's slice; the CTA holding
  // the target picks (rank 0 takes the top token if rounding left it past
  // every slice).
  float grand = 0.0f, offset = 0.0f;
  for (int r = 0; r < kRanks; ++r) {
    const float t = *rc.at(&cta_total, r);
    if (r < rc.rank) offset += t;
    grand += t;
  }
  const float mine = cta_total, target = p.uniform * grand;
  const bool holds = mine > 0.0f && offset <= target && target < offset + mine;
  float run = offset + warp_start[warp] + inclusive - local;
  if (holds && local > 0.0f && run <= target && target < run + local) {
    int64_t last_kept = begin;
    for (int64_t i = begin; i < end; ++i) {
      const float w = __expf((row[i] - max_l) * inv_t);
      if (weight_key(w) < floor_key) continue;
      last_kept = i;
      run += w;
      if (run > target) break;
    }
    s_choice = int(last_kept);
  }
  __syncthreads();
  if (threadIdx.x == 0 && (holds || (rc.rank == 0 && target >= grand))) ids[blockIdx.y] = s_choice;
  rc.sync();  // no CTA leaves while another may read its shared memory
}

// CTAs a row: on Hopper the largest cluster (a power of two up to 8, the
// portable maximum) that keeps every row's CTAs on an SM of their own;
// elsewhere one. Measured (H100, V3 vocabulary, perf.md session 23): 8 CTAs
// a row take top_p from 131 to 40 us for one row, while 64 rows of 8 (two
// waves of 1024-thread CTAs) ran no faster than 64 single CTAs.
int ranks_for(int64_t rows) {
  static const int sms = [] {
    int device = 0, major = 0, count = 0;
    const bool ok = cudaGetDevice(&device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
    return ok && major >= 9 ? count : 0;
  }();
  int ranks = 8;
  while (ranks > 1 && rows * ranks > sms) ranks /= 2;
  return ranks;
}

template <int kRanks>
void launch_sample(const float* logits, int64_t rows, int64_t vocab, const RowSamplingParams* params, int32_t* ids,
                   cudaStream_t stream) {
  DependentLaunchConfig config(dim3(kRanks, unsigned(rows)), kThreads, 0, stream, kRanks);
  MLA_CUDA_CHECK(cudaLaunchKernelEx(config.get(), sample_kernel<kRanks>, logits, vocab, params, ids),
                 "sample_tokens");
  check_launch("sample_tokens");
}

}  // namespace

size_t greedy_argmax_workspace_bytes(int64_t rows, int64_t vocab) {
  return size_t(rows) * size_t((vocab + kArgmaxSlice - 1) / kArgmaxSlice) * sizeof(float2);
}

void greedy_argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, void* workspace,
                   cudaStream_t stream) {
  if (rows == 0) return;
  MLA_CUDA_REQUIRE(vocab > 0 && vocab < (int64_t(1) << 31) && rows < 65536,
                   "greedy_argmax: " + std::to_string(rows) + " rows of " + std::to_string(vocab));
  const int slices = int((vocab + kArgmaxSlice - 1) / kArgmaxSlice);
  auto* partial = static_cast<float2*>(workspace);
  launch_dependent(argmax_slice_kernel, dim3(unsigned(slices), unsigned(rows)), kArgmaxThreads, 0, stream, logits,
                   vocab, partial);
  check_launch("greedy_argmax");
  launch_dependent(argmax_merge_kernel, unsigned(rows), 32, 0, stream, partial, slices, ids);
  check_launch("greedy_argmax (merge)");
}

void sample_tokens(const float* logits, int64_t rows, int64_t vocab, const RowSamplingParams* params, int32_t* ids,
                   cudaStream_t stream) {
  if (rows == 0) return;
  MLA_CUDA_REQUIRE(vocab > 0 && vocab < (int64_t(1) << 31), "sample_tokens: vocabulary of " + std::to_string(vocab));
  MLA_CUDA_REQUIRE(rows < 65536, "sample_tokens: " + std::to_string(rows) + " rows");
  switch (ranks_for(rows)) {
    case 8:
      return launch_sample<8>(logits, rows, vocab, params, ids, stream);
    case 4:
      return launch_sample<4>(logits, rows, vocab, params, ids, stream);
    case 2:
      return launch_sample<2>(logits, rows, vocab, params, ids, stream);
    default:
      return launch_sample<1>(logits, rows, vocab, params, ids, stream);
  }
}

}  // namespace mlaserve::cuda

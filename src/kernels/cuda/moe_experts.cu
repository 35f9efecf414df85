#include "kernels/cuda/moe_experts.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/moe_align.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kBlockK = 64, kThreads = 128;
constexpr int kMoeMaxSlots = kMoeSmallMaxSlots;  // slots per token, both paths (the combine's registers)

// Pipeline depth: decode-sized tiles are small (80 x 64 per stage), and a
// weight-streaming kernel needs many bytes in flight per SM to cover DRAM
// latency, so they get 8 stages; 4 for the 192-row tiles of large batches.
template <int kBM>
constexpr int stages_for() { return kBM == 16 ? 8 : 4; }

// Column block per row block: decode-sized batches (16-row blocks) stream each
// expert's weights through twice as many 64-column blocks, so the few active
// experts still spread over every SM.
template <int kBM>
constexpr int block_n_for() { return kBM == 16 ? 64 : 128; }

int max_blocks_for(int assignments, int num_experts, int block_m) {
  // Each expert's run adds at most one partly filled block.
  return (assignments + block_m - 1) / block_m + std::min(num_experts, assignments);
}

int slots_per_token(const MoeExpertsParams& p) { return p.top_k + p.num_shared; }

struct Workspace {
  int32_t *sorted_ids, *block_expert, *num_padded, *position;
  __nv_bfloat16 *act, *down;
  size_t bytes;
};

// The grouped path's buffers in `base` (null: only the size is computed).
Workspace carve_grouped(void* base, const MoeExpertsParams& p) {
  const int assignments = p.num_tokens * slots_per_token(p), total_experts = p.num_experts + p.num_shared;
  const int block_m = moe_block_m(p.num_tokens, slots_per_token(p), total_experts);
  const size_t max_blocks = max_blocks_for(assignments, total_experts, block_m), max_rows = max_blocks * block_m;
  auto* bytes = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t n) {
    char* r = bytes ? bytes + off : nullptr;
    off += (n + 255) / 256 * 256;
    return r;
  };
  Workspace w;
  w.sorted_ids = reinterpret_cast<int32_t*>(take(max_rows * 4));
  w.block_expert = reinterpret_cast<int32_t*>(take(max_blocks * 4));
  w.num_padded = reinterpret_cast<int32_t*>(take(4));
  w.position = reinterpret_cast<int32_t*>(take(size_t(assignments) * 4));
  w.act = reinterpret_cast<__nv_bfloat16*>(take(max_rows * p.inter * 2));
  w.down = reinterpret_cast<__nv_bfloat16*>(take(max_rows * p.hidden * 2));
  w.bytes = off;
  return w;
}

// The small path's only buffer: act{T * slots_per_token, I}.
size_t small_workspace_bytes(const MoeExpertsParams& p) {
  return size_t(p.num_tokens) * slots_per_token(p) * p.inter * 2;
}

// c[m, :] = a[row(m), :] · w[expert(block)]ᵀ with mma.sync m16n8k16 and a
// kStages-deep cp.async pipeline. NOTES: 16-byte row padding keeps the
// ldmatrix phases conflict-free (144 B rows = 9 x 16 B, odd).
template <int kBM, bool kGather>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(GroupedGemmParams p) {
  constexpr int kBlockN = block_n_for<kBM>(), kStages = stages_for<kBM>();
  constexpr int kWM = kBM >= 64 ? 2 : 1, kWN = 4 / kWM;
  constexpr int kWTM = kBM / kWM, kWTN = kBlockN / kWN, kMT = kWTM / 16, kNT = kWTN / 8;
  constexpr int kStride = kBlockK + 8, kChunks = kBlockK / 8;
  constexpr int kAChunksPerThread = kBM * kChunks / kThreads, kBChunksPerThread = kBlockN * kChunks / kThreads;
  static_assert(kAChunksPerThread >= 1 && kNT % 2 == 0, "tile shape");

  const int mb = blockIdx.y, nb = blockIdx.x;
  if (mb * kBM >= *p.num_padded) return;
  const int expert = p.block_expert[mb];
  const __nv_bfloat16* w = p.w + int64_t(expert) * p.n * p.k;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  auto* a_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kStages][kBM][kStride]
  __nv_bfloat16* b_s = a_s + kStages * kBM * kStride;      // [kStages][kBlockN][kStride]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c2 = (lane % 4) * 2;
  const int warp_m = warp / kWN, warp_n = warp % kWN;

  // Source row of each A chunk this thread copies (-1: pad row, zero-filled).
  const __nv_bfloat16* a_src[kAChunksPerThread];
#pragma unroll
  for (int i = 0; i < kAChunksPerThread; ++i) {
    const int r = (tid + i * kThreads) / kChunks;
    const int id = p.sorted_ids[mb * kBM + r];
    const int64_t row = kGather ? id / p.slots_per_token : int64_t(mb) * kBM + r;
    a_src[i] = id == p.pad_sentinel ? nullptr : p.a + row * p.k;
  }
  auto load_stage = [&](int kt, int stage) {
    const int k0 = kt * kBlockK;
#pragma unroll
    for (int i = 0; i < kAChunksPerThread; ++i) {
      const int c = tid + i * kThreads, r = c / kChunks, col = (c % kChunks) * 8;
      const bool valid = a_src[i] && k0 + col < p.k;
      cp_async_16(a_s + (stage * kBM + r) * kStride + col, valid ? a_src[i] + k0 + col : p.a, valid ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kBChunksPerThread; ++i) {
      const int c = tid + i * kThreads, r = c / kChunks, col = (c % kChunks) * 8;
      const int n = nb * kBlockN + r;
      const bool valid = n < p.n && k0 + col < p.k;
      cp_async_16(b_s + (stage * kBlockN + r) * kStride + col, valid ? w + int64_t(n) * p.k + k0 + col : w,
                  valid ? 16 : 0);
    }
  };

  const int num_k_tiles = (p.k + kBlockK - 1) / kBlockK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  float acc[kMT][kNT][4] = {};
  for (int kt = 0; kt < num_k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < num_k_tiles) load_stage(kt + kStages - 1, (kt + kStages - 1) % kStages);
    cp_async_commit();
    const int stage = kt % kStages;
    const __nv_bfloat16* at = a_s + (stage * kBM + warp_m * kWTM) * kStride;
    const __nv_bfloat16* bt = b_s + (stage * kBlockN + warp_n * kWTN) * kStride;
#pragma unroll
    for (int kk = 0; kk < kBlockK; kk += 16) {
      uint32_t af[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldmatrix_x4(af[mt], at + (mt * 16 + lane % 16) * kStride + kk + (lane / 16) * 8);
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        uint32_t bf[4];  // b0, b1 of n-tile nt, then of nt + 1
        ldmatrix_x4(bf, bt + (nt * 8 + lane % 8 + (lane / 16) * 8) * kStride + kk + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16_16816(acc[mt][nt], af[mt], bf[0], bf[1]);
          mma_bf16_16816(acc[mt][nt + 1], af[mt], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int m = mb * kBM + warp_m * kWTM + mt * 16 + g + 8 * r;
      if (p.sorted_ids[m] == p.pad_sentinel) continue;
      if constexpr (kGather) {
        // gate_up with SiLU-and-mul fused: the weight rows interleave gate and
        // up in groups of 8, so n-tiles 2j and 2j+1 hold gate and up of the
        // same 8 intermediate columns in this thread's registers.
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          const int n = nb * kBlockN + warp_n * kWTN + nt * 8;  // first gate column of the pair
          if (n >= p.n) continue;
          const int i = n / 2 + c2;
          float h[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float g = acc[mt][nt][2 * r + e], u = acc[mt][nt + 1][2 * r + e];
            h[e] = g / (1.0f + __expf(-g)) * u;
          }
          *reinterpret_cast<__nv_bfloat162*>(p.c + int64_t(m) * (p.n / 2) + i) = __floats2bfloat162_rn(h[0], h[1]);
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const int n = nb * kBlockN + warp_n * kWTN + nt * 8 + c2;
          if (n < p.n)
            *reinterpret_cast<__nv_bfloat162*>(p.c + int64_t(m) * p.n + n) =
                __floats2bfloat162_rn(acc[mt][nt][2 * r], acc[mt][nt][2 * r + 1]);
        }
      }
    }
}

// out[t] = sum over the token's slots of weight * y[position[slot]], f32
// sum in slot order. Positions and weights are read up front so the row
// loads that depend on them issue together (not one L2 round trip each).
__global__ void moe_combine_kernel(const __nv_bfloat16* y, const int32_t* position, MoeSlots slots, int hidden,
                                   __nv_bfloat16* out) {
  const int64_t t = blockIdx.x;
  const int per_token = slots.per_token();
  int64_t row[kMoeMaxSlots];
  float wt[kMoeMaxSlots];
#pragma unroll
  for (int j = 0; j < kMoeMaxSlots; ++j) {
    const int slot = int(t) * per_token + j;
    row[j] = j < per_token ? int64_t(position[slot]) * hidden : 0;
    wt[j] = j < per_token ? slots.weight(slot) : 0.0f;
  }
  for (int d = threadIdx.x * 8; d < hidden; d += blockDim.x * 8) {
    float acc[8] = {};
#pragma unroll
    for (int j = 0; j < kMoeMaxSlots; ++j) {
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

template <int kBM, bool kGather>
void launch_grouped_gemm(const GroupedGemmParams& p, cudaStream_t stream) {
  constexpr int kBlockN = block_n_for<kBM>(), kStages = stages_for<kBM>();
  constexpr size_t smem = sizeof(__nv_bfloat16) * kStages * (kBM + kBlockN) * (kBlockK + 8);
  auto kernel = grouped_gemm_kernel<kBM, kGather>;
  static bool attribute_set = false;  // once per instantiation
  if (!attribute_set) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                   "moe grouped gemm");
    attribute_set = true;
  }
  const dim3 grid((p.n + kBlockN - 1) / kBlockN, p.max_blocks);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  check_launch(kGather ? "moe grouped gemm (gate_up)" : "moe grouped gemm (down)");
}

void grouped_gemm(const GroupedGemmParams& p, int block_m, cudaStream_t stream) {
  if (block_m == 16) {
    p.gather_a ? launch_grouped_gemm<16, true>(p, stream) : launch_grouped_gemm<16, false>(p, stream);
  } else {
    p.gather_a ? launch_grouped_gemm<64, true>(p, stream) : launch_grouped_gemm<64, false>(p, stream);
  }
}

// ---- small path (decode) --------------------------------------------------

constexpr int kGateUpWarps = 4, kDownWarps = 8;

// 16 bytes of weights, read once per step: past L1 (x and act, which every
// warp re-reads, stay there).
__device__ __forceinline__ uint4 load_weights_16(const __nv_bfloat16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ void load_f32x8(const __nv_bfloat16* p, float (&f)[8]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  Bf16x8 b;
  *reinterpret_cast<uint4*>(&b) = v;
  b.to_float(f);
}

// acc += w(8 bf16) · x(8 f32)
__device__ __forceinline__ float dot8(uint4 w, const float (&x)[8], float acc) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc = fmaf(f.x, x[2 * i], acc);
    acc = fmaf(f.y, x[2 * i + 1], acc);
  }
  return acc;
}

struct SmallArgs {
  const __nv_bfloat16 *x, *w_gate_up, *w_down;
  MoeSlots slots;
  int num_tokens, hidden, inter, down_rows_per_block;
  __nv_bfloat16* act;  // {T * slots_per_token, I}
  __nv_bfloat16* out;
};

// Block (column tile blockIdx.x, slot blockIdx.y). The block of an expert's
// first slot computes act[slot, cols] = silu(x[t] · gate) * (x[t] · up) for
// every slot of that expert (up to kMaxTok, one per token), reading the
// weight rows once; blocks of its later slots exit. Each warp owns kCols
// columns (a gate and an up row each) and streams 16 rows' worth of 16-byte
// chunks per lane per step.
template <int kMaxTok, int kCols>
__global__ void __launch_bounds__(kGateUpWarps * 32) moe_small_gate_up_kernel(SmallArgs a) {
  constexpr int kUnroll = 8 / kCols;
  __shared__ int s_slot[kMaxTok];
  __shared__ int s_n;
  const int slot0 = blockIdx.y, per_token = a.slots.per_token(), total = a.num_tokens * per_token;
  const int expert = a.slots.expert(slot0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if constexpr (kMaxTok == 1) {
    if (threadIdx.x == 0) s_slot[0] = slot0, s_n = 1;
  } else if (warp == 0) {
    int n = 0;
    bool later = false;  // an earlier slot has this expert: its block does the work
    for (int base = 0; base < total; base += 32) {
      const int i = base + lane;
      const bool match = i < total && a.slots.expert(i) == expert;
      const unsigned mask = __ballot_sync(0xffffffffu, match);
      later |= __any_sync(0xffffffffu, match && i < slot0);
      const int pos = n + __popc(mask & ((1u << lane) - 1));
      if (match && pos < kMaxTok) s_slot[pos] = i;
      n += __popc(mask);
    }
    __syncwarp();
    if (lane == 0) {
      if (n > kMaxTok) {  // a token chose the expert twice: every slot computes its own row
        s_slot[0] = slot0;
        s_n = 1;
      } else {
        s_n = later ? 0 : n;
      }
    }
  }
  __syncthreads();
  const int n = s_n;
  const int col0 = (blockIdx.x * kGateUpWarps + warp) * kCols;
  if (n == 0 || col0 >= a.inter) return;

  const int D = a.hidden, I = a.inter, chunks = D / 8;
  int slot[kMaxTok];
  const __nv_bfloat16* xrow[kMaxTok];
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) {
    slot[t] = t < n ? s_slot[t] : slot0;
    xrow[t] = a.x + int64_t(slot[t] / per_token) * D;
  }
  const __nv_bfloat16* w = a.w_gate_up + int64_t(expert) * 2 * I * D;
  const __nv_bfloat16* row[kCols][2];
#pragma unroll
  for (int c = 0; c < kCols; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) row[c][h] = w + gate_up_row(min(col0 + c, I - 1), h == 1) * D;

  float acc[kCols][2][kMaxTok] = {};
  for (int k0 = 0; k0 < chunks; k0 += 32 * kUnroll) {
    uint4 wv[kCols][2][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kc = k0 + u * 32 + lane;
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[c][h][u] = kc < chunks ? load_weights_16(row[c][h] + kc * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
      if (t >= n) break;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int kc = k0 + u * 32 + lane;
        if (kc >= chunks) break;
        float xf[8];
        load_f32x8(xrow[t] + kc * 8, xf);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
          for (int h = 0; h < 2; ++h) acc[c][h][t] = dot8(wv[c][h][u], xf, acc[c][h][t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) {
    if (t >= n) break;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float g = warp_sum(acc[c][0][t]), u = warp_sum(acc[c][1][t]);
      if (lane == 0 && col0 + c < I)
        a.act[int64_t(slot[t]) * I + col0 + c] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
    }
  }
}

// Block: output rows [d0, d0 + rows) of every token. The slots are sorted by
// (expert, slot) and cut into groups of one expert and distinct tokens;
// warp w takes groups w, w + kDownWarps, ...: it streams the group's expert
// rows once (kRowsPerWarp rows at a time) and adds weight * (act[slot] · row)
// into its own partial sums, which the block adds up in warp order at the end.
template <int kMaxTok, int kRowsPerWarp>
__global__ void __launch_bounds__(kDownWarps * 32) moe_small_down_kernel(SmallArgs a) {
  constexpr int kMaxSlots = kMaxTok * kMoeSmallMaxSlots, kUnroll = 16 / kRowsPerWarp;
  __shared__ int s_expert[kMaxSlots];
  __shared__ int s_order[kMaxSlots];      // slots sorted by (expert, slot)
  __shared__ int s_group[kMaxSlots + 1];  // group g: s_order[s_group[g] .. s_group[g + 1])
  __shared__ int s_num_groups;
  extern __shared__ float s_partial[];    // [kDownWarps][T][rows]
  const int per_token = a.slots.per_token(), T = a.num_tokens, total = T * per_token;
  const int rows = a.down_rows_per_block, d0 = blockIdx.x * rows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  for (int i = threadIdx.x; i < total; i += blockDim.x) s_expert[i] = a.slots.expert(i);
  for (int i = threadIdx.x; i < kDownWarps * T * rows; i += blockDim.x) s_partial[i] = 0.0f;
  __syncthreads();
  if constexpr (kMaxTok == 1) {
    // One token: its slots name distinct experts (moe_route's top-k, then the shared ones).
    for (int i = threadIdx.x; i <= total; i += blockDim.x) {
      if (i < total) s_order[i] = i;
      s_group[i] = i;
    }
    if (threadIdx.x == 0) s_num_groups = total;
  } else {
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      const int e = s_expert[i];
      int rank = 0;
      for (int q = 0; q < total; ++q) rank += s_expert[q] < e || (s_expert[q] == e && q < i);
      s_order[rank] = i;
    }
    __syncthreads();
    if (warp == 0) {
      int groups = 0;
      for (int base = 0; base < total; base += 32) {
        const int i = base + lane;
        bool start = false;
        if (i < total) {
          const int cur = s_order[i];
          const int prev = i > 0 ? s_order[i - 1] : -1;
          start = i == 0 || s_expert[cur] != s_expert[prev] || cur / per_token == prev / per_token;
        }
        const unsigned mask = __ballot_sync(0xffffffffu, start);
        if (start) s_group[groups + __popc(mask & ((1u << lane) - 1))] = i;
        groups += __popc(mask);
      }
      if (lane == 0) {
        s_group[groups] = total;
        s_num_groups = groups;
      }
    }
  }
  __syncthreads();

  const int D = a.hidden, I = a.inter, chunks = I / 8, groups = s_num_groups;
  float* partial = s_partial + warp * T * rows;
  for (int g = warp; g < groups; g += kDownWarps) {
    const int first = s_group[g], n = s_group[g + 1] - first;  // n <= T <= kMaxTok
    int slot[kMaxTok];
    float weight[kMaxTok];
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
      slot[t] = s_order[first + min(t, n - 1)];
      weight[t] = t < n ? a.slots.weight(slot[t]) : 0.0f;
    }
    const __nv_bfloat16* w = a.w_down + int64_t(s_expert[slot[0]]) * D * I;
    for (int r0 = 0; r0 < rows; r0 += kRowsPerWarp) {
      const __nv_bfloat16* row[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) row[r] = w + int64_t(min(d0 + r0 + r, D - 1)) * I;
      float acc[kRowsPerWarp][kMaxTok] = {};
      for (int k0 = 0; k0 < chunks; k0 += 32 * kUnroll) {
        uint4 wv[kRowsPerWarp][kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int kc = k0 + u * 32 + lane;
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r)
            wv[r][u] = kc < chunks ? load_weights_16(row[r] + kc * 8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int t = 0; t < kMaxTok; ++t) {
          if (t >= n) break;
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int kc = k0 + u * 32 + lane;
            if (kc >= chunks) break;
            float af[8];
            load_f32x8(a.act + int64_t(slot[t]) * I + kc * 8, af);
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) acc[r][t] = dot8(wv[r][u], af, acc[r][t]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kMaxTok; ++t) {
        if (t >= n) break;
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const float v = warp_sum(acc[r][t]);
          if (lane == 0 && r0 + r < rows) partial[(slot[t] / per_token) * rows + r0 + r] += weight[t] * v;
        }
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < T * rows; i += blockDim.x) {
    const int t = i / rows, r = i % rows;
    if (d0 + r >= D) continue;
    float sum = 0.0f;
    for (int w = 0; w < kDownWarps; ++w) sum += s_partial[(w * T + t) * rows + r];
    a.out[int64_t(t) * D + d0 + r] = __float2bfloat16(sum);
  }
}

template <int kMaxTok>
void launch_small(const SmallArgs& a, const MoeSmallTuning& tuning, cudaStream_t stream) {
  const int slots = a.num_tokens * a.slots.per_token();
  const int cols_per_block = kGateUpWarps * tuning.gate_up_cols_per_warp;
  const dim3 gate_up_grid((a.inter + cols_per_block - 1) / cols_per_block, slots);
  switch (tuning.gate_up_cols_per_warp) {
    case 1: moe_small_gate_up_kernel<kMaxTok, 1><<<gate_up_grid, kGateUpWarps * 32, 0, stream>>>(a); break;
    case 2: moe_small_gate_up_kernel<kMaxTok, 2><<<gate_up_grid, kGateUpWarps * 32, 0, stream>>>(a); break;
    case 4: moe_small_gate_up_kernel<kMaxTok, 4><<<gate_up_grid, kGateUpWarps * 32, 0, stream>>>(a); break;
    default: raise_error("moe_experts: gate_up_cols_per_warp must be 1, 2 or 4");
  }
  check_launch("moe small gate_up");
  const int rows = a.down_rows_per_block;
  const dim3 down_grid((a.hidden + rows - 1) / rows);
  const size_t smem = sizeof(float) * kDownWarps * a.num_tokens * rows;
  switch (tuning.down_rows_per_warp) {
    case 1: moe_small_down_kernel<kMaxTok, 1><<<down_grid, kDownWarps * 32, smem, stream>>>(a); break;
    case 2: moe_small_down_kernel<kMaxTok, 2><<<down_grid, kDownWarps * 32, smem, stream>>>(a); break;
    case 4: moe_small_down_kernel<kMaxTok, 4><<<down_grid, kDownWarps * 32, smem, stream>>>(a); break;
    default: raise_error("moe_experts: down_rows_per_warp must be 1, 2 or 4");
  }
  check_launch("moe small down");
}

void run_small(const MoeExpertsParams& p, void* workspace, cudaStream_t stream) {
  const MoeSmallTuning& t = p.tuning;
  MLA_CUDA_REQUIRE(t.down_rows_per_block > 0 && t.down_rows_per_block <= 64 &&
                       t.down_rows_per_block % t.down_rows_per_warp == 0,
                   "moe_experts: down_rows_per_block must be a multiple of down_rows_per_warp, at most 64");
  SmallArgs a;
  a.x = p.x;
  a.w_gate_up = p.w_gate_up;
  a.w_down = p.w_down;
  a.slots = MoeSlots{p.topk_ids, p.topk_weights, p.top_k, p.num_shared, p.num_experts};
  a.num_tokens = p.num_tokens;
  a.hidden = p.hidden;
  a.inter = p.inter;
  a.down_rows_per_block = t.down_rows_per_block;
  a.act = static_cast<__nv_bfloat16*>(workspace);
  a.out = p.out;
  if (p.num_tokens <= 1) launch_small<1>(a, t, stream);
  else if (p.num_tokens <= 2) launch_small<2>(a, t, stream);
  else if (p.num_tokens <= 4) launch_small<4>(a, t, stream);
  else launch_small<8>(a, t, stream);
}

void run_grouped(const MoeExpertsParams& p, void* workspace, cudaStream_t stream) {
  const int per_token = slots_per_token(p), total_experts = p.num_experts + p.num_shared;
  const int assignments = p.num_tokens * per_token;
  const int block_m = moe_block_m(p.num_tokens, per_token, total_experts);
  const int max_blocks = max_blocks_for(assignments, total_experts, block_m);
  const Workspace ws = carve_grouped(workspace, p);
  const MoeSlots slots{p.topk_ids, p.topk_weights, p.top_k, p.num_shared, p.num_experts};

  const size_t align_smem = sizeof(int32_t) * (3 * total_experts + 1);
  moe_align_kernel<<<1, 1024, align_smem, stream>>>(slots, assignments, total_experts, block_m, max_blocks * block_m,
                                                    ws.sorted_ids, ws.block_expert, ws.num_padded, ws.position);
  check_launch("moe align");

  GroupedGemmParams g;
  g.sorted_ids = ws.sorted_ids;
  g.block_expert = ws.block_expert;
  g.num_padded = ws.num_padded;
  g.slots_per_token = per_token;
  g.pad_sentinel = assignments;
  g.max_blocks = max_blocks;

  g.a = p.x;
  g.w = p.w_gate_up;
  g.c = ws.act;  // SiLU-and-mul happens in the gate_up epilogue
  g.n = 2 * p.inter;
  g.k = p.hidden;
  g.gather_a = true;
  grouped_gemm(g, block_m, stream);

  g.a = ws.act;
  g.w = p.w_down;
  g.c = ws.down;
  g.n = p.hidden;
  g.k = p.inter;
  g.gather_a = false;
  grouped_gemm(g, block_m, stream);

  moe_combine_kernel<<<p.num_tokens, 128, 0, stream>>>(ws.down, ws.position, slots, p.hidden, p.out);
  check_launch("moe combine");
}

}  // namespace

int moe_block_m(int num_tokens, int slots_per_token, int num_experts) {
  return int64_t(num_tokens) * slots_per_token <= int64_t(16) * num_experts ? 16 : 64;
}

MoePath moe_path(const MoeExpertsParams& p) {
  if (p.path != MoePath::Auto) return p.path;
  return p.num_tokens <= kMoeSmallMaxTokens && slots_per_token(p) <= kMoeSmallMaxSlots ? MoePath::Small
                                                                                       : MoePath::Grouped;
}

size_t moe_workspace_bytes(const MoeExpertsParams& p) {
  return moe_path(p) == MoePath::Small ? small_workspace_bytes(p) : carve_grouped(nullptr, p).bytes;
}

void moe_experts(const MoeExpertsParams& p, void* workspace, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(p.hidden % 8 == 0 && p.inter % 8 == 0 && p.num_experts > 0 && p.top_k > 0 && p.num_shared >= 0 &&
                       slots_per_token(p) <= kMoeMaxSlots,
                   "moe_experts: hidden " + std::to_string(p.hidden) + " and intermediate " +
                       std::to_string(p.inter) + " must be multiples of 8, top_k + shared experts at most " +
                       std::to_string(kMoeMaxSlots));
  if (p.num_tokens == 0) return;
  if (moe_path(p) == MoePath::Small) {
    MLA_CUDA_REQUIRE(p.num_tokens <= kMoeSmallMaxTokens,
                     "moe_experts: the small path takes at most " + std::to_string(kMoeSmallMaxTokens) + " tokens");
    run_small(p, workspace, stream);
  } else {
    run_grouped(p, workspace, stream);
  }
}

}  // namespace mlaserve::cuda

#include "kernels/cuda/moe_experts.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/moe_align.cuh"
#include "kernels/cuda/moe_small.cuh"

namespace mlaserve::cuda {
namespace {

constexpr int kBlockK = 64, kThreads = 128;
constexpr int kMoeMaxSlots = kMoeSmallMaxSlots;  // slots per token, both paths (the combine's registers)
static_assert(kMoeMaxSlots <= kMoeCombineMaxSlots, "moe_combine_kernel holds every slot of a token");
static_assert(kMoeSmallMaxSlots == kSmallMaxSlotsPerToken && kMoeSmallMaxTokens <= 8 && kFp8MoeSmallMaxTokens <= 8,
              "moe_experts.h's small-path limits are moe_small.cuh's");

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
  return small_moe_workspace_bytes(p.num_tokens, slots_per_token(p), p.hidden, p.inter, p.tuning.down_rows_per_warp);
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

void run_small(const MoeExpertsParams& p, void* workspace, cudaStream_t stream) {
  SmallMoeArgs<Bf16Stacks> a;
  a.w = Bf16Stacks{p.w_gate_up, p.w_down};
  a.x = p.x;
  a.slots = MoeSlots{p.topk_ids, p.topk_weights, p.top_k, p.num_shared, p.num_experts};
  a.route = p.route;
  a.num_tokens = p.num_tokens;
  a.hidden = p.hidden;
  a.inter = p.inter;
  a.out = p.out;
  run_small_moe(a, p.tuning.gate_up_cols_per_warp, p.tuning.down_rows_per_warp, workspace, stream,
                "moe_experts (small path)");
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

  moe_combine_kernel<<<p.num_tokens, 128, 0, stream>>>(ws.down, ws.position, slots, nullptr, p.hidden, p.out);
  check_launch("moe combine");
}

// The Hopper kernels' width limits (grouped_gemm_sm90.h).
bool sm90_widths_fit(const MoeExpertsParams& p) {
  return p.hidden % 256 == 0 && p.inter % 128 == 0 && p.top_k <= p.num_experts;
}

Sm90MoeParams sm90_params(const MoeExpertsParams& p) {
  Sm90MoeParams s;
  static_cast<MoeBatch&>(s) = p;
  s.w_gate_up = p.w_gate_up;
  s.w_down = p.w_down;
  return s;
}

}  // namespace

int moe_block_m(int num_tokens, int slots_per_token, int num_experts) {
  return int64_t(num_tokens) * slots_per_token <= int64_t(16) * num_experts ? 16 : 64;
}

MoePath moe_path(const MoeExpertsParams& p) {
  if (p.path != MoePath::Auto) return p.path;
  if (p.num_tokens <= kMoeSmallMaxTokens && slots_per_token(p) <= kMoeSmallMaxSlots) return MoePath::Small;
  // Shape and device only (no stream work), so graph capture sees the same choice.
  if (p.num_tokens >= kMoeSm90MinTokens && sm90_widths_fit(p) && sm90_gemm_supported()) return MoePath::Sm90;
  return MoePath::Grouped;
}

bool moe_routes_in_kernels(const MoeExpertsParams& p) {
  return p.num_tokens == 1 && moe_path(p) == MoePath::Small && p.num_experts <= 32 * kSmallRoutePerLane;
}

size_t moe_workspace_bytes(const MoeExpertsParams& p) {
  switch (moe_path(p)) {
    case MoePath::Small:
      return small_workspace_bytes(p);
    case MoePath::Sm90:
      return moe_experts_sm90_workspace_bytes(sm90_params(p));
    default:
      return carve_grouped(nullptr, p).bytes;
  }
}

void moe_experts(const MoeExpertsParams& p, void* workspace, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(p.hidden % 8 == 0 && p.inter % 8 == 0 && p.num_experts > 0 && p.top_k > 0 && p.num_shared >= 0 &&
                       slots_per_token(p) <= kMoeMaxSlots,
                   "moe_experts: hidden " + std::to_string(p.hidden) + " and intermediate " +
                       std::to_string(p.inter) + " must be multiples of 8, top_k + shared experts at most " +
                       std::to_string(kMoeMaxSlots));
  if (p.route.logits) {
    MLA_CUDA_REQUIRE(moe_routes_in_kernels(p) && p.route.num_tokens == 1 && p.route.num_experts == p.num_experts &&
                         p.route.top_k == p.top_k && p.route.topk_ids == p.topk_ids &&
                         p.route.topk_weights == p.topk_weights,
                     "moe_experts: routing inside the kernels takes one token on the small path, at most " +
                         std::to_string(32 * kSmallRoutePerLane) +
                         " experts, and route's outputs as topk_ids / weights");
    require_valid_route(p.route, "moe_experts");
    MLA_CUDA_REQUIRE(!p.route.norm.parts || (p.route.norm.width == p.hidden && p.hidden <= kMaxPendingWidth),
                     "moe_experts: a pending norm of width " + std::to_string(p.route.norm.width) + " for hidden " +
                         std::to_string(p.hidden) + " (at most " + std::to_string(kMaxPendingWidth) + ")");
  }
  if (p.num_tokens == 0) return;
  switch (moe_path(p)) {
    case MoePath::Small:
      run_small(p, workspace, stream);
      break;
    case MoePath::Sm90:
      moe_experts_sm90(sm90_params(p), workspace, stream);
      break;
    default:
      run_grouped(p, workspace, stream);
  }
}

}  // namespace mlaserve::cuda

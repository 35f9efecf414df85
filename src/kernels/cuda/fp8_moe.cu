#include "kernels/cuda/fp8_moe.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/bf16_vec.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/moe_align.cuh"
#include "kernels/cuda/moe_small.cuh"

namespace mlaserve::cuda {
namespace {

struct MoeShape {
  int assignments, block_m, max_chunks, max_rows;
  int64_t x_scale_ld, act_scale_ld;
};

int slots_per_token(const Fp8MoeParams& p) { return p.top_k + p.num_shared; }
int total_experts(const Fp8MoeParams& p) { return p.num_experts + p.num_shared; }

MoeShape shape_of(const Fp8MoeParams& p) {
  MoeShape s;
  s.assignments = p.num_tokens * slots_per_token(p);
  s.block_m = fp8_moe_block_m(p.num_tokens, slots_per_token(p), total_experts(p));
  // Each expert's run adds at most one partly filled chunk.
  s.max_chunks = (s.assignments + s.block_m - 1) / s.block_m + std::min(total_experts(p), s.assignments);
  s.max_rows = s.max_chunks * s.block_m;
  s.x_scale_ld = fp8_act_scale_ld(p.num_tokens);
  s.act_scale_ld = fp8_act_scale_ld(s.max_rows);
  return s;
}

struct Workspace {
  int32_t *sorted_ids, *chunk_expert, *rows_in_use, *position;
  uint8_t *x_q, *act_q;
  float *x_scale, *act_scale;
  __nv_bfloat16 *gate_up, *down;
  void* gemm;  // split-K partial sums of either GEMM
  size_t bytes;
};

Fp8GemmParams gate_up_params(const Fp8MoeParams& p, const MoeShape& s, const Workspace& w) {
  Fp8GemmParams g;
  g.a = w.x_q;
  g.a_row_stride = p.hidden;
  g.a_scale = w.x_scale;
  g.a_scale_kb_stride = s.x_scale_ld;
  g.w = p.w_gate_up;
  g.w_batch_stride = int64_t(2) * p.inter * p.hidden;
  g.w_scale = p.w_gate_up_scale;
  g.w_scale_ld = p.hidden / kFp8Group;
  g.w_scale_batch_stride = int64_t(2) * p.inter / kFp8Group * g.w_scale_ld;
  g.out = w.gate_up;
  g.out_row_stride = 2 * p.inter;
  g.m = s.max_rows;
  g.n = 2 * p.inter;
  g.k = p.hidden;
  g.chunk_batch = w.chunk_expert;
  g.rows_in_use = w.rows_in_use;
  g.max_chunks = s.max_chunks;
  g.gather_ids = w.sorted_ids;
  g.gather_div = slots_per_token(p);
  g.gather_sentinel = s.assignments;
  return g;
}

Fp8GemmParams down_params(const Fp8MoeParams& p, const MoeShape& s, const Workspace& w) {
  Fp8GemmParams g;
  g.a = w.act_q;
  g.a_row_stride = p.inter;
  g.a_scale = w.act_scale;
  g.a_scale_kb_stride = s.act_scale_ld;
  g.w = p.w_down;
  g.w_batch_stride = int64_t(p.hidden) * p.inter;
  g.w_scale = p.w_down_scale;
  g.w_scale_ld = p.inter / kFp8Group;
  g.w_scale_batch_stride = int64_t(p.hidden) / kFp8Group * g.w_scale_ld;
  g.out = w.down;
  g.out_row_stride = p.hidden;
  g.m = s.max_rows;
  g.n = p.hidden;
  g.k = p.inter;
  g.chunk_batch = w.chunk_expert;
  g.rows_in_use = w.rows_in_use;
  g.max_chunks = s.max_chunks;
  return g;
}

// Pointers into `base` (null: only the size is computed).
Workspace carve(void* base, const Fp8MoeParams& p, const MoeShape& s) {
  auto* bytes = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t n) {
    char* r = bytes ? bytes + off : nullptr;
    off += (n + 255) / 256 * 256;
    return r;
  };
  Workspace w;
  w.sorted_ids = reinterpret_cast<int32_t*>(take(size_t(s.max_rows) * 4));
  w.chunk_expert = reinterpret_cast<int32_t*>(take(size_t(s.max_chunks) * 4));
  w.rows_in_use = reinterpret_cast<int32_t*>(take(4));
  w.position = reinterpret_cast<int32_t*>(take(size_t(s.assignments) * 4));
  w.x_q = reinterpret_cast<uint8_t*>(take(size_t(s.x_scale_ld) * p.hidden));
  w.x_scale = reinterpret_cast<float*>(take(size_t(s.x_scale_ld) * (p.hidden / kFp8Group) * 4));
  w.gate_up = reinterpret_cast<__nv_bfloat16*>(take(size_t(s.max_rows) * 2 * p.inter * 2));
  w.act_q = reinterpret_cast<uint8_t*>(take(size_t(s.act_scale_ld) * p.inter));
  w.act_scale = reinterpret_cast<float*>(take(size_t(s.act_scale_ld) * (p.inter / kFp8Group) * 4));
  w.down = reinterpret_cast<__nv_bfloat16*>(take(size_t(s.max_rows) * p.hidden * 2));
  const size_t gemm_bytes = std::max(plan_fp8_gemm(gate_up_params(p, s, w), s.block_m).workspace_bytes,
                                     plan_fp8_gemm(down_params(p, s, w), s.block_m).workspace_bytes);
  w.gemm = take(gemm_bytes);
  w.bytes = off;
  return w;
}

__global__ void fp8_moe_combine_kernel(const __nv_bfloat16* down, const int32_t* position, MoeSlots slots,
                                       int hidden, __nv_bfloat16* out) {
  const int64_t t = blockIdx.x;
  const int per_token = slots.per_token();
  for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8) {
    float acc[8] = {};
    for (int j = 0; j < per_token; ++j) {
      const int slot = int(t) * per_token + j;
      const float wt = slots.weight(slot);
      float y[8];
      Bf16x8::load(down + int64_t(position[slot]) * hidden + i).to_float(y);
#pragma unroll
      for (int v = 0; v < 8; ++v) acc[v] += wt * y[v];
    }
    Bf16x8::from_float(acc).store(out + t * hidden + i);
  }
}

}  // namespace

int fp8_moe_block_m(int num_tokens, int slots_per_token, int num_experts) {
  const int assignments = num_tokens * slots_per_token;
  const int active = std::max(1, std::min(num_experts, assignments));
  const int rows_per_expert = (assignments + active - 1) / active;
  int block_m = 8;
  while (block_m < rows_per_expert && block_m < 128) block_m *= 2;
  return block_m;
}

namespace {

// The Hopper kernels' width limits (grouped_gemm_sm90.h).
bool sm90_widths_fit(const Fp8MoeParams& p) {
  return p.hidden % 256 == 0 && p.inter % 128 == 0 && slots_per_token(p) <= 16 && p.top_k <= p.num_experts;
}

Sm90MoeParams sm90_params(const Fp8MoeParams& p) {
  Sm90MoeParams s;
  static_cast<MoeBatch&>(s) = p;
  s.w_gate_up = p.w_gate_up;
  s.w_down = p.w_down;
  s.w_gate_up_scale = p.w_gate_up_scale;
  s.w_down_scale = p.w_down_scale;
  return s;
}

}  // namespace

MoePath fp8_moe_path(const Fp8MoeParams& p) {
  if (p.path != MoePath::Auto) return p.path;
  if (p.num_tokens <= kFp8MoeSmallMaxTokens && slots_per_token(p) <= kMoeSmallMaxSlots) return MoePath::Small;
  // Shape and device only (no stream work), so graph capture sees the same choice.
  if (p.num_tokens >= kFp8MoeSm90MinTokens && sm90_widths_fit(p) && sm90_gemm_supported()) return MoePath::Sm90;
  return MoePath::Grouped;
}

size_t fp8_moe_workspace_bytes(const Fp8MoeParams& p) {
  switch (fp8_moe_path(p)) {
    case MoePath::Small:
      return small_moe_workspace_bytes(p.num_tokens, slots_per_token(p), p.hidden, p.inter,
                                       p.tuning.down_rows_per_warp);
    case MoePath::Sm90:
      return fp8_moe_experts_sm90_workspace_bytes(sm90_params(p));
    default:
      return carve(nullptr, p, shape_of(p)).bytes;
  }
}

void fp8_moe_experts(const Fp8MoeParams& p, void* workspace, cudaStream_t stream) {
  MLA_CUDA_REQUIRE(p.hidden % kFp8Group == 0 && p.inter % kFp8Group == 0,
                   "fp8 moe: hidden " + std::to_string(p.hidden) + " and inter " + std::to_string(p.inter) +
                       " must be multiples of 128");
  MLA_CUDA_REQUIRE(p.num_experts > 0 && p.top_k > 0 && p.top_k <= p.num_experts && p.num_shared >= 0,
                   "fp8 moe: top_k must be in [1, num_experts]");
  if (p.num_tokens == 0) return;
  const MoePath path = fp8_moe_path(p);
  if (path == MoePath::Sm90) {
    fp8_moe_experts_sm90(sm90_params(p), workspace, stream);
    return;
  }
  const MoeSlots slots{p.topk_ids, p.topk_weights, p.top_k, p.num_shared, p.num_experts};
  if (path == MoePath::Small) {
    SmallMoeArgs<Fp8Stacks> a;
    a.w = Fp8Stacks{p.w_gate_up, p.w_down, p.w_gate_up_scale, p.w_down_scale};
    a.x = p.x;
    a.slots = slots;
    a.num_tokens = p.num_tokens;
    a.hidden = p.hidden;
    a.inter = p.inter;
    a.out = p.out;
    run_small_moe(a, p.tuning.gate_up_cols_per_warp, p.tuning.down_rows_per_warp, workspace, stream,
                  "fp8 moe (small path)");
    return;
  }
  const MoeShape s = shape_of(p);
  const Workspace w = carve(workspace, p, s);

  quantize_fp8_act(p.x, p.num_tokens, p.hidden, p.hidden, w.x_q, w.x_scale, s.x_scale_ld, stream);
  const size_t align_smem = size_t(3 * total_experts(p) + 1) * sizeof(int32_t);
  moe_align_kernel<<<1, 1024, align_smem, stream>>>(slots, s.assignments, total_experts(p), s.block_m, s.max_rows,
                                                    w.sorted_ids, w.chunk_expert, w.rows_in_use, w.position);
  check_launch("fp8 moe align");

  const Fp8GemmParams gu = gate_up_params(p, s, w);
  run_fp8_gemm(gu, plan_fp8_gemm(gu, s.block_m), w.gemm, stream);
  silu_and_mul_quantize_fp8(w.gate_up, w.gate_up + p.inter, 2 * p.inter, s.max_rows, p.inter, w.act_q, w.act_scale,
                            s.act_scale_ld, stream);
  const Fp8GemmParams dn = down_params(p, s, w);
  run_fp8_gemm(dn, plan_fp8_gemm(dn, s.block_m), w.gemm, stream);

  fp8_moe_combine_kernel<<<p.num_tokens, 128, 0, stream>>>(w.down, w.position, slots, p.hidden, p.out);
  check_launch("fp8 moe combine");
}

}  // namespace mlaserve::cuda

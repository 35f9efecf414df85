#include "kernels/cuda/fp8_mla_bmm.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_quant.h"

namespace mlaserve::cuda {
namespace {

void check_shape(const Fp8MlaShape& s) {
  MLA_CUDA_REQUIRE(s.heads > 0 && s.nope_dim > 0 && s.v_dim > 0 && s.kv_lora_rank > 0 &&
                       s.nope_dim % kFp8Group == 0 && s.v_dim % kFp8Group == 0 && s.kv_lora_rank % kFp8Group == 0,
                   "fp8 MLA BMM: Dn " + std::to_string(s.nope_dim) + ", Dv " + std::to_string(s.v_dim) + " and L " +
                       std::to_string(s.kv_lora_rank) + " must be positive multiples of 128");
}

// Activations and their scales in the workspace, then the GEMM's split-K sums.
struct Workspace {
  uint8_t* x_q;
  float* x_scale;
  void* gemm;
};

Workspace carve(void* base, const Fp8MlaShape& s, int64_t tokens, size_t* bytes) {
  const int64_t rows = fp8_act_scale_ld(tokens * s.heads), width = std::max(s.nope_dim, s.kv_lora_rank);
  auto* b = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t n) {
    char* r = b ? b + off : nullptr;
    off += (n + 255) / 256 * 256;
    return r;
  };
  Workspace w;
  w.x_q = reinterpret_cast<uint8_t*>(take(size_t(rows) * width));
  w.x_scale = reinterpret_cast<float*>(take(size_t(rows) * (width / kFp8Group) * 4));
  w.gemm = b ? b + off : nullptr;
  if (bytes) *bytes = off;
  return w;
}

// Per-head GEMM over activations quantized as rows (t, h) of width K.
Fp8GemmParams head_params(const Fp8MlaShape& s, int64_t tokens, const Workspace& ws, int64_t k, int64_t n) {
  Fp8GemmParams p;
  p.a = ws.x_q;
  p.a_row_stride = s.heads * k;
  p.a_batch_stride = k;
  p.a_scale = ws.x_scale;
  p.a_scale_row_stride = s.heads;
  p.a_scale_batch_stride = 1;
  p.a_scale_kb_stride = fp8_act_scale_ld(tokens * s.heads);
  p.out_row_stride = s.heads * n;
  p.out_batch_stride = n;
  p.m = tokens;
  p.n = n;
  p.k = k;
  p.batch = s.heads;
  return p;
}

Fp8GemmParams q_absorb_params(const Fp8MlaWeights& w, int64_t tokens, const Workspace& ws) {
  const Fp8MlaShape& s = w.shape;
  Fp8GemmParams p = head_params(s, tokens, ws, s.nope_dim, s.kv_lora_rank);
  p.w = w.w_uk_t;
  p.w_batch_stride = int64_t(s.kv_lora_rank) * s.nope_dim;
  p.w_scale = w.w_uk_t_scale;
  p.w_scale_ld = s.nope_dim / kFp8Group;
  p.w_scale_batch_stride = int64_t(s.kv_lora_rank / kFp8Group) * p.w_scale_ld;
  return p;
}

Fp8GemmParams v_up_params(const Fp8MlaWeights& w, int64_t tokens, const Workspace& ws) {
  const Fp8MlaShape& s = w.shape;
  const int64_t head_rows = s.nope_dim + s.v_dim, kb = s.kv_lora_rank / kFp8Group;
  Fp8GemmParams p = head_params(s, tokens, ws, s.kv_lora_rank, s.v_dim);
  p.w = w.kv_b + int64_t(s.nope_dim) * s.kv_lora_rank;
  p.w_batch_stride = head_rows * s.kv_lora_rank;
  p.w_scale = w.kv_b_scale + (s.nope_dim / kFp8Group) * kb;
  p.w_scale_ld = kb;
  p.w_scale_batch_stride = head_rows / kFp8Group * kb;
  return p;
}

// w_uk_t[h][c][d] = kv_b[h * (Dn + Dv) + d][c]; one thread a byte (load time only).
__global__ void repack_w_uk_kernel(const uint8_t* kv_b, int64_t heads, int64_t dn, int64_t dv, int64_t l,
                                   uint8_t* w_uk_t) {
  const int64_t total = heads * l * dn;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / (l * dn), c = (i / dn) % l, d = i % dn;
    w_uk_t[i] = kv_b[(h * (dn + dv) + d) * l + c];
  }
}

__global__ void repack_w_uk_scale_kernel(const float* kv_b_scale, int64_t heads, int64_t dn_blocks,
                                         int64_t head_blocks, int64_t l_blocks, float* w_uk_t_scale) {
  const int64_t total = heads * l_blocks * dn_blocks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / (l_blocks * dn_blocks), cb = (i / dn_blocks) % l_blocks, db = i % dn_blocks;
    w_uk_t_scale[i] = kv_b_scale[(h * head_blocks + db) * l_blocks + cb];
  }
}

}  // namespace

size_t fp8_w_uk_t_bytes(const Fp8MlaShape& s) { return size_t(s.heads) * s.kv_lora_rank * s.nope_dim; }

size_t fp8_w_uk_t_scale_count(const Fp8MlaShape& s) {
  return size_t(s.heads) * (s.kv_lora_rank / kFp8Group) * (s.nope_dim / kFp8Group);
}

void fp8_repack_w_uk(const Fp8MlaShape& s, const uint8_t* kv_b, const float* kv_b_scale, uint8_t* w_uk_t,
                     float* w_uk_t_scale, cudaStream_t stream) {
  check_shape(s);
  repack_w_uk_kernel<<<1024, 256, 0, stream>>>(kv_b, s.heads, s.nope_dim, s.v_dim, s.kv_lora_rank, w_uk_t);
  check_launch("fp8 repack W_UK");
  repack_w_uk_scale_kernel<<<64, 256, 0, stream>>>(kv_b_scale, s.heads, s.nope_dim / kFp8Group,
                                                   (s.nope_dim + s.v_dim) / kFp8Group, s.kv_lora_rank / kFp8Group,
                                                   w_uk_t_scale);
  check_launch("fp8 repack W_UK scales");
}

size_t fp8_mla_bmm_workspace_bytes(const Fp8MlaShape& s, int64_t tokens) {
  check_shape(s);
  if (tokens == 0) return 0;
  Fp8MlaWeights w;
  w.shape = s;
  size_t bytes = 0;
  const Workspace ws = carve(nullptr, s, tokens, &bytes);
  return bytes + std::max(plan_fp8_gemm(q_absorb_params(w, tokens, ws)).workspace_bytes,
                          plan_fp8_gemm(v_up_params(w, tokens, ws)).workspace_bytes);
}

void fp8_q_absorb(const Fp8MlaWeights& w, const __nv_bfloat16* q, int64_t q_head_stride, int64_t tokens,
                  __nv_bfloat16* out, void* workspace, cudaStream_t stream) {
  check_shape(w.shape);
  if (tokens == 0) return;
  const Workspace ws = carve(workspace, w.shape, tokens, nullptr);
  const int64_t rows = tokens * w.shape.heads;
  quantize_fp8_act(q, rows, w.shape.nope_dim, q_head_stride, ws.x_q, ws.x_scale, fp8_act_scale_ld(rows), stream);
  Fp8GemmParams p = q_absorb_params(w, tokens, ws);
  p.out = out;
  run_fp8_gemm(p, plan_fp8_gemm(p), ws.gemm, stream);
}

void fp8_v_up(const Fp8MlaWeights& w, const __nv_bfloat16* o_latent, int64_t tokens, __nv_bfloat16* out,
              void* workspace, cudaStream_t stream) {
  check_shape(w.shape);
  if (tokens == 0) return;
  const Workspace ws = carve(workspace, w.shape, tokens, nullptr);
  const int64_t rows = tokens * w.shape.heads;
  quantize_fp8_act(o_latent, rows, w.shape.kv_lora_rank, w.shape.kv_lora_rank, ws.x_q, ws.x_scale,
                   fp8_act_scale_ld(rows), stream);
  Fp8GemmParams p = v_up_params(w, tokens, ws);
  p.out = out;
  run_fp8_gemm(p, plan_fp8_gemm(p), ws.gemm, stream);
}

}  // namespace mlaserve::cuda

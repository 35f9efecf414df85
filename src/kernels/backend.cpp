#include "kernels/backend.h"

#include "core/error.h"
#include "kernels/cuda/cuda_graph_runner.h"

namespace mlaserve {

bool Backend::mla_decode_chain(const MlaDecodeChain&, const DeviceBatch&, Tensor) { return false; }

Tensor Backend::mla_chain_router_fold(const Weight&, const Tensor&, const Weight&) { return {}; }

void Backend::moe_select(const Tensor& h, const Weight& router, const Tensor& bias, const RouterParams& p,
                         Tensor topk_ids, Tensor topk_weights) {
  Tensor logits = alloc({h.dim(0), router.out_features()}, DType::F32);
  linear_f32_out(h, router, logits);
  moe_route(logits, bias, p, topk_ids, topk_weights);
}

void Backend::rms_norm_moe_select(const ResidualNorm& in, Tensor normed, const Weight& router, const Tensor& bias,
                                  const RouterParams& p, Tensor topk_ids, Tensor topk_weights) {
  rms_norm(in.x, in.norm_weight, in.eps, normed, in.residual);
  moe_select(normed, router, bias, p, topk_ids, topk_weights);
}

void Backend::moe_route_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& logits,
                                const Tensor& bias, const RouterParams& p, Tensor topk_ids, Tensor topk_weights,
                                Tensor out, const PendingNorm* pending) {
  MLA_CHECK(!pending, "moe_route_experts: the {} backend leaves no norm pending", name());
  moe_route(logits, bias, p, topk_ids, topk_weights);
  moe_experts(x, experts, topk_ids, topk_weights, out);
}

void Backend::rms_norm_linears(const Tensor& x, const Tensor& norm_w, float eps, Tensor residual,
                               const std::vector<LinearTarget>& targets) {
  Tensor normed = alloc(x.shape(), act_dtype());
  rms_norm(x, norm_w, eps, normed, residual);
  for (const LinearTarget& t : targets) linear(normed, *t.w, t.out);
}

void Backend::silu_and_mul_linear(const Tensor& gate_up, const Weight& w, Tensor out) {
  Tensor hidden = alloc({gate_up.dim(0), gate_up.dim(-1) / 2}, act_dtype());
  silu_and_mul_gate_up(gate_up, hidden);
  linear(hidden, w, out);
}

void Backend::head_bmm_linear(const Tensor& x, const Weight& w, bool transpose_w, const Weight& proj, Tensor out) {
  const int64_t T = x.dim(0), H = x.dim(1), N = transpose_w ? w.w.dim(1) : w.w.dim(2);
  Tensor rows = alloc({T, H, N}, act_dtype());
  head_bmm(x, w, transpose_w, rows);
  linear(rows.view({T, H * N}), proj, out);
}

void Backend::mla_prepare_q_b(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                              const Tensor& inv_freq, float cos_sin_scale, const Weight& q_b, Tensor q) {
  MlaPrepare with_rows = p;
  if (!with_rows.q_a_out.defined())
    with_rows.q_a_out = alloc({positions.numel(), p.q_a_norm.numel()}, act_dtype());
  mla_prepare(with_rows, positions, out_slots, inv_freq, cos_sin_scale);
  linear(with_rows.q_a_out, q_b, q);
}

void Backend::rms_norm_linear_mla_prepare_q_b(const ResidualNorm& in, const Weight& w, const MlaPrepare& p,
                                              const Tensor& positions, const Tensor& out_slots,
                                              const Tensor& inv_freq, float cos_sin_scale, const Weight& q_b,
                                              Tensor q) {
  MLA_CHECK(!p.q_a.defined() && !p.kv.defined(), "rms_norm_linear_mla_prepare_q_b: q_a and kv are the op's own");
  MlaPrepare with = p;
  with.q_a = with.kv = alloc({in.x.dim(0), w.out_features()}, act_dtype());
  rms_norm_linears(in.x, in.norm_weight, in.eps, in.residual, {LinearTarget{&w, with.q_a}});
  mla_prepare_q_b(with, positions, out_slots, inv_freq, cos_sin_scale, q_b, q);
}

void Backend::mla_prepare_head_bmm(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                                   const Tensor& inv_freq, float cos_sin_scale, const Tensor& x, const Weight& w,
                                   bool transpose_w, Tensor out) {
  mla_prepare(p, positions, out_slots, inv_freq, cos_sin_scale);
  head_bmm(x, w, transpose_w, out);
}

void Backend::mla_attention_expanded_linear(const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                            const DeviceBatch& batch, float scale, const Weight& w, Tensor out) {
  const int64_t T = q.dim(0), H = q.dim(1), Dv = kv.dim(2) - (q.dim(2) - k_pe.dim(1));
  Tensor attn = alloc({T, H, Dv}, act_dtype());
  mla_attention_expanded(q, kv, k_pe, batch, scale, attn);
  linear(attn.view({T, H * Dv}), w, out);
}

#ifndef MLASERVE_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(size_t) { return nullptr; }
std::unique_ptr<DecodeGraphRunner> make_decode_graph_runner(Backend&, const DecodeGraphOptions&, DecodeStepFn) {
  return nullptr;
}
#endif

}  // namespace mlaserve

#include "model/mla_attention.h"

namespace mlaserve {

// RMSNorm epsilon of q_a_layernorm and kv_a_layernorm: DeepSeek's reference
// code and transformers build them with the RMSNorm default, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

int absorbed_leading_seqs(const ForwardBatch& batch) {
  // Per sequence and head, absorbed: q_len x kv_len x (576 + 512) x 2 FLOPs;
  // expanded: kv_len x 512 x 256 x 2 of kv_b_proj for every cached row plus
  // the causal attention's 320 x 2 a pair. Measured on v3-slice, 8 sequences
  // over 4096 cached tokens (H100, perf.md session 9): absorbed 1.9x faster
  // at 16 new tokens, 1.3x at 64, even at 128, slower at 256.
  // A decode step (one new token) takes it whatever its context.
  const bool decode = batch.is_decode();
  for (int b = 0; b < batch.num_seqs(); ++b) {
    const int q_len = batch.q_indptr[b + 1] - batch.q_indptr[b];
    const int kv_len = batch.kv_indptr[b + 1] - batch.kv_indptr[b];
    if (!decode && (kv_len <= q_len || q_len > kMaxAbsorbedExtendTokens)) return b;
  }
  return batch.num_seqs();
}

bool absorbed_form_pays_off(const ForwardBatch& batch) {
  return absorbed_leading_seqs(batch) == batch.num_seqs();
}

std::optional<MlaDecodeChain> decode_chain(const MlaContext& ctx, const MlaWeights& w, const Tensor& h, Tensor cache) {
  if (!w.fused_qkv_a_proj || ctx.config->q_lora_rank || w.w_uk.is_fp8()) return std::nullopt;
  MlaDecodeChain chain;
  chain.h = h;
  chain.qkv_a = &*w.fused_qkv_a_proj;
  chain.kv_norm = w.kv_a_layernorm;
  chain.w_uk = w.w_uk.w;
  chain.w_uv = w.w_uv.w;
  chain.o_proj = &w.o_proj;
  chain.cache = cache;
  chain.inv_freq = ctx.inv_freq;
  chain.cos_sin_scale = ctx.cos_sin_scale;
  chain.eps = kLatentNormEps;
  chain.softmax_scale = ctx.softmax_scale;
  return chain;
}

bool mla_attention(Backend& backend, const MlaContext& ctx, const MlaWeights& w, const Tensor& h,
                   const DeviceBatch& batch, const MlaBatchPlan& plan, Tensor cache, Tensor out,
                   const MlaChainMoeTail* moe_tail, const ResidualNorm* norm_head) {
  const ModelConfig& c = *ctx.config;
  const int64_t T = h.dim(0), H = c.num_attention_heads, L = c.kv_lora_rank, R = c.qk_rope_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dv = c.v_head_dim, Nq = H * (Dn + R);
  const DType act = backend.act_dtype();
  const bool split = plan.split_token > 0, absorbed = plan.absorbed && !split;
  if (auto chain = absorbed ? decode_chain(ctx, w, h, cache) : std::nullopt) {
    chain->norm_head = norm_head;
    chain->moe_tail = moe_tail;
    if (moe_tail && backend.mla_decode_chain(*chain, batch, out)) return true;
    chain->moe_tail = nullptr;
    if (backend.mla_decode_chain(*chain, batch, out)) return false;
  }
  // The projections of h; with norm_head, h is formed inside the op that
  // feeds them (Backend::rms_norm_linears) and never written.
  auto project = [&](const std::vector<LinearTarget>& targets) {
    if (norm_head) {
      backend.rms_norm_linears(norm_head->x, norm_head->norm_weight, norm_head->eps, norm_head->residual, targets);
      return;
    }
    for (const LinearTarget& t : targets) backend.linear(h, *t.w, t.out);
  };
  auto prepare = [&](const MlaPrepare& p) {
    backend.mla_prepare(p, batch.positions, batch.out_slots, ctx.inv_freq, ctx.cos_sin_scale);
  };

  // The projections of h: q {T, Nq} (or q_a {T, Q}) and kv_a {T, L + R},
  // either as columns of the fused GEMM's rows or as separate outputs.
  MlaPrepare p;
  p.kv_norm = w.kv_a_layernorm;
  p.cache = cache;
  p.eps = kLatentNormEps;
  // q's source for the q split: q_proj's columns, or q_b_proj(q_a_layernorm(q_a))
  // with the latent write and the q_a norm done first in one op, the norm
  // feeding q_b_proj directly.
  auto q_from_q_b = [&]() {
    p.q_a_norm = w.q_a_layernorm;
    return backend.alloc({T, Nq}, act);
  };
  Tensor q;
  if (w.fused_qkv_a_proj && c.q_lora_rank && norm_head) {
    // The input norm, the fused projection, the latent write, the q_a norm
    // and q_b as one op (the projection's split-K sum inside the prepare's
    // launch at decode on CUDA).
    p.kv_col = w.fused_qkv_a_proj->out_features() - (L + R);
    q = q_from_q_b();
    backend.rms_norm_linear_mla_prepare_q_b(*norm_head, *w.fused_qkv_a_proj, p, batch.positions, batch.out_slots,
                                            ctx.inv_freq, ctx.cos_sin_scale, *w.q_b_proj, q);
  } else {
    Tensor q_or_q_a;
    if (w.fused_qkv_a_proj) {
      const int64_t width = w.fused_qkv_a_proj->out_features();
      Tensor fused = backend.alloc({T, width}, act);
      project({LinearTarget{&*w.fused_qkv_a_proj, fused}});
      q_or_q_a = fused;
      p.kv = fused;
      p.kv_col = width - (L + R);
    } else {
      const Weight& q_first = w.q_proj ? *w.q_proj : *w.q_a_proj;
      q_or_q_a = backend.alloc({T, q_first.out_features()}, act);
      p.kv = backend.alloc({T, L + R}, act);
      project({LinearTarget{&q_first, q_or_q_a}, LinearTarget{&*w.kv_a_proj_with_mqa, p.kv}});
    }
    if (c.q_lora_rank) {
      p.q_a = q_or_q_a;
      q = q_from_q_b();
      backend.mla_prepare_q_b(p, batch.positions, batch.out_slots, ctx.inv_freq, ctx.cos_sin_scale, *w.q_b_proj, q);
    } else {
      q = q_or_q_a;
    }
  }
  if (c.q_lora_rank) {
    p = MlaPrepare{};
    p.eps = kLatentNormEps;
  }
  p.q = q;
  p.nope_dim = Dn;
  // A q of exactly Nq columns is {T, H, Dn + R}: q_nope is read and q_pe roped in place.
  const bool q_alone = p.q.dim(-1) == Nq;

  // The absorbed form's attention for the part's tokens over q_cat{Ta, H, L +
  // R} (q_nope · W_UK in its first L columns, the roped q_pe after): the
  // latent rows o_latent{Ta, H, L} that W_UV takes.
  auto attend_latent = [&](const Tensor& q_cat, const DeviceBatch& part) {
    Tensor o_latent = backend.alloc({q_cat.dim(0), H, L}, act);
    backend.mla_attention_absorbed(q_cat, cache, part, ctx.softmax_scale, o_latent);
    return o_latent;
  };
  // The expanded form's keys and values over the part's kv tokens, cached
  // prefix included: kv{Lk, H, Dn + Dv} = kv_b_proj(c_kv) and k_pe{Lk, R}.
  struct ExpandedKv {
    Tensor kv, k_pe;
  };
  auto expanded_kv = [&](const DeviceBatch& part) {
    const int64_t Lk = part.kv_slots.numel();
    Tensor rows = backend.alloc({Lk, L + R}, act);
    backend.gather_rows(cache, part.kv_slots, rows);
    Tensor kv_c = backend.alloc({Lk, L}, act);
    backend.copy_columns(rows, 0, kv_c, 0, L);
    Tensor k_pe = backend.alloc({Lk, R}, act);
    backend.copy_columns(rows, L, k_pe, 0, R);
    Tensor kv = backend.alloc({Lk, H * (Dn + Dv)}, act);
    backend.linear(kv_c, w.kv_b_proj, kv);
    return ExpandedKv{kv.view({Lk, H, Dn + Dv}), k_pe};
  };
  if (absorbed) {
    // q_cat{T, H, L + R} = [q_nope · W_UK | rope(q_pe)], the rows the attention
    // reads: the product lands in the first L columns, the roped q_pe after.
    Tensor q_cat = backend.alloc({T, H, L + R}, act);
    Tensor q_nope = q_alone ? p.q.view({T, H, Dn + R}) : backend.alloc({T, H, Dn}, act);
    if (!q_alone) p.q_nope_out = q_nope;
    p.q_pe_out = q_cat;
    p.q_pe_col = L;
    // The q split and q_nope · W_UK in one op (one launch at decode on CUDA),
    // W_UV's product feeding o_proj in another (block-FP8 rows on CUDA).
    backend.mla_prepare_head_bmm(p, batch.positions, batch.out_slots, ctx.inv_freq, ctx.cos_sin_scale, q_nope, w.w_uk,
                                 /*transpose_w=*/w.w_uk_transposed(), q_cat);
    backend.head_bmm_linear(attend_latent(q_cat, batch), w.w_uv, /*transpose_w=*/true, w.o_proj, out);
  } else {
    // q{T, H, Dn + R} with q_pe roped.
    Tensor q = q_alone ? p.q.view({T, H, Dn + R}) : backend.alloc({T, H, Dn + R}, act);
    if (!q_alone) p.q_nope_out = q;
    p.q_pe_out = q;
    p.q_pe_col = Dn;
    prepare(p);
    if (split) {
      // The absorbed part's roped q_pe is copied next to its q_nope · W_UK.
      const int64_t Ta = plan.split_token;
      const Tensor q_a = q.slice_rows(0, Ta);
      Tensor q_cat = backend.alloc({Ta, H, L + R}, act);
      backend.copy_columns(q_a.view({Ta * H, Dn + R}), Dn, q_cat.view({Ta * H, L + R}), L, R);
      Tensor attn = backend.alloc({T, H, Dv}, act);
      backend.head_bmm(q_a, w.w_uk, /*transpose_w=*/w.w_uk_transposed(), q_cat);
      backend.head_bmm(attend_latent(q_cat, plan.absorbed_part), w.w_uv, /*transpose_w=*/true,
                       attn.slice_rows(0, Ta));
      const ExpandedKv e = expanded_kv(plan.expanded_part);
      backend.mla_attention_expanded(q.slice_rows(Ta, T), e.kv, e.k_pe, plan.expanded_part, ctx.softmax_scale,
                                     attn.slice_rows(Ta, T));
      backend.linear(attn.view({T, H * Dv}), w.o_proj, out);
    } else {
      // The attention output feeds o_proj in one op (block-FP8 rows on CUDA).
      const ExpandedKv e = expanded_kv(batch);
      backend.mla_attention_expanded_linear(q, e.kv, e.k_pe, batch, ctx.softmax_scale, w.o_proj, out);
    }
  }
  return false;
}

}  // namespace mlaserve

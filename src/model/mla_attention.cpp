#include "model/mla_attention.h"

namespace mlaserve {

// RMSNorm epsilon of q_a_layernorm and kv_a_layernorm: DeepSeek's reference
// code and transformers build them with the RMSNorm default, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

void mla_attention(Backend& backend, const MlaContext& ctx, const MlaWeights& w, const Tensor& h,
                   const DeviceBatch& batch, bool absorbed, Tensor cache, Tensor out) {
  const ModelConfig& c = *ctx.config;
  const int64_t T = h.dim(0), H = c.num_attention_heads, L = c.kv_lora_rank, R = c.qk_rope_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dv = c.v_head_dim;
  const DType act = backend.act_dtype();

  // q {T, H, Dn + R}, q_pe roped in place.
  Tensor q = backend.alloc({T, H * (Dn + R)}, act);
  if (w.q_proj) {
    backend.linear(h, *w.q_proj, q);
  } else {
    Tensor q_a = backend.alloc({T, int64_t(*c.q_lora_rank)}, act);
    backend.linear(h, *w.q_a_proj, q_a);
    Tensor q_a_normed = backend.alloc(q_a.shape(), act);
    backend.rms_norm(q_a, w.q_a_layernorm, kLatentNormEps, q_a_normed);
    backend.linear(q_a_normed, *w.q_b_proj, q);
  }
  q = q.view({T, H, Dn + R});
  backend.rope(q, int(Dn), batch.positions, ctx.inv_freq, ctx.cos_sin_scale);

  // This step's latent rows: [kv_a_layernorm(c_kv) | rope(k_pe)] {T, L + R}.
  Tensor compressed = backend.alloc({T, L + R}, act);
  backend.linear(h, w.kv_a_proj_with_mqa, compressed);
  Tensor c_kv = backend.alloc({T, L}, act);
  backend.copy_columns(compressed, 0, c_kv, 0, L);
  Tensor c_kv_normed = backend.alloc({T, L}, act);
  backend.rms_norm(c_kv, w.kv_a_layernorm, kLatentNormEps, c_kv_normed);
  Tensor latent = backend.alloc({T, L + R}, act);
  backend.copy_columns(c_kv_normed, 0, latent, 0, L);
  backend.copy_columns(compressed, L, latent, L, R);
  backend.rope(latent.view({T, 1, L + R}), int(L), batch.positions, ctx.inv_freq, ctx.cos_sin_scale);
  backend.scatter_rows(cache, latent, batch.out_slots);

  Tensor attn = backend.alloc({T, H, Dv}, act);
  if (absorbed) {
    // q_latent{T, H, L} = q_nope · W_UK; attention over the latent rows.
    Tensor q_latent = backend.alloc({T, H, L}, act);
    backend.head_bmm(q, w.w_uk, /*transpose_w=*/false, q_latent);
    Tensor q_cat = backend.alloc({T, H, L + R}, act);
    backend.copy_columns(q_latent, 0, q_cat, 0, L);
    backend.copy_columns(q, Dn, q_cat, L, R);
    Tensor o_latent = backend.alloc({T, H, L}, act);
    backend.mla_attention_absorbed(q_cat, cache, batch, ctx.softmax_scale, o_latent);
    backend.head_bmm(o_latent, w.w_uv, /*transpose_w=*/true, attn);
  } else {
    // Expand every kv token of the batch (cached prefix included).
    const int64_t Lk = batch.kv_slots.numel();
    Tensor rows = backend.alloc({Lk, L + R}, act);
    backend.gather_rows(cache, batch.kv_slots, rows);
    Tensor kv_c = backend.alloc({Lk, L}, act);
    backend.copy_columns(rows, 0, kv_c, 0, L);
    Tensor k_pe = backend.alloc({Lk, R}, act);
    backend.copy_columns(rows, L, k_pe, 0, R);
    Tensor kv = backend.alloc({Lk, H * (Dn + Dv)}, act);
    backend.linear(kv_c, w.kv_b_proj, kv);
    backend.mla_attention_expanded(q, kv.view({Lk, H, Dn + Dv}), k_pe, batch, ctx.softmax_scale, attn);
  }
  backend.linear(attn.view({T, H * Dv}), w.o_proj, out);
}

}  // namespace mlaserve

#include "model/deepseek_model.h"

#include <spdlog/spdlog.h>

#include "model/feed_forward.h"
#include "model/yarn_rope.h"

namespace mlaserve {

DeepseekModel::DeepseekModel(const Checkpoint& ckpt, Backend& backend, ModelOptions options)
    : config_(ckpt.config()), backend_(backend), options_(options) {
  ckpt.validate_against_config();
  // Fault the mapped shards in once, with progress (bytes, rate, time left),
  // so a multi-GB load is visible and the uploads below read from page cache.
  ckpt.prefetch();
  const ModelConfig& c = config_;
  const RopeTable rope = make_rope_table(c);
  Tensor inv_freq = Tensor::empty({int64_t(rope.inv_freq.size())}, DType::F32);
  std::copy(rope.inv_freq.begin(), rope.inv_freq.end(), inv_freq.data<float>());
  mla_.config = &config_;
  mla_.inv_freq = backend.load_tensor(inv_freq);
  mla_.cos_sin_scale = rope.cos_sin_scale;
  mla_.softmax_scale = attention_softmax_scale(c);

  const int64_t D = c.hidden_size;
  embed_tokens_ = load_param(ckpt, backend, "model.embed_tokens.weight", {c.vocab_size, D});
  for (int i = 0; i < c.num_hidden_layers; ++i) layers_.push_back(load_decoder_layer(ckpt, backend, i));
  final_norm_ = load_param(ckpt, backend, "model.norm.weight", {D});
  if (c.tie_word_embeddings) {
    lm_head_ = backend.load_weight(ckpt.get("model.embed_tokens.weight"), Tensor());
  } else {
    lm_head_ = load_linear(ckpt, backend, "lm_head");
  }
  if (options_.load_mtp && c.num_nextn_predict_layers > 0) mtp_ = load_mtp(ckpt, backend, c.num_hidden_layers);
  spdlog::debug("model loaded: {} layers{}, backend {}", c.num_hidden_layers, mtp_ ? " + MTP" : "", backend.name());
}

MlaBatchPlan DeepseekModel::plan_mla(const DeviceBatch& batch) {
  if (options_.mla_mode != MlaMode::Auto) return MlaBatchPlan::whole(options_.mla_mode == MlaMode::Absorbed);
  const ForwardBatch& b = batch.host;
  const int n = b.num_seqs(), k = absorbed_leading_seqs(b);
  if (k == n) return MlaBatchPlan::whole(true);
  if (k == 0 || b.kv_indptr[k] < options_.min_absorbed_split_rows) return MlaBatchPlan::whole(false);
  MlaBatchPlan plan;
  plan.split_token = b.q_indptr[k];
  plan.absorbed_part = backend_.prepare_batch(b.sequences(0, k));
  plan.expanded_part = backend_.prepare_batch(b.sequences(k, n));
  return plan;
}

void DeepseekModel::run_block(const DecoderLayerWeights& w, const DeviceBatch& batch, const MlaBatchPlan& plan,
                              Tensor cache, Tensor& x, Tensor& residual, bool first) {
  const float eps = float(config_.rms_norm_eps);
  const DType act = backend_.act_dtype();
  Tensor normed = backend_.alloc(x.shape(), act);
  // The input norm with the residual add, done by the attention op (inside
  // the one-token chain kernel on CUDA, which then waits on the MoE alone;
  // quantized for block-FP8 projections inside the norm). The first block
  // has no residual to add: its input starts the residual stream.
  const ResidualNorm input_norm{x, first ? Tensor() : residual, w.input_layernorm, eps};
  if (first) residual = x;
  Tensor attn_out = backend_.alloc(x.shape(), act);
  Tensor mlp_out = backend_.alloc(x.shape(), act);
  if (w.moe) {
    // The norm and the router may run inside the attention op (one kernel at
    // decode batch 1 on CUDA); normed is then the MoE's input, or the norm
    // is left pending for the MoE to complete.
    const MoeWeights& moe = *w.moe;
    const int64_t k = moe.routing.top_k;
    MlaChainMoeTail tail;
    tail.norm_weight = w.post_attention_layernorm;
    tail.eps = eps;
    tail.residual = residual;
    tail.normed = normed;
    tail.router = &moe.router;
    tail.router_fold = moe.chain_router_fold;
    PendingNorm pending;
    tail.pending = &pending;
    tail.logits = backend_.alloc({x.dim(0), moe.router.out_features()}, DType::F32);
    Tensor topk_ids = backend_.alloc({x.dim(0), k}, DType::I32);
    Tensor topk_weights = backend_.alloc({x.dim(0), k}, DType::F32);
    // Routed and shared experts in one call.
    if (mla_attention(backend_, mla_, w.attn, normed, batch, plan, cache, attn_out, &tail, &input_norm)) {
      backend_.moe_route_experts(normed, moe.experts, tail.logits, moe.score_correction_bias, moe.routing, topk_ids,
                                 topk_weights, mlp_out, pending.parts.defined() ? &pending : nullptr);
    } else {
      // The norm, the router's logits and the top-k (one launch at decode on CUDA).
      backend_.rms_norm_moe_select(ResidualNorm{attn_out, residual, w.post_attention_layernorm, eps}, normed,
                                   moe.router, moe.score_correction_bias, moe.routing, topk_ids, topk_weights);
      backend_.moe_experts(normed, moe.experts, topk_ids, topk_weights, mlp_out);
    }
  } else {
    mla_attention(backend_, mla_, w.attn, normed, batch, plan, cache, attn_out, nullptr, &input_norm);
    dense_mlp(backend_, *w.mlp, ResidualNorm{attn_out, residual, w.post_attention_layernorm, eps}, mlp_out);
  }
  x = mlp_out;
}

Tensor DeepseekModel::logits_for_rows(const DeviceBatch& batch, const Tensor& normed, const Weight& head) {
  const int64_t R = batch.num_logit_rows;
  Tensor rows = backend_.alloc({R, int64_t(config_.hidden_size)}, backend_.act_dtype());
  backend_.gather_rows(normed, batch.logit_rows, rows);
  Tensor logits = backend_.alloc({R, head.out_features()}, DType::F32);
  backend_.linear_f32_out(rows, head, logits);
  return logits;
}

Tensor DeepseekModel::forward(const ForwardBatch& batch, const std::vector<Tensor>& kv_cache, Tensor* final_hidden,
                              const Tensor& picked) {
  const ModelConfig& c = config_;
  MLA_CHECK(int(kv_cache.size()) == c.num_hidden_layers, "forward: {} kv-cache tensors for {} layers",
            kv_cache.size(), c.num_hidden_layers);
  const DeviceBatch db = backend_.prepare_batch(batch);
  if (c.architecture == Architecture::DeepseekV32) {
    // Without the DSA indexer, dense attention equals DSA only while every
    // sequence fits in index_topk tokens.
    MLA_CHECK(db.max_kv_len <= c.index_topk,
              "DeepSeek-V3.2 sparse attention (DSA) is not implemented: sequences are limited to index_topk = {} "
              "tokens, got {}",
              c.index_topk, db.max_kv_len);
  }
  const int64_t T = db.num_tokens, D = c.hidden_size;
  const MlaBatchPlan plan = plan_mla(db);
  Tensor x = backend_.alloc({T, D}, backend_.act_dtype());
  backend_.embedding(db.input_ids, embed_tokens_, x, picked);
  Tensor residual;
  for (size_t i = 0; i < layers_.size(); ++i) run_block(layers_[i], db, plan, kv_cache[i], x, residual, i == 0);
  Tensor normed = backend_.alloc({T, D}, backend_.act_dtype());
  backend_.rms_norm(x, final_norm_, float(c.rms_norm_eps), normed, residual);
  if (final_hidden) *final_hidden = normed;
  return logits_for_rows(db, normed, lm_head_);
}

Tensor DeepseekModel::mtp_forward(const ForwardBatch& batch, const Tensor& hidden, const Tensor& mtp_cache) {
  MLA_CHECK(mtp_.has_value(), "mtp_forward: the checkpoint has no MTP (NextN) layer, or it was not loaded");
  const DeviceBatch db = backend_.prepare_batch(batch);
  const int64_t T = db.num_tokens, D = config_.hidden_size;
  MLA_CHECK(hidden.shape() == Shape({T, D}), "mtp_forward: hidden {} for {} tokens of width {}",
            shape_str(hidden.shape()), T, D);
  const float eps = float(config_.rms_norm_eps);
  const DType act = backend_.act_dtype();
  Tensor embedded = backend_.alloc({T, D}, act), embedded_normed = backend_.alloc({T, D}, act);
  backend_.embedding(db.input_ids, mtp_->embed_tokens, embedded);
  backend_.rms_norm(embedded, mtp_->enorm, eps, embedded_normed);
  Tensor hidden_normed = backend_.alloc({T, D}, act);
  backend_.rms_norm(hidden, mtp_->hnorm, eps, hidden_normed);
  Tensor both = backend_.alloc({T, 2 * D}, act);  // [enorm(embed) | hnorm(hidden)]
  backend_.copy_columns(embedded_normed, 0, both, 0, D);
  backend_.copy_columns(hidden_normed, 0, both, D, D);
  Tensor x = backend_.alloc({T, D}, act);
  backend_.linear(both, mtp_->eh_proj, x);
  Tensor residual;
  run_block(mtp_->block, db, plan_mla(db), mtp_cache, x, residual, /*first=*/true);
  Tensor normed = backend_.alloc({T, D}, act);
  backend_.rms_norm(x, mtp_->shared_head_norm, eps, normed, residual);
  return logits_for_rows(db, normed, mtp_->shared_head);
}

}  // namespace mlaserve

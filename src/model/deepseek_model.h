#pragma once
// The DeepSeek-V2/V3 decoder, written once against the Backend ops:
// embeddings -> blocks (RMSNorm, MLA, RMSNorm, dense MLP or MoE) -> final
// norm -> lm_head, plus the MTP (NextN) block as a separate forward.
#include <memory>
#include <optional>
#include <vector>

#include "io/checkpoint.h"
#include "kernels/backend.h"
#include "kernels/forward_batch.h"
#include "model/layer_weights.h"
#include "model/mla_attention.h"

namespace mlaserve {

struct ModelOptions {
  // Auto: absorbed MLA for decode and short extensions of a cached prefix,
  // expanded for the rest (absorbed_leading_seqs; a batch may be split).
  MlaMode mla_mode = MlaMode::Auto;
  // Load the checkpoint's first NextN block (if it has one) for mtp_forward.
  bool load_mtp = true;
  // Auto splits a batch only when its absorbed part has at least this many
  // cached rows (kMinAbsorbedSplitRows; tests lower it to reach the split).
  int64_t min_absorbed_split_rows = kMinAbsorbedSplitRows;
};

class DeepseekModel {
 public:
  // Validates the checkpoint against its config and loads every weight onto
  // the backend (the CPU backend keeps views of the mmapped files).
  DeepseekModel(const Checkpoint& ckpt, Backend& backend, ModelOptions options = {});

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  bool has_mtp() const { return mtp_.has_value(); }

  // Logits F32 {logit_rows, vocab} on the backend's device. kv_cache holds
  // one {num_slots, kv_lora_rank + qk_rope_head_dim} tensor per decoder layer
  // (act_dtype); this step's latent rows are written at batch.out_slots. When
  // final_hidden is given it receives the final-normed hidden states {T, D}
  // of all new tokens (what the MTP block consumes). Input ids below zero
  // stand for ids an earlier step picked on the device: picked[-1 - id].
  Tensor forward(const ForwardBatch& batch, const std::vector<Tensor>& kv_cache, Tensor* final_hidden = nullptr,
                 const Tensor& picked = {});

  // The MTP block: batch.input_ids are the tokens *following* the positions
  // of `hidden` (main-model final hidden states {T, D}, one per new token),
  // positions and slots as for the main model; mtp_cache is the block's own
  // latent cache {num_slots, L + R}. Returns F32 logits {logit_rows, vocab}.
  Tensor mtp_forward(const ForwardBatch& batch, const Tensor& hidden, const Tensor& mtp_cache);

 private:
  // One decoder block: residual stream update in place, `x` is the previous
  // block's MLP output (or the embedding for the first block).
  void run_block(const DecoderLayerWeights& w, const DeviceBatch& batch, const MlaBatchPlan& plan, Tensor cache,
                 Tensor& x, Tensor& residual, bool first);
  // The MLA form(s) for this batch (options_.mla_mode; Auto may split it).
  MlaBatchPlan plan_mla(const DeviceBatch& batch);
  Tensor logits_for_rows(const DeviceBatch& batch, const Tensor& normed, const Weight& head);

  ModelConfig config_;
  Backend& backend_;
  ModelOptions options_;
  MlaContext mla_;
  Tensor embed_tokens_;
  std::vector<DecoderLayerWeights> layers_;
  Tensor final_norm_;
  Weight lm_head_;
  std::optional<MtpWeights> mtp_;
};

}  // namespace mlaserve

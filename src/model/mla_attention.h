#pragma once
// Multi-head latent attention of one block, in either form:
// - expanded (prefill): kv_b_proj expands every cached c_kv to per-head
//   k_nope and v, then ordinary attention with head dim Dn + R for q·k;
// - absorbed (decode): W_UK is folded into q and W_UV applied after
//   attention, which then reads the L + R wide latent cache rows directly.
// Both compute the same function; the absorbed form reads far less memory per
// decoded token, the expanded one does fewer FLOPs on long prompts.
#include <optional>

#include "io/model_config.h"
#include "kernels/backend.h"
#include "model/layer_weights.h"

namespace mlaserve {

// Auto: absorbed for decode and short extensions of cached prefixes
// (absorbed_leading_seqs), expanded otherwise, a batch split between them.
enum class MlaMode { Auto, Absorbed, Expanded };

// New tokens a sequence may add to its cached prefix for Auto to keep the
// absorbed form: past it the expanded form's kv_b_proj expansion of every
// cached row is cheaper than the absorbed form's 576 + 512 wide products per
// (query, row) pair.
constexpr int kMaxAbsorbedExtendTokens = 64;

// MlaMode::Auto's rule per sequence, SGLang's for DeepSeek MLA with a bound:
// the absorbed form for a sequence that extends a cached prefix by at most
// kMaxAbsorbedExtendTokens (a decode step, a prefix-cache hit, the last chunk
// of a chunked prefill); the expanded form for a prompt with no cached prefix
// and for a long extension. Returns how many leading sequences take the
// absorbed form (the scheduler puts decode rows first, prefill chunks after).
int absorbed_leading_seqs(const ForwardBatch& batch);
// Every sequence of the batch takes the absorbed form.
bool absorbed_form_pays_off(const ForwardBatch& batch);

// A batch is split between the forms only when the absorbed part's cached
// rows would cost the expanded form more than the split's extra launches:
// V3 expands a row with 33.5 MFLOP of kv_b_proj, so 1024 rows are ~50 us a
// layer on an H100.
constexpr int64_t kMinAbsorbedSplitRows = 1024;

// How a block's attention runs over a batch: one form for all of it, or the
// absorbed form for its first split_token tokens (whole sequences, with their
// own device metadata, absorbed_part) and the expanded form for the rest
// (expanded_part).
struct MlaBatchPlan {
  bool absorbed = false;
  int64_t split_token = 0;  // > 0: split
  DeviceBatch absorbed_part, expanded_part;
  static MlaBatchPlan whole(bool absorbed_form) {
    MlaBatchPlan p;
    p.absorbed = absorbed_form;
    return p;
  }
};

struct MlaContext {
  const ModelConfig* config = nullptr;
  Tensor inv_freq;            // F32 {R / 2} on the backend
  float cos_sin_scale = 1.0f;
  float softmax_scale = 1.0f;
};

// The one-op description of this block's absorbed MLA over h{T, D} for
// Backend::mla_decode_chain, where the weights have that form (q_proj and
// kv_a_proj_with_mqa stacked, no q_lora); nothing otherwise.
std::optional<MlaDecodeChain> decode_chain(const MlaContext& ctx, const MlaWeights& w, const Tensor& h, Tensor cache);

// out{T, D} = o_proj(attention(h{T, D})). Writes this batch's latent rows
// [c_kv | k_pe] to cache{S, L + R} at batch.out_slots first, then attends
// over each sequence's kv_slots. With moe_tail, returns whether the backend
// also did the tail (Backend::mla_decode_chain); the caller does it if not.
// With norm_head, h is first formed from it (the input norm, done here when
// the backend's chain does not take it).
bool mla_attention(Backend& backend, const MlaContext& ctx, const MlaWeights& w, const Tensor& h,
                   const DeviceBatch& batch, const MlaBatchPlan& plan, Tensor cache, Tensor out,
                   const MlaChainMoeTail* moe_tail = nullptr, const ResidualNorm* norm_head = nullptr);

}  // namespace mlaserve

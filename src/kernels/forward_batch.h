#pragma once
// What one forward step computes, as the runtime describes it to the model:
// a ragged batch of sequences, each contributing q_len new tokens and
// attending to kv_len cached tokens (its prefix plus the new ones).
//
// Latent-cache rows are addressed by slot: a slot is one token's row in the
// paged KV pool (page p, offset o -> slot p * page_size + o), so the same
// metadata serves a page size of 1 or 64. Ragged arrays follow FlashInfer's
// indptr convention.
#include <cstdint>
#include <vector>

namespace mlaserve {

struct ForwardBatch {
  // [T] one entry per new token, sequences concatenated in order.
  std::vector<int32_t> input_ids;
  std::vector<int32_t> positions;  // absolute position of each new token
  std::vector<int32_t> out_slots;  // cache slot each new token's latent is written to

  // [B+1] sequence b's new tokens are rows q_indptr[b] .. q_indptr[b+1].
  std::vector<int32_t> q_indptr;
  // [B+1] sequence b's kv slots are kv_slots[kv_indptr[b] .. kv_indptr[b+1]],
  // in position order, the last q_len of them being this step's new tokens
  // (so new token i of sequence b sits at position kv_len - q_len + i and
  // attends causally to slots 0 .. kv_len - q_len + i).
  std::vector<int32_t> kv_indptr;
  std::vector<int32_t> kv_slots;

  // Rows of the new tokens whose logits are wanted (usually each sequence's
  // last token; all rows for speculative verification or golden tests).
  std::vector<int32_t> logit_rows;

  int num_seqs() const { return int(q_indptr.size()) - 1; }
  int num_tokens() const { return int(input_ids.size()); }
  // True when every sequence adds exactly one token (a decode step).
  bool is_decode() const {
    for (int b = 0; b < num_seqs(); ++b)
      if (q_indptr[b + 1] - q_indptr[b] != 1) return false;
    return true;
  }

  // Sequences [s0, s1) as a batch of their own: their tokens, slots and
  // logit rows, indptrs and rows rebased.
  ForwardBatch sequences(int s0, int s1) const {
    ForwardBatch b;
    const int t0 = q_indptr[s0], t1 = q_indptr[s1], k0 = kv_indptr[s0], k1 = kv_indptr[s1];
    b.input_ids.assign(input_ids.begin() + t0, input_ids.begin() + t1);
    b.positions.assign(positions.begin() + t0, positions.begin() + t1);
    b.out_slots.assign(out_slots.begin() + t0, out_slots.begin() + t1);
    b.kv_slots.assign(kv_slots.begin() + k0, kv_slots.begin() + k1);
    for (int s = s0; s <= s1; ++s) {
      b.q_indptr.push_back(q_indptr[s] - t0);
      b.kv_indptr.push_back(kv_indptr[s] - k0);
    }
    for (int32_t r : logit_rows)
      if (r >= t0 && r < t1) b.logit_rows.push_back(r - t0);
    return b;
  }
};

}  // namespace mlaserve

#include "runtime/static_batch.h"

#include "core/error.h"

namespace mlaserve::runtime {

ForwardBatch static_prefill_batch(const std::vector<std::vector<int32_t>>& prompts, int slots_per_seq) {
  ForwardBatch b;
  b.q_indptr = {0};
  b.kv_indptr = {0};
  for (size_t s = 0; s < prompts.size(); ++s) {
    const int n = int(prompts[s].size());
    MLA_CHECK(n >= 1 && n <= slots_per_seq, "sequence {} has {} tokens for {} slots", s, n, slots_per_seq);
    const int32_t base = int32_t(s) * slots_per_seq;
    for (int i = 0; i < n; ++i) {
      b.input_ids.push_back(prompts[s][size_t(i)]);
      b.positions.push_back(i);
      b.out_slots.push_back(base + i);
      b.kv_slots.push_back(base + i);
    }
    b.q_indptr.push_back(int32_t(b.input_ids.size()));
    b.kv_indptr.push_back(int32_t(b.kv_slots.size()));
    b.logit_rows.push_back(int32_t(b.input_ids.size()) - 1);
  }
  return b;
}

ForwardBatch static_decode_batch(const std::vector<int32_t>& tokens, const std::vector<int32_t>& lens,
                                 int slots_per_seq) {
  MLA_CHECK(tokens.size() == lens.size(), "{} tokens for {} sequences", tokens.size(), lens.size());
  ForwardBatch b;
  b.q_indptr = {0};
  b.kv_indptr = {0};
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int32_t pos = lens[s];
    MLA_CHECK(pos < slots_per_seq, "sequence {} is full ({} slots)", s, slots_per_seq);
    const int32_t base = int32_t(s) * slots_per_seq;
    b.input_ids.push_back(tokens[s]);
    b.positions.push_back(pos);
    b.out_slots.push_back(base + pos);
    for (int32_t i = 0; i <= pos; ++i) b.kv_slots.push_back(base + i);
    b.q_indptr.push_back(int32_t(s) + 1);
    b.kv_indptr.push_back(int32_t(b.kv_slots.size()));
    b.logit_rows.push_back(int32_t(s));
  }
  return b;
}

}  // namespace mlaserve::runtime

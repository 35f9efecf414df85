#pragma once
// A deterministic stand-in for the model in scheduler and engine tests. It
// keeps a "KV cache" of the token written to each slot and derives the next
// token from the tokens it reads back through the batch's kv slots, so any
// paging, prefix-reuse or retraction bug that makes a sequence read a wrong
// row changes its output. The expected output is computed independently by
// hashing the plain token sequence.
#include <cstdint>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_sampling.h"
#include "runtime/model_runner.h"
#include "runtime/text_stream.h"

namespace mlaserve::runtime::testing {

inline int32_t next_token_of(const std::vector<int32_t>& context, int vocab) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ uint64_t(t)) * 1099511628211ull;
  return int32_t(h % uint64_t(vocab));
}

// Greedy continuation the fake model must produce for `prompt`.
inline std::vector<int32_t> expected_continuation(std::vector<int32_t> prompt, int n, int vocab) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t t = next_token_of(prompt, vocab);
    out.push_back(t);
    prompt.push_back(t);
  }
  return out;
}

class FakeModel : public ModelRunner {
 public:
  FakeModel(int num_slots, int vocab) : cache_(size_t(num_slots), -1), vocab_(vocab) {}
  int vocab_size() const override { return vocab_; }

  // One-hot logits rows at the next token of each row's context.
  Tensor forward(const ForwardBatch& b) override {
    ++logits_steps;
    std::vector<int32_t> next = run(b);
    Tensor logits = Tensor::zeros({int64_t(next.size()), vocab_}, DType::F32);
    for (size_t r = 0; r < next.size(); ++r) logits.data<float>()[r * size_t(vocab_) + size_t(next[r])] = 10.0f;
    return logits;
  }

  // The same tokens as ids (rows null, as a device-side argmax returns
  // them) or forward()'s rows drawn with the CPU reference of
  // Backend::sample_rows. Placeholder ids are resolved from the previous
  // started step's picks, as the device does; the results wait for
  // finish_step.
  void start_step(const ForwardBatch& b, const std::vector<RowSampling>* rows) override {
    if (started_.size() >= 2) throw std::runtime_error("fake model: two steps are started already");
    if (!started_.empty()) ++overlapped_starts;
    ForwardBatch resolved = b;
    for (int32_t& id : resolved.input_ids) {
      if (id >= 0) continue;
      ++placeholder_ids;
      id = picked_.at(size_t(-1 - id));
    }
    std::vector<int32_t> ids;
    if (!rows) {
      ++greedy_steps;
      ids = run(resolved);
    } else {
      ++sampled_steps;
      if (rows->size() != b.logit_rows.size()) throw std::runtime_error("fake model: sampling rows != logits rows");
      Tensor logits = forward(resolved);
      --logits_steps;
      for (size_t r = 0; r < rows->size(); ++r)
        ids.push_back(cpu::sample_row(logits.data<float>() + r * size_t(vocab_), vocab_, (*rows)[r]));
    }
    picked_ = ids;
    started_.push_back(std::move(ids));
  }
  std::vector<int32_t> finish_step() override {
    if (started_.empty()) throw std::runtime_error("fake model: no step is started");
    std::vector<int32_t> ids = std::move(started_.front());
    started_.pop_front();
    return ids;
  }

  int steps = 0;
  int logits_steps = 0;
  int greedy_steps = 0;
  int sampled_steps = 0;
  int placeholder_ids = 0;    // input ids resolved from the previous step's picks
  int overlapped_starts = 0;  // steps started while another was started
  int max_batch_tokens = 0;
  int max_batch_seqs = 0;

 private:
  // Writes the batch's tokens into the cache and returns each logits row's
  // next token, derived from the context read back through the kv slots.
  std::vector<int32_t> run(const ForwardBatch& b) {
    ++steps;
    max_batch_tokens = std::max(max_batch_tokens, b.num_tokens());
    max_batch_seqs = std::max(max_batch_seqs, b.num_seqs());
    for (int t = 0; t < b.num_tokens(); ++t) cache_.at(size_t(b.out_slots[size_t(t)])) = b.input_ids[size_t(t)];
    std::vector<int32_t> next;
    for (int row : b.logit_rows) {
      int s = 0;
      while (b.q_indptr[size_t(s) + 1] <= row) ++s;
      int q_len = b.q_indptr[size_t(s) + 1] - b.q_indptr[size_t(s)];
      int kv_len = b.kv_indptr[size_t(s) + 1] - b.kv_indptr[size_t(s)];
      int visible = kv_len - q_len + (row - b.q_indptr[size_t(s)]) + 1;
      std::vector<int32_t> context;
      for (int i = 0; i < visible; ++i) {
        int32_t tok = cache_.at(size_t(b.kv_slots[size_t(b.kv_indptr[size_t(s)] + i)]));
        if (tok < 0) throw std::runtime_error("fake model read an unwritten cache slot");
        context.push_back(tok);
      }
      next.push_back(next_token_of(context, vocab_));
    }
    return next;
  }

  std::vector<int32_t> cache_;
  int vocab_;
  std::vector<int32_t> picked_;
  std::deque<std::vector<int32_t>> started_;
};

// Token id -> a fixed two-letter string, so stop strings can straddle tokens.
class LetterStream : public TextStream {
 public:
  static std::string text_of(int32_t id) {
    return {char('a' + id % 26), char('a' + (id / 26) % 26)};
  }
  std::string push(int32_t id) override { return text_of(id); }
  std::string flush() override { return {}; }
};

}  // namespace mlaserve::runtime::testing

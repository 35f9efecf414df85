#include "runtime/deepseek_runner.h"

#include "core/error.h"
#include "model/kv_cache.h"

namespace mlaserve::runtime {

DeepseekModelRunner::DeepseekModelRunner(DeepseekModel& model, int num_slots, const CudaGraphSettings& graphs,
                                         KvCacheDtype kv_cache_dtype)
    : model_(model) {
  const bool want_graphs = graphs.enabled && !graphs.batch_sizes.empty();
  // One extra row past the scheduler's slots: the padding sequences of a
  // replayed graph write and read there, never touching a real request.
  kv_cache_ = allocate_kv_cache(model.backend(), model.config(), num_slots + (want_graphs ? 1 : 0), kv_cache_dtype);
  if (want_graphs) {
    DecodeGraphOptions opt;
    opt.batch_sizes = graphs.batch_sizes;
    opt.max_kv_len = graphs.max_kv_len;
    opt.scratch_slot = num_slots;
    graphs_ = make_decode_graph_runner(model.backend(), opt,
                                       [this](const ForwardBatch& b) { return model_.forward(b, kv_cache_); });
  }
}

std::vector<int> DeepseekModelRunner::graph_batch_sizes() const {
  return graphs_ ? graphs_->captured_batch_sizes() : std::vector<int>{};
}

Tensor DeepseekModelRunner::device_logits(const ForwardBatch& batch) {
  if (batch.logit_rows.empty()) {
    // A step of prefill chunks only: nothing to sample, just fill the cache.
    // The model still wants a logits row, so compute the cheapest one.
    ForwardBatch b = batch;
    b.logit_rows = {0};
    model_.forward(b, kv_cache_);
    model_.backend().synchronize();
    return {};
  }
  if (graphs_ && graphs_->can_replay(batch)) return graphs_->replay(batch);
  return model_.forward(batch, kv_cache_);
}

Tensor DeepseekModelRunner::forward(const ForwardBatch& batch) {
  Tensor logits = device_logits(batch);
  if (!logits.defined()) return Tensor::empty({0, vocab_size()}, DType::F32);
  return model_.backend().to_host(logits);
}

std::vector<int32_t> DeepseekModelRunner::forward_greedy(const ForwardBatch& batch) {
  return device_ids(batch, nullptr);
}

std::vector<int32_t> DeepseekModelRunner::forward_sampled(const ForwardBatch& batch,
                                                          const std::vector<RowSampling>& rows) {
  MLA_CHECK(rows.size() == batch.logit_rows.size(), "forward_sampled: {} sampling rows for {} logits rows",
            rows.size(), batch.logit_rows.size());
  return device_ids(batch, &rows);
}

std::vector<int32_t> DeepseekModelRunner::device_ids(const ForwardBatch& batch, const std::vector<RowSampling>* rows) {
  Tensor logits = device_logits(batch);
  if (!logits.defined()) return {};
  Backend& backend = model_.backend();
  const int64_t n = logits.dim(0);
  Tensor ids = backend.alloc({n}, DType::I32);
  if (rows) {
    backend.sample_rows(logits, *rows, ids);
  } else {
    backend.argmax_rows(logits, ids);
  }
  Tensor host = backend.to_host(ids);
  return std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + n);
}

std::vector<int> default_cuda_graph_batch_sizes(int max_bs) {
  std::vector<int> sizes;
  for (int bs : {1, 2, 4})
    if (bs <= max_bs) sizes.push_back(bs);
  for (int bs = 8; bs <= max_bs; bs += 8) sizes.push_back(bs);
  if (max_bs >= 1 && sizes.back() != max_bs) sizes.push_back(max_bs);
  return sizes;
}

}  // namespace mlaserve::runtime

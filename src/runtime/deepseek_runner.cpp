#include "runtime/deepseek_runner.h"

#include "core/error.h"
#include "model/kv_cache.h"

namespace mlaserve::runtime {

DeepseekModelRunner::DeepseekModelRunner(DeepseekModel& model, int num_slots, const CudaGraphSettings& graphs,
                                         KvCacheDtype kv_cache_dtype)
    : model_(model) {
  picked_ = model.backend().alloc({kMaxPickedRows}, DType::I32);
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
                                       [this](const ForwardBatch& b) {
                                         return model_.forward(b, kv_cache_, nullptr, picked_);
                                       });
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
    model_.forward(b, kv_cache_, nullptr, picked_);
    return {};
  }
  if (graphs_ && graphs_->can_replay(batch)) return graphs_->replay(batch);
  return model_.forward(batch, kv_cache_, nullptr, picked_);
}

Tensor DeepseekModelRunner::forward(const ForwardBatch& batch) {
  MLA_CHECK(started_.empty(), "forward: {} started steps are not finished", started_.size());
  check_placeholders(batch);
  picked_rows_ = 0;  // the picks this step's successor could name are not on the device
  Tensor logits = device_logits(batch);
  if (!logits.defined()) {
    model_.backend().synchronize();
    return Tensor::empty({0, vocab_size()}, DType::F32);
  }
  return model_.backend().to_host(logits);
}

void DeepseekModelRunner::check_placeholders(const ForwardBatch& batch) const {
  for (int32_t id : batch.input_ids)
    MLA_CHECK(id >= 0 || -1 - int64_t(id) < picked_rows_,
              "input id {} names no row of the previous step's picks ({} rows)", id, picked_rows_);
}

void DeepseekModelRunner::start_step(const ForwardBatch& batch, const std::vector<RowSampling>* rows) {
  MLA_CHECK(started_.size() < 2, "start_step: two steps are started already");
  MLA_CHECK(!rows || rows->size() == batch.logit_rows.size(), "start_step: {} sampling rows for {} logits rows",
            rows ? rows->size() : 0, batch.logit_rows.size());
  MLA_CHECK(int64_t(batch.logit_rows.size()) <= kMaxPickedRows, "start_step: {} logits rows (at most {})",
            batch.logit_rows.size(), kMaxPickedRows);
  check_placeholders(batch);
  Tensor logits = device_logits(batch);
  if (!logits.defined()) {
    picked_rows_ = 0;
    // Finished when the device is: a failure is this step's.
    started_.push_back([&backend = model_.backend()] {
      backend.synchronize();
      return std::vector<int32_t>{};
    });
    return;
  }
  Backend& backend = model_.backend();
  const int64_t n = logits.dim(0);
  Tensor ids = picked_.slice_rows(0, n);
  if (rows) backend.sample_rows(logits, *rows, ids);
  else backend.argmax_rows(logits, ids);
  auto host = backend.to_host_later(ids);
  picked_rows_ = int(n);
  started_.push_back([host] {
    const Tensor h = host();
    return std::vector<int32_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
  });
}

std::vector<int32_t> DeepseekModelRunner::finish_step() {
  MLA_CHECK(!started_.empty(), "finish_step: no step is started");
  auto result = std::move(started_.front());
  started_.pop_front();
  return result();
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

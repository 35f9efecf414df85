#include "runtime/deepseek_runner.h"

#include "model/kv_cache.h"

namespace mlaserve::runtime {

DeepseekModelRunner::DeepseekModelRunner(DeepseekModel& model, int num_slots)
    : model_(model), kv_cache_(allocate_kv_cache(model.backend(), model.config(), num_slots)) {}

Tensor DeepseekModelRunner::forward(const ForwardBatch& batch) {
  Backend& backend = model_.backend();
  if (batch.logit_rows.empty()) {
    // A step of prefill chunks only: nothing to sample, just fill the cache.
    // The model still wants a logits row, so compute the cheapest one.
    ForwardBatch b = batch;
    b.logit_rows = {0};
    model_.forward(b, kv_cache_);
    backend.synchronize();
    return Tensor::empty({0, vocab_size()}, DType::F32);
  }
  return backend.to_host(model_.forward(batch, kv_cache_));
}

}  // namespace mlaserve::runtime

#pragma once
// What the scheduler needs from a model: run one ragged batch against the
// paged latent cache and return the wanted logits rows (or, for greedy
// steps, just their argmax ids) on the host. The
// runner owns the cache tensors ({num_pages * page_size, width} per layer);
// the scheduler only hands out slots.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/forward_batch.h"

namespace mlaserve::runtime {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int vocab_size() const = 0;
  // Host F32 logits {batch.logit_rows.size(), vocab_size()}.
  virtual Tensor forward(const ForwardBatch& batch) = 0;
  // The argmax of each logits row (lowest id on ties), for steps whose rows
  // are all plainly greedy: the device reduces the rows, so only the ids
  // cross to the host. One id per batch.logit_rows entry, in order.
  virtual std::vector<int32_t> forward_greedy(const ForwardBatch& batch) = 0;
  // One token per logits row drawn on the device (Backend::sample_rows with
  // rows[i] for batch.logit_rows[i]): only the ids cross to the host.
  virtual std::vector<int32_t> forward_sampled(const ForwardBatch& batch, const std::vector<RowSampling>& rows) = 0;
};

}  // namespace mlaserve::runtime

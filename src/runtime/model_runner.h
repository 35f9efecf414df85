#pragma once
// What the scheduler needs from a model: run one ragged batch against the
// paged latent cache and return the wanted logits rows on the host. The
// runner owns the cache tensors ({num_pages * page_size, width} per layer);
// the scheduler only hands out slots.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/forward_batch.h"

namespace mlaserve::runtime {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int vocab_size() const = 0;
  // Host F32 logits {batch.logit_rows.size(), vocab_size()}.
  virtual Tensor forward(const ForwardBatch& batch) = 0;
};

}  // namespace mlaserve::runtime

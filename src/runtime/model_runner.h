#pragma once
// What the scheduler needs from a model: run one ragged batch against the
// paged latent cache and return the wanted logits rows, or the ids the device
// picks from them, on the host. The runner owns the cache tensors
// ({num_pages * page_size, width} per layer); the scheduler only hands out
// slots.
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
  // Host F32 logits {batch.logit_rows.size(), vocab_size()}. No step may be
  // started (start_step) and not finished.
  virtual Tensor forward(const ForwardBatch& batch) = 0;
  // A step whose tokens the device picks: each logits row's argmax (lowest
  // id on ties) when rows is null, else one draw per row
  // (Backend::sample_rows, rows[i] for batch.logit_rows[i]); only the ids
  // cross to the host. start_step queues the step and returns; finish_step
  // waits for the oldest started step and returns its ids, one per logits
  // row. A step may start before the one before it finishes (at most two
  // started): its input ids below zero are that step's picks, -1 - r
  // standing for its logits row r, resolved on the device, so the host never
  // waits between steps. A runner that computes synchronously may do the
  // work in start_step.
  virtual void start_step(const ForwardBatch& batch, const std::vector<RowSampling>* rows) = 0;
  virtual std::vector<int32_t> finish_step() = 0;

  // One device-picked step, started and finished (callers that do not overlap).
  std::vector<int32_t> forward_greedy(const ForwardBatch& batch) {
    start_step(batch, nullptr);
    return finish_step();
  }
  std::vector<int32_t> forward_sampled(const ForwardBatch& batch, const std::vector<RowSampling>& rows) {
    start_step(batch, &rows);
    return finish_step();
  }
};

}  // namespace mlaserve::runtime

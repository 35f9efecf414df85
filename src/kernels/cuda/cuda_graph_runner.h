#pragma once
// CUDA-graph replay of decode steps (--cuda-graph-bs): each listed batch
// size is captured once; a decode batch is padded up to the next captured
// size and replayed with only its input arrays uploaded. Prefill runs eagerly.
//
// Plain C++ (no CUDA types), so the runtime can hold one whatever the build;
// without CUDA, or on another backend, the factory returns null.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/forward_batch.h"

namespace mlaserve {

struct DecodeGraphOptions {
  std::vector<int> batch_sizes;  // e.g. 1, 2, 4, 8, 16, 32, 64
  int max_kv_len = 4096;         // longest context (kv_len) a replayed sequence may have
  // A cache slot the runtime never hands out: padding sequences write their
  // latent rows there and attend only to it.
  int32_t scratch_slot = 0;
};

// Runs one forward step of the model on the backend; returns the device
// logits {logit_rows, vocab}. Must allocate only through the backend.
using DecodeStepFn = std::function<Tensor(const ForwardBatch&)>;

class DecodeGraphRunner {
 public:
  virtual ~DecodeGraphRunner() = default;
  // A decode step (one new token per sequence, logits for each in order)
  // whose batch and contexts fit a captured graph.
  virtual bool can_replay(const ForwardBatch& b) const = 0;
  // Device F32 logits {b.num_seqs(), vocab}, valid until the next replay.
  virtual Tensor replay(const ForwardBatch& b) = 0;
  virtual const std::vector<int>& captured_batch_sizes() const = 0;
};

// Captures all batch sizes now (a warm-up run, then the capture, per size).
std::unique_ptr<DecodeGraphRunner> make_decode_graph_runner(Backend& backend, const DecodeGraphOptions& options,
                                                            DecodeStepFn step);

}  // namespace mlaserve

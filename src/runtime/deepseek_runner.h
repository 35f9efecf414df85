#pragma once
// The real model behind the runtime: DeepseekModel over a paged latent cache
// of num_pages * page_size slots per layer, allocated once at start-up.
// On CUDA, decode steps replay captured graphs (--cuda-graph-bs); prefill
// and mixed steps run eagerly.
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/cuda/cuda_graph_runner.h"
#include "model/deepseek_model.h"
#include "model/kv_cache.h"
#include "runtime/model_runner.h"

namespace mlaserve::runtime {

struct CudaGraphSettings {
  bool enabled = true;
  std::vector<int> batch_sizes;  // captured decode batch sizes
  int max_kv_len = 4096;         // longest context a replayed sequence may have
};

class DeepseekModelRunner : public ModelRunner {
 public:
  DeepseekModelRunner(DeepseekModel& model, int num_slots, const CudaGraphSettings& graphs = {false, {}, 0},
                      KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto);
  int vocab_size() const override { return model_.config().vocab_size; }
  Tensor forward(const ForwardBatch& batch) override;
  void start_step(const ForwardBatch& batch, const std::vector<RowSampling>* rows) override;
  std::vector<int32_t> finish_step() override;
  // Batch sizes with a captured decode graph (empty: eager only).
  std::vector<int> graph_batch_sizes() const;

 private:
  // The step's logits {logit rows, vocab} on the device (a replayed graph's
  // or an eager forward's); undefined for a step without logits rows.
  Tensor device_logits(const ForwardBatch& batch);
  // Placeholder input ids must name rows of the last started step's picks.
  void check_placeholders(const ForwardBatch& batch) const;
  static constexpr int64_t kMaxPickedRows = 1 << 16;

  DeepseekModel& model_;
  std::vector<Tensor> kv_cache_;
  // The last started step's picks on the device, where the next step's
  // placeholder input ids are resolved (a fixed buffer: graphs read it).
  Tensor picked_;
  int picked_rows_ = 0;
  std::deque<std::function<std::vector<int32_t>()>> started_;  // results of started steps, oldest first
  std::unique_ptr<DecodeGraphRunner> graphs_;
};

// SGLang's default capture list up to max_bs: 1, 2, 4, 8, then every 8.
std::vector<int> default_cuda_graph_batch_sizes(int max_bs);

}  // namespace mlaserve::runtime

#pragma once
// The real model behind the runtime: DeepseekModel over a paged latent cache
// of num_pages * page_size slots per layer, allocated once at start-up.
#include <vector>

#include "model/deepseek_model.h"
#include "runtime/model_runner.h"

namespace mlaserve::runtime {

class DeepseekModelRunner : public ModelRunner {
 public:
  DeepseekModelRunner(DeepseekModel& model, int num_slots);
  int vocab_size() const override { return model_.config().vocab_size; }
  Tensor forward(const ForwardBatch& batch) override;

 private:
  DeepseekModel& model_;
  std::vector<Tensor> kv_cache_;
};

}  // namespace mlaserve::runtime

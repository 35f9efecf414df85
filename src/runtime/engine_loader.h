#pragma once
// Everything `serve`, `bench-one-batch` and `generate` need to stand up an
// Engine on a checkpoint: backend choice, weights, tokenizer, KV pool sizing,
// with SGLang's flag names.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "kernels/backend.h"
#include "model/deepseek_model.h"
#include "runtime/engine.h"
#include "runtime/kv_capacity.h"
#include "tokenizer/tokenizer.h"

namespace mlaserve::runtime {

struct EngineArgs {
  std::string model_path = "models/tiny";
  std::string device = "auto";  // cpu | cuda | auto
  MlaMode mla_mode = MlaMode::Auto;
  std::optional<double> mem_fraction_static;
  std::optional<int64_t> max_total_tokens;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;  // --kv-cache-dtype
  int max_running_requests = 256;
  int chunked_prefill_size = 8192;
  std::optional<int> context_length;
  int page_size = 1;
  std::string schedule_policy = "fcfs";
  bool disable_radix_cache = false;
  int max_queued_requests = 4096;
  bool disable_overlap_schedule = false;  // EngineConfig::overlap_decode off
  // CUDA graphs for decode steps (SGLang's flags); ignored on CPU.
  bool disable_cuda_graph = false;
  int cuda_graph_max_bs = 64;
  std::vector<int> cuda_graph_bs;  // empty: 1, 2, 4, 8, 16, ... up to cuda_graph_max_bs
};

class LoadedEngine {
 public:
  explicit LoadedEngine(const EngineArgs& args);
  ~LoadedEngine();

  Engine& engine() { return *engine_; }
  const ModelConfig& config() const { return model_->config(); }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const Backend& backend() const { return *backend_; }
  const KvCapacity& kv() const { return kv_; }
  const std::string& model_path() const { return model_path_; }
  int32_t eos_id() const { return eos_id_; }
  const std::vector<int>& cuda_graph_batch_sizes() const { return graph_batch_sizes_; }

 private:
  std::string model_path_;
  Checkpoint checkpoint_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeepseekModel> model_;
  std::optional<tokenizer::Tokenizer> tokenizer_;
  KvCapacity kv_;
  int32_t eos_id_ = -1;
  std::vector<int> graph_batch_sizes_;
  std::unique_ptr<Engine> engine_;
};

// --device: cpu, cuda (fails clearly without a GPU) or auto (CUDA when present).
std::unique_ptr<Backend> choose_backend(const std::string& device);

}  // namespace mlaserve::runtime

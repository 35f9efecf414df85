#include "runtime/engine_loader.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "runtime/deepseek_runner.h"
#include "runtime/detokenizer_stream.h"

namespace mlaserve::runtime {

std::unique_ptr<Backend> choose_backend(const std::string& device) {
  MLA_CHECK(device == "cpu" || device == "cuda" || device == "auto", "--device must be cpu, cuda or auto, got '{}'",
            device);
  if (device == "cpu") return make_cpu_backend();
  std::unique_ptr<Backend> cuda = make_cuda_backend(size_t(1) << 30);
  if (cuda) return cuda;
  MLA_CHECK(device != "cuda", "--device cuda: no CUDA backend (built without CUDA, or no GPU present)");
  return make_cpu_backend();
}

LoadedEngine::LoadedEngine(const EngineArgs& a)
    : model_path_(a.model_path), checkpoint_(Checkpoint::open(a.model_path)) {
  backend_ = choose_backend(a.device);
  ModelOptions mo;
  mo.load_mtp = false;
  mo.mla_mode = a.mla_mode;
  model_ = std::make_unique<DeepseekModel>(checkpoint_, *backend_, mo);
  tokenizer_ = tokenizer::Tokenizer::load(a.model_path);
  const ModelConfig& c = model_->config();
  eos_id_ = tokenizer_->eos_id() >= 0 ? tokenizer_->eos_id() : c.eos_token_id.value_or(-1);

  KvCapacityRequest kr;
  kr.max_total_tokens = a.max_total_tokens;
  if (a.mem_fraction_static) kr.mem_fraction_static = *a.mem_fraction_static;
  kr.page_size = a.page_size;
  kr.device = backend_->device();
  kr.act_dtype = backend_->act_dtype();
  kr.kv_cache_dtype = a.kv_cache_dtype;
  kr.weight_bytes = checkpoint_.total_bytes();
  kv_ = plan_kv_capacity(c, kr);

  EngineConfig ec;
  SchedulerConfig& s = ec.scheduler;
  s.page_size = a.page_size;
  s.num_pages = kv_.num_pages;
  s.max_running_requests = a.max_running_requests;
  s.chunked_prefill_size = a.chunked_prefill_size;
  s.context_length = a.context_length.value_or(c.max_position_embeddings);
  MLA_CHECK(s.context_length >= 2, "--context-length must be >= 2, got {}", s.context_length);
  if (s.context_length > c.max_position_embeddings)
    spdlog::warn("--context-length {} exceeds the model's max_position_embeddings {}", s.context_length,
                 c.max_position_embeddings);
  s.policy = parse_schedule_policy(a.schedule_policy);
  s.enable_radix_cache = !a.disable_radix_cache;
  if (eos_id_ >= 0) s.eos_token_ids = {eos_id_};
  ec.max_queued_requests = a.max_queued_requests;
  ec.overlap_decode = !a.disable_overlap_schedule;
  CudaGraphSettings graphs;
  graphs.enabled = !a.disable_cuda_graph && backend_->device() == Device::CUDA;
  graphs.batch_sizes = a.cuda_graph_bs.empty() ? default_cuda_graph_batch_sizes(
                                                     std::min(a.cuda_graph_max_bs, a.max_running_requests))
                                               : a.cuda_graph_bs;
  graphs.max_kv_len = int(std::min<int64_t>(s.context_length, kv_.tokens));
  auto runner = std::make_unique<DeepseekModelRunner>(*model_, int(kv_.tokens), graphs, a.kv_cache_dtype);
  graph_batch_sizes_ = runner->graph_batch_sizes();
  if (!graph_batch_sizes_.empty())
    spdlog::info("CUDA graphs captured for decode batch sizes {}", fmt::join(graph_batch_sizes_, ","));
  engine_ = std::make_unique<Engine>(std::move(runner), ec, detokenizer_streams(*tokenizer_));
}

LoadedEngine::~LoadedEngine() = default;

}  // namespace mlaserve::runtime

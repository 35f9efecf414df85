// mlaserve bench-one-batch: prefill and decode latency and throughput of one
// static batch (sglang.bench_one_batch), plus the memory traffic a decode
// step implies, so the number can be read against the bandwidth limit.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>

#include "cli/command.h"
#include "io/checkpoint.h"
#include "model/deepseek_model.h"
#include "runtime/deepseek_runner.h"
#include "runtime/engine_loader.h"
#include "runtime/kv_capacity.h"
#include "runtime/sampler.h"
#include "runtime/static_batch.h"

namespace mlaserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOneBatchOptions {
  std::string model_path = "models/tiny";
  std::string device = "auto";
  bool disable_cuda_graph = false;
  std::string kv_cache_dtype = "auto";
  int batch_size = 1;
  int input_len = 1024;
  int output_len = 16;
  uint64_t seed = 0;
  std::string run_name = "before";
  std::string result_filename;
};

// Bytes one decode step must read: every weight except the embedding table
// (only B rows of it), routed experts scaled by how many distinct experts B
// tokens hit under uniform routing (random weights route near-uniformly),
// and the latent cache of the whole batch.
double decode_bytes(const Checkpoint& ckpt, const ModelConfig& c, int batch, int64_t cached_tokens,
                    size_t kv_bytes_per_token) {
  double dense = 0, experts = 0;
  for (const auto& name : ckpt.names()) {
    if (name.find("embed_tokens") != std::string::npos) continue;
    if (name.rfind("model.layers.", 0) == 0) {
      int layer = std::stoi(name.substr(13));
      if (layer >= c.num_hidden_layers) continue;  // MTP block, not run here
    }
    const TensorInfo& t = ckpt.info(name);
    double bytes = double(shape_numel(t.shape)) * double(dtype_size(t.dtype));
    (name.find(".mlp.experts.") != std::string::npos ? experts : dense) += bytes;
  }
  double hit = 1.0;
  if (c.n_routed_experts > 0) {
    double e = c.n_routed_experts, k = c.num_experts_per_tok;
    hit = 1.0 - std::pow(1.0 - k / e, batch);  // expected fraction of experts some token picks
  }
  return dense + experts * hit + double(cached_tokens) * double(kv_bytes_per_token);
}

int run_bench_one_batch(const BenchOneBatchOptions& o) {
  MLA_CHECK(o.batch_size >= 1 && o.input_len >= 1 && o.output_len >= 1,
            "--batch-size, --input-len and --output-len must be >= 1");
  const Checkpoint ckpt = Checkpoint::open(o.model_path);
  std::unique_ptr<Backend> backend = runtime::choose_backend(o.device);
  ModelOptions mo;
  mo.load_mtp = false;
  DeepseekModel model(ckpt, *backend, mo);
  const ModelConfig& c = model.config();
  const int slots_per_seq = o.input_len + o.output_len;
  // Decode steps replay a CUDA graph of this batch size, as serving does.
  runtime::CudaGraphSettings graphs;
  graphs.enabled = !o.disable_cuda_graph && backend->device() == Device::CUDA;
  graphs.batch_sizes = {o.batch_size};
  graphs.max_kv_len = slots_per_seq;
  const KvCacheDtype kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  runtime::DeepseekModelRunner runner(model, o.batch_size * slots_per_seq, graphs, kv_dtype);

  runtime::Rng rng(o.seed);
  std::vector<std::vector<int32_t>> prompts(size_t(o.batch_size));
  for (auto& p : prompts)
    for (int i = 0; i < o.input_len; ++i) p.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
  fmt::print("[{}] batch {}, input {}, output {}, kv cache {}\n", backend->name(), o.batch_size, o.input_len,
             o.output_len, kv_cache_dtype_name(kv_dtype));
  const auto t0 = Clock::now();
  // Greedy, as sglang.bench_one_batch: the argmax runs on the device and only the ids come back.
  std::vector<int32_t> tokens = runner.forward_greedy(runtime::static_prefill_batch(prompts, slots_per_seq));
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double prefill_tput = double(o.batch_size) * o.input_len / prefill_s;
  fmt::print("Prefill. latency: {:.5f} s, throughput: {:10.2f} token/s\n", prefill_s, prefill_tput);

  std::vector<int32_t> lens(size_t(o.batch_size), o.input_len);
  std::vector<double> decode_s;
  const size_t kv_bpt = runtime::kv_bytes_per_token(c, backend->act_dtype(), kv_dtype);
  for (int step = 0; step + 1 < o.output_len; ++step) {
    const auto ts = Clock::now();
    tokens = runner.forward_greedy(runtime::static_decode_batch(tokens, lens, slots_per_seq));
    decode_s.push_back(std::chrono::duration<double>(Clock::now() - ts).count());
    for (auto& l : lens) ++l;
    if (step < 5 || step + 2 == o.output_len)
      fmt::print("Decode {}. Batch size: {}, latency: {:.5f} s, throughput: {:10.2f} token/s\n", step, o.batch_size,
                 decode_s.back(), o.batch_size / decode_s.back());
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  double median = 0;
  if (!decode_s.empty()) {
    std::vector<double> sorted = decode_s;
    std::sort(sorted.begin(), sorted.end());
    median = sorted[sorted.size() / 2];
    // Traffic of a step in the middle of the decode.
    const int64_t cached = int64_t(o.batch_size) * (o.input_len + o.output_len / 2);
    const double bytes = decode_bytes(ckpt, c, o.batch_size, cached, kv_bpt);
    fmt::print("Decode.  median latency: {:.5f} s, median throughput: {:10.2f} token/s\n", median,
               o.batch_size / median);
    fmt::print("Decode step reads ~{:.3f} GB (weights, experts hit at batch {}, latent cache) -> {:.1f} GB/s\n",
               bytes / 1e9, o.batch_size, bytes / median / 1e9);
  }
  const double total_tokens = double(o.batch_size) * (o.input_len + o.output_len);
  fmt::print("Total. latency: {:.3f} s, throughput: {:10.2f} token/s\n", total_s, total_tokens / total_s);

  if (!o.result_filename.empty()) {
    nlohmann::json r = {{"run_name", o.run_name},
                        {"device", backend->name()},
                        {"batch_size", o.batch_size},
                        {"input_len", o.input_len},
                        {"output_len", o.output_len},
                        {"prefill_latency", prefill_s},
                        {"prefill_throughput", prefill_tput},
                        {"median_decode_latency", median},
                        {"median_decode_throughput", median > 0 ? o.batch_size / median : 0.0},
                        {"total_latency", total_s},
                        {"overall_throughput", total_tokens / total_s}};
    std::ofstream f(o.result_filename, std::ios::app);
    MLA_CHECK(f.good(), "cannot open --result-filename {}", o.result_filename);
    f << r.dump() << "\n";
  }
  return 0;
}

CommandRegistration bench_one_batch_command(
    "bench-one-batch", "latency and throughput of one static batch (prefill, then decode)", [](CLI::App& app) {
      auto o = std::make_shared<BenchOneBatchOptions>();
      app.add_option("--model-path", o->model_path, "checkpoint directory")->capture_default_str();
      app.add_flag("--disable-cuda-graph", o->disable_cuda_graph, "run decode steps eagerly on CUDA");
      app.add_option("--device", o->device, "cpu, cuda or auto")
          ->capture_default_str()
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
      app.add_option("--kv-cache-dtype", o->kv_cache_dtype, "latent cache dtype: auto (= activations), bf16 or fp8_e4m3")
          ->capture_default_str()
          ->check(CLI::IsMember({"auto", "bf16", "fp8_e4m3"}));
      app.add_option("--batch-size", o->batch_size)->capture_default_str();
      app.add_option("--input-len", o->input_len)->capture_default_str();
      app.add_option("--output-len", o->output_len, "tokens per sequence, the first from the prefill")
          ->capture_default_str();
      app.add_option("--seed", o->seed, "seed of the random prompts")->capture_default_str();
      app.add_option("--run-name", o->run_name)->capture_default_str();
      app.add_option("--result-filename", o->result_filename, "append one JSON line with the results");
      return [=]() { return run_bench_one_batch(*o); };
    });

}  // namespace
}  // namespace mlaserve::cli

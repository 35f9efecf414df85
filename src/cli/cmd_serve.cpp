// mlaserve serve: the OpenAI-compatible HTTP server (SGLang's flag names).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "chat/model_chat_settings.h"
#include "chat/output_parser.h"
#include "cli/command.h"
#include "core/log.h"
#include "runtime/engine_loader.h"
#include "server/api_server.h"
#include "server/http_server.h"

namespace mlaserve::cli {
namespace {

struct ServeOptions {
  runtime::EngineArgs engine;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string served_model_name;
  std::string api_key;
  std::string reasoning_parser;
  std::string tool_call_parser;
  std::string chat_template;
  std::string log_level = "info";
  bool enable_metrics = false;
  double request_timeout_s = 30;
  double shutdown_timeout_s = 30;
  size_t max_body_bytes = size_t(32) << 20;
};

// Thousands of streaming clients need as many descriptors.
void raise_fd_limit() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

int run_serve(const ServeOptions& o) {
  init_logging(o.log_level);
  raise_fd_limit();
  runtime::LoadedEngine loaded(o.engine);
  const ModelConfig& c = loaded.config();
  const runtime::KvCapacity& kv = loaded.kv();

  server::ApiServerOptions api;
  api.served_model_name = o.served_model_name.empty() ? o.engine.model_path : o.served_model_name;
  api.api_key = o.api_key;
  api.enable_metrics = o.enable_metrics;
  api.chat_template = o.chat_template.empty() ? chat::detect_chat_template(o.engine.model_path)
                                              : chat::parse_chat_template_name(o.chat_template);
  api.chat_tokens = chat::load_chat_tokens(o.engine.model_path);
  if (!o.reasoning_parser.empty()) api.reasoning_parser = chat::parse_reasoning_parser_name(o.reasoning_parser);
  api.tool_parser = o.tool_call_parser.empty() ? chat::default_tool_parser(api.chat_template)
                                               : chat::parse_tool_parser_name(o.tool_call_parser);
  api.server_info = {{"model_path", o.engine.model_path},
                     {"device", loaded.backend().name()},
                     {"reasoning_parser", o.reasoning_parser},
                     {"tool_call_parser", o.tool_call_parser},
                     {"version", "0.1"}};
  server::ApiServer api_server(api, loaded.engine(), loaded.tokenizer());

  server::HttpServerOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.max_body_bytes = o.max_body_bytes;
  ho.request_timeout = std::chrono::milliseconds(int64_t(o.request_timeout_s * 1000));
  server::HttpServer http(ho, [&](server::HttpRequest&& r, std::shared_ptr<server::HttpResponder> resp) {
    api_server.handle(std::move(r), std::move(resp));
  });
  api_server.set_http_stats([&] { return http.stats(); });

  std::thread drainer;
  http.on_shutdown_signal([&](int sig) {
    spdlog::info("signal {}: no new connections; draining in-flight requests (up to {:.0f} s)", sig,
                 o.shutdown_timeout_s);
    http.stop_accepting();
    drainer = std::thread([&] {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.shutdown_timeout_s);
      bool drained = loaded.engine().drain(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
      // The last tokens are on their way to the clients: let the writes finish.
      while (http.stats().active_responses > 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!drained) spdlog::warn("shutdown timeout: aborting the requests still running");
      http.stop();
    });
  });

  spdlog::info("model {} ({}, {} layers, vocab {}) on {}", o.engine.model_path, c.architecture_name,
               c.num_hidden_layers, c.vocab_size, loaded.backend().name());
  spdlog::info("KV cache ({}): {} tokens ({} pages of {}), {:.1f} MiB, {} bytes per token",
               kv_cache_dtype_name(o.engine.kv_cache_dtype), kv.tokens, kv.num_pages,
               o.engine.page_size, double(kv.tokens) * double(kv.bytes_per_token) / (1 << 20), kv.bytes_per_token);
  spdlog::info("chat template {}, tool-call parser {}, reasoning parser {}",
               chat::chat_template_name(api.chat_template), o.tool_call_parser.empty() ? "(default)" : o.tool_call_parser,
               o.reasoning_parser.empty() ? "none" : o.reasoning_parser);
  // stdout, flushed: scripts (and the tests) read the address from here.
  std::printf("mlaserve listening on http://%s:%d\n", o.host.c_str(), http.port());
  std::fflush(stdout);
  http.run();
  if (drainer.joinable()) drainer.join();
  spdlog::info("server stopped");
  return 0;
}

CommandRegistration serve_command("serve", "serve the OpenAI-compatible HTTP API", [](CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto& e = o->engine;
  auto mem_fraction = std::make_shared<double>(0.85);
  auto max_total = std::make_shared<int64_t>(0);
  auto context = std::make_shared<int>(0);
  auto kv_dtype = std::make_shared<std::string>("auto");
  app.add_option("--model-path", e.model_path, "checkpoint directory")->capture_default_str();
  app.add_option("--host", o->host)->capture_default_str();
  app.add_option("--port", o->port, "0 picks a free port (printed at startup)")->capture_default_str();
  app.add_option("--served-model-name", o->served_model_name, "model name in the API (default: the model path)");
  app.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY'");
  app.add_option("--device", e.device, "cpu, cuda or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  auto* mem_opt = app.add_option("--mem-fraction-static", *mem_fraction,
                                 "fraction of device memory for weights + KV cache")->capture_default_str();
  auto* total_opt = app.add_option("--max-total-tokens", *max_total, "KV cache size in tokens (overrides the fraction)");
  app.add_option("--kv-cache-dtype", *kv_dtype, "latent cache dtype: auto (= activations), bf16 or fp8_e4m3")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8_e4m3"}));
  app.add_option("--max-running-requests", e.max_running_requests)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-queued-requests", e.max_queued_requests, "beyond this, requests get 503 + Retry-After")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chunked-prefill-size", e.chunked_prefill_size, "max prefill tokens per step; -1 disables chunking")
      ->capture_default_str();
  auto* context_opt = app.add_option("--context-length", *context, "default: the model's max_position_embeddings");
  app.add_option("--page-size", e.page_size, "tokens per KV page")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--schedule-policy", e.schedule_policy)
      ->capture_default_str()
      ->check(CLI::IsMember({"fcfs", "lpm"}));
  app.add_flag("--disable-radix-cache", e.disable_radix_cache, "no prefix reuse");
  app.add_flag("--disable-overlap-schedule", e.disable_overlap_schedule,
               "build each decode step after the previous one's tokens reach the host");
  app.add_flag("--disable-cuda-graph", e.disable_cuda_graph, "run decode steps eagerly on CUDA");
  app.add_option("--cuda-graph-max-bs", e.cuda_graph_max_bs, "largest decode batch captured in a CUDA graph")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--cuda-graph-bs", e.cuda_graph_bs, "decode batch sizes to capture (default 1,2,4,8,16,...)")
      ->delimiter(',');
  app.add_option("--reasoning-parser", o->reasoning_parser, "deepseek-r1 or deepseek-v3: split reasoning_content");
  app.add_option("--tool-call-parser", o->tool_call_parser, "deepseekv3, deepseekv31 or deepseekv32");
  app.add_option("--chat-template", o->chat_template, "v3, r1, v31 or v32 (default: from the model)");
  app.add_option("--log-level", o->log_level, "debug, info, warning, error")->capture_default_str();
  app.add_flag("--enable-metrics", o->enable_metrics, "serve Prometheus metrics at /metrics");
  app.add_option("--request-timeout", o->request_timeout_s, "seconds a client has to send a whole request")
      ->capture_default_str();
  app.add_option("--shutdown-timeout", o->shutdown_timeout_s, "seconds SIGTERM waits for in-flight requests")
      ->capture_default_str();
  app.add_option("--max-body-bytes", o->max_body_bytes, "largest accepted request body")->capture_default_str();
  return [=]() {
    if (mem_opt->count()) o->engine.mem_fraction_static = *mem_fraction;
    if (total_opt->count()) o->engine.max_total_tokens = *max_total;
    if (context_opt->count()) o->engine.context_length = *context;
    o->engine.kv_cache_dtype = parse_kv_cache_dtype(*kv_dtype);
    return run_serve(*o);
  };
});

}  // namespace
}  // namespace mlaserve::cli

#pragma once
// The OpenAI-compatible API (and SGLang's native /generate) on top of the
// Engine: request validation, prompt building, streaming and non-streaming
// responses, usage, and the operational endpoints (/health, /metrics, ...).
//
// Every handler runs on the HTTP io thread; engine callbacks hand their
// outputs over to it through the responder, so per-request state needs no
// locks.
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/reasoning_parser.h"
#include "chat/tool_call_parser.h"
#include "runtime/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/work_queue.h"
#include "tokenizer/tokenizer.h"

namespace mlaserve::server {

struct ApiServerOptions {
  std::string served_model_name = "default";
  std::string api_key;  // empty: no authentication
  bool enable_metrics = false;
  chat::ChatTemplateKind chat_template = chat::ChatTemplateKind::V3;
  chat::ChatTokens chat_tokens;
  std::optional<chat::ReasoningParserKind> reasoning_parser;  // none: reasoning stays in content
  chat::ToolParserKind tool_parser = chat::ToolParserKind::DeepSeekV3;
  nlohmann::json server_info = nlohmann::json::object();  // extra fields for /get_server_info
};

class ApiServer {
 public:
  ApiServer(ApiServerOptions options, runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer);
  ~ApiServer();

  void handle(HttpRequest&& request, std::shared_ptr<HttpResponder> responder);
  // Where /metrics reads the transport's counters from.
  void set_http_stats(std::function<HttpServerStats()> source) { http_stats_ = std::move(source); }

  struct Job;  // one HTTP generation request (api_server.cpp)

 private:
  void dispatch(HttpRequest& request, const std::shared_ptr<HttpResponder>& responder);
  // Runs fn on the io thread, answering its errors (400, 503, ...).
  void guarded(const std::shared_ptr<HttpResponder>& responder, const std::function<void()>& fn);
  // Builds the job on a worker thread, then starts it on the io thread.
  void prepare_async(const std::shared_ptr<HttpResponder>& responder, std::function<std::shared_ptr<Job>()> prepare);
  // Request bodies to jobs (parse, validate, template, tokenize): worker threads.
  std::shared_ptr<Job> prepare_chat(const std::string& body) const;
  std::shared_ptr<Job> prepare_completion(const std::string& body) const;
  std::shared_ptr<Job> prepare_native(const std::string& body) const;
  // Answers on a worker thread with the JSON `compute` returns (or its error).
  void respond_async(const std::shared_ptr<HttpResponder>& responder, std::function<std::string()> compute);
  // POST /tokenize and /detokenize (SGLang's shapes): plain encoding by default,
  // what `mlaserve tokenize` / `detokenize` print.
  std::string tokenize(const std::string& body) const;
  std::string detokenize(const std::string& body) const;
  void health_generate(const std::shared_ptr<HttpResponder>& responder);
  void flush_cache(const std::shared_ptr<HttpResponder>& responder);
  void start(const std::shared_ptr<Job>& job);
  void on_output(Job& job, size_t choice, runtime::RequestOutput&& out);
  void finish_job(Job& job);

  ApiServerOptions options_;
  runtime::Engine& engine_;
  tokenizer::Tokenizer tokenizer_;
  RequestMetrics metrics_;
  std::function<HttpServerStats()> http_stats_;
  WorkQueue workers_;  // last: joined first, while everything it uses is alive
};

}  // namespace mlaserve::server

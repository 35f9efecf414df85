#include "server/api_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "chat/chat_request.h"
#include "chat/output_parser.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/openai_sampling.h"

namespace mlaserve::server {

using Clock = std::chrono::steady_clock;
using runtime::FinishReason;
using runtime::RequestOutput;

enum class Endpoint { Chat, Completion, Generate };

struct ChoiceState {
  size_t prompt_index = 0;
  uint64_t engine_id = 0;
  bool submitted = false;
  bool finished = false;
  std::string text;
  std::vector<int32_t> ids;
  std::vector<runtime::SampledToken> logprobs;
  std::optional<chat::OutputParser> parser;
  RequestOutput final;
};

struct ApiServer::Job {
  Endpoint endpoint = Endpoint::Completion;
  std::shared_ptr<HttpResponder> http;
  std::string id;
  int64_t created = 0;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  bool want_logprobs = false;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for echo
  runtime::SamplingParams params;
  std::optional<int> max_tokens;
  int n = 1;
  std::optional<chat::OutputParserOptions> parser_options;
  std::vector<ChoiceState> choices;
  size_t unfinished = 0;
  bool client_gone = false;
  Clock::time_point start_time = Clock::now();
  bool first_token_seen = false;
};

namespace {

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[rng() % 16];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

void respond_error(HttpResponder& http, int status, const std::string& message, const std::string& param = {},
                   HeaderList headers = {}) {
  http.respond(status, openai_error_body(status, message, param), "application/json", std::move(headers));
}

Json byte_list(std::string_view bytes) {
  Json a = Json::array();
  for (unsigned char c : bytes) a.push_back(int(c));
  return a;
}

}  // namespace

ApiServer::ApiServer(ApiServerOptions options, runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      workers_(std::clamp(int(std::thread::hardware_concurrency()), 1, 4)) {}

ApiServer::~ApiServer() = default;

void ApiServer::handle(HttpRequest&& request, std::shared_ptr<HttpResponder> responder) {
  guarded(responder, [&] { dispatch(request, responder); });
}

void ApiServer::guarded(const std::shared_ptr<HttpResponder>& responder, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    respond_error(*responder, e.status(), e.what(), e.param());
  } catch (const runtime::QueueFullError& e) {
    metrics_.rejected_requests++;
    respond_error(*responder, 503, e.what(), {}, {{"Retry-After", "1"}});
  } catch (const Error& e) {
    respond_error(*responder, 400, e.what());
  }
}

void ApiServer::dispatch(HttpRequest& req, const std::shared_ptr<HttpResponder>& http) {
  const std::string& p = req.path;
  auto need = [&](const char* method) {
    if (req.method != method)
      throw ApiError(405, fmt::format("{} does not accept {} (use {})", p, req.method, method));
  };
  if (p == "/health") {
    need("GET");
    http->respond(200, "", "text/plain", {});
    return;
  }
  if (!options_.api_key.empty() && req.header("authorization") != "Bearer " + options_.api_key)
    throw ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')");

  if (p == "/v1/chat/completions") {
    need("POST");
    prepare_async(http, [this, body = std::move(req.body)] { return prepare_chat(body); });
  } else if (p == "/v1/completions") {
    need("POST");
    prepare_async(http, [this, body = std::move(req.body)] { return prepare_completion(body); });
  } else if (p == "/generate") {
    need("POST");
    prepare_async(http, [this, body = std::move(req.body)] { return prepare_native(body); });
  } else if (p == "/tokenize") {
    need("POST");
    respond_async(http, [this, body = std::move(req.body)] { return tokenize(body); });
  } else if (p == "/detokenize") {
    need("POST");
    respond_async(http, [this, body = std::move(req.body)] { return detokenize(body); });
  } else if (p == "/v1/models") {
    need("GET");
    nlohmann::json model = {{"id", options_.served_model_name},
                            {"object", "model"},
                            {"created", unix_now()},
                            {"owned_by", "mlaserve"},
                            {"root", options_.served_model_name},
                            {"max_model_len", engine_.config().scheduler.context_length}};
    http->respond(200, dump(nlohmann::json{{"object", "list"}, {"data", {model}}}), "application/json", {});
  } else if (p == "/health_generate") {
    need("GET");
    health_generate(http);
  } else if (p == "/metrics") {
    need("GET");
    if (!options_.enable_metrics) throw ApiError(404, "metrics are off (start the server with --enable-metrics)");
    auto body = render_metrics(engine_.stats(), engine_.in_flight(), engine_.config().scheduler.page_size,
                               http_stats_ ? http_stats_() : HttpServerStats{}, metrics_);
    http->respond(200, std::move(body), "text/plain; version=0.0.4", {});
  } else if (p == "/get_server_info") {
    need("GET");
    nlohmann::json info = options_.server_info;
    const auto& sc = engine_.config().scheduler;
    info["served_model_name"] = options_.served_model_name;
    info["max_total_num_tokens"] = engine_.capacity_tokens();
    info["page_size"] = sc.page_size;
    info["max_running_requests"] = sc.max_running_requests;
    info["chunked_prefill_size"] = sc.chunked_prefill_size;
    info["context_length"] = sc.context_length;
    info["schedule_policy"] = sc.policy == runtime::SchedulePolicy::Lpm ? "lpm" : "fcfs";
    info["disable_radix_cache"] = !sc.enable_radix_cache;
    info["chat_template"] = std::string(chat::chat_template_name(options_.chat_template));
    http->respond(200, dump(info), "application/json", {});
  } else if (p == "/flush_cache") {
    need("POST");
    flush_cache(http);
  } else {
    throw ApiError(404, fmt::format("no route for {} {}", req.method, p));
  }
}

void ApiServer::health_generate(const std::shared_ptr<HttpResponder>& http) {
  runtime::GenerateRequest g;
  g.input_ids = {tokenizer_.bos_id() >= 0 ? tokenizer_.bos_id() : 0};
  g.params.temperature = 0;
  g.params.max_new_tokens = 1;
  g.on_output = [http](RequestOutput&& out) {
    if (!out.finished()) return;
    bool ok = out.finish != FinishReason::Abort;
    http->post([http, ok] {
      if (ok) {
        http->respond(200, "", "text/plain", {});
      } else {
        respond_error(*http, 503, "the model step failed");
      }
    });
  };
  engine_.submit(std::move(g));
}

void ApiServer::flush_cache(const std::shared_ptr<HttpResponder>& http) {
  // Waits for the engine thread (up to one model step): not on the io thread.
  std::thread([this, http] {
    bool ok = engine_.flush_cache();
    http->post([http, ok] {
      if (ok) {
        http->respond(200, "Cache flushed.\n", "text/plain", {});
      } else {
        respond_error(*http, 400, "cache not flushed: requests are still running");
      }
    });
  }).detach();
}

void ApiServer::prepare_async(const std::shared_ptr<HttpResponder>& http,
                              std::function<std::shared_ptr<Job>()> prepare) {
  workers_.submit([this, http, prepare = std::move(prepare)] {
    std::shared_ptr<Job> job;
    std::exception_ptr error;
    try {
      job = prepare();
    } catch (...) {
      error = std::current_exception();
    }
    http->post([this, http, job, error] {
      guarded(http, [&] {
        if (error) std::rethrow_exception(error);
        if (http->closed()) return;  // the client left while its request was prepared
        job->http = http;
        start(job);
      });
    });
  });
}

void ApiServer::respond_async(const std::shared_ptr<HttpResponder>& http, std::function<std::string()> compute) {
  workers_.submit([this, http, compute = std::move(compute)] {
    std::string body;
    std::exception_ptr error;
    try {
      body = compute();
    } catch (...) {
      error = std::current_exception();
    }
    http->post([this, http, body = std::move(body), error] {
      guarded(http, [&] {
        if (error) std::rethrow_exception(error);
        http->respond(200, body, "application/json", {});
      });
    });
  });
}

std::string ApiServer::tokenize(const std::string& raw) const {
  Json body = parse_body(raw);
  const bool add_special = bool_field(body, "add_special_tokens").value_or(false);
  auto it = body.find("prompt");
  if (it == body.end() || !(it->is_string() || it->is_array()))
    throw ApiError(400, "'prompt' must be a string or an array of strings", "prompt");
  auto encode = [&](const Json& text) {
    if (!text.is_string()) throw ApiError(400, "'prompt' must be a string or an array of strings", "prompt");
    return tokenizer_.encode(text.get_ref<const std::string&>(), add_special);
  };
  nlohmann::json out;
  if (it->is_string()) {
    std::vector<int32_t> ids = encode(*it);
    out = {{"tokens", ids}, {"count", ids.size()}};
  } else {
    nlohmann::json tokens = nlohmann::json::array(), counts = nlohmann::json::array();
    for (const Json& text : *it) {
      std::vector<int32_t> ids = encode(text);
      counts.push_back(ids.size());
      tokens.push_back(std::move(ids));
    }
    out = {{"tokens", tokens}, {"count", counts}};
  }
  out["max_model_len"] = engine_.config().scheduler.context_length;
  return dump(out);
}

std::string ApiServer::detokenize(const std::string& raw) const {
  Json body = parse_body(raw);
  std::optional<std::vector<int32_t>> ids = token_ids_field(body, "tokens");
  if (!ids) throw ApiError(400, "'tokens' (an array of token ids) is required", "tokens");
  // Ids the model can produce but the tokenizer lacks decode to nothing, as
  // in HF tokenizers; ids beyond the model's vocabulary are a client error.
  for (size_t i = 0; i < ids->size(); ++i)
    if ((*ids)[i] >= engine_.vocab_size())
      throw ApiError(400,
                     fmt::format("'tokens'[{}] = {} is outside the model's vocabulary of {}", i, (*ids)[i],
                                 engine_.vocab_size()),
                     "tokens");
  const bool skip_special = bool_field(body, "skip_special_tokens").value_or(false);
  return dump(nlohmann::json{{"text", tokenizer_.decode(*ids, skip_special)}});
}

std::shared_ptr<ApiServer::Job> ApiServer::prepare_chat(const std::string& raw) const {
  Json body = parse_body(raw);
  auto o = parse_openai_options(body, ApiKind::Chat);
  chat::ChatRequest chat_request = chat::parse_chat_request(body);
  std::string tool_choice = "auto";
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (!tc.is_string() || (tc != "auto" && tc != "none"))
      throw ApiError(400, "'tool_choice' supports only \"auto\" and \"none\"", "tool_choice");
    tool_choice = tc.get<std::string>();
  }
  std::string prompt = chat::apply_chat_template(chat_request, options_.chat_template, options_.chat_tokens);

  auto job = std::make_shared<Job>();
  job->endpoint = Endpoint::Chat;
  job->id = random_id("chatcmpl-");
  job->prompts = {tokenizer_.encode(prompt, false)};
  job->params = o.params;
  job->max_tokens = o.max_tokens;
  job->n = o.n;
  job->stream = o.stream;
  job->include_usage = o.include_usage;
  job->want_logprobs = o.params.logprobs;
  chat::OutputParserOptions po;
  po.reasoning_parser = options_.reasoning_parser;
  bool has_tools = chat_request.tools.is_array() && !chat_request.tools.empty();
  if (has_tools && tool_choice != "none") {
    po.tool_parser = options_.tool_parser;
    po.tools = chat_request.tools;
  }
  po.thinking = chat::thinking_enabled(chat_request, options_.chat_template);
  job->parser_options = po;
  return job;
}

std::shared_ptr<ApiServer::Job> ApiServer::prepare_completion(const std::string& raw) const {
  Json body = parse_body(raw);
  auto o = parse_openai_options(body, ApiKind::Completion);
  auto job = std::make_shared<Job>();
  job->endpoint = Endpoint::Completion;
  job->id = random_id("cmpl-");
  if (!body.contains("prompt") || body["prompt"].is_null()) throw ApiError(400, "'prompt' is required", "prompt");
  const Json& prompt = body["prompt"];
  auto bad_prompt = [] {
    return ApiError(400, "'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays",
                    "prompt");
  };
  auto add_text = [&](const std::string& text) {
    job->prompts.push_back(tokenizer_.encode(text, true));
    job->prompt_texts.push_back(text);
  };
  auto add_ids = [&](const Json& ids) {
    std::vector<int32_t> v;
    for (auto& e : ids) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) throw bad_prompt();
      v.push_back(int32_t(e.get<int64_t>()));
    }
    job->prompt_texts.push_back(tokenizer_.decode(v, false));
    job->prompts.push_back(std::move(v));
  };
  if (prompt.is_string()) {
    add_text(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty()) {
    if (prompt[0].is_string()) {
      for (auto& e : prompt) {
        if (!e.is_string()) throw bad_prompt();
        add_text(e.get<std::string>());
      }
    } else if (prompt[0].is_array()) {
      for (auto& e : prompt) {
        if (!e.is_array()) throw bad_prompt();
        add_ids(e);
      }
    } else {
      add_ids(prompt);
    }
  } else {
    throw bad_prompt();
  }
  if (job->prompts.size() * size_t(o.n) > 64)
    throw ApiError(400, "at most 64 completions (prompts times n) per request", "n");
  job->params = o.params;
  job->max_tokens = o.max_tokens;
  job->n = o.n;
  job->stream = o.stream;
  job->include_usage = o.include_usage;
  job->want_logprobs = o.params.logprobs;
  if (auto v = bool_field(body, "echo")) job->echo = *v;
  return job;
}

std::shared_ptr<ApiServer::Job> ApiServer::prepare_native(const std::string& raw) const {
  Json body = parse_body(raw);
  auto job = std::make_shared<Job>();
  job->endpoint = Endpoint::Generate;
  job->id = random_id("");
  bool has_text = body.contains("text") && !body["text"].is_null();
  bool has_ids = body.contains("input_ids") && !body["input_ids"].is_null();
  if (has_text == has_ids) throw ApiError(400, "give exactly one of 'text' and 'input_ids'");
  if (has_text) {
    if (!body["text"].is_string())
      throw ApiError(400, "'text' must be a string (batched /generate is not supported: one request per prompt)", "text");
    job->prompts = {tokenizer_.encode(body["text"].get<std::string>(), true)};
  } else {
    job->prompts = {*token_ids_field(body, "input_ids")};
  }
  job->params = body.contains("sampling_params") && !body["sampling_params"].is_null()
                    ? parse_native_sampling_params(body["sampling_params"])
                    : runtime::SamplingParams{};
  job->max_tokens = job->params.max_new_tokens;
  if (auto v = bool_field(body, "stream")) job->stream = *v;
  if (auto v = bool_field(body, "return_logprob")) job->want_logprobs = job->params.logprobs = *v;
  return job;
}

void ApiServer::start(const std::shared_ptr<Job>& job) {
  job->created = unix_now();
  const int context = engine_.config().scheduler.context_length;
  for (size_t pi = 0; pi < job->prompts.size(); ++pi) {
    int plen = int(job->prompts[pi].size());
    if (plen == 0) throw ApiError(400, "the prompt is empty", "prompt");
    if (plen >= context)
      throw ApiError(400, fmt::format("the prompt has {} tokens; this model's context length is {} tokens", plen, context),
                     job->endpoint == Endpoint::Chat ? "messages" : "prompt", "context_length_exceeded");
    if (job->max_tokens && plen + *job->max_tokens > context)
      throw ApiError(400,
                     fmt::format("this model's context length is {} tokens; the request asks for {} ({} in the prompt, "
                                 "{} for the completion)",
                                 context, plen + *job->max_tokens, plen, *job->max_tokens),
                     "max_tokens", "context_length_exceeded");
    for (int k = 0; k < job->n; ++k) {
      ChoiceState c;
      c.prompt_index = pi;
      if (job->parser_options) c.parser.emplace(*job->parser_options);
      job->choices.push_back(std::move(c));
    }
  }
  job->params.validate();
  job->unfinished = job->choices.size();

  // Every choice is submitted or none is: a 503 half way aborts the others.
  try {
    for (size_t i = 0; i < job->choices.size(); ++i) {
      runtime::GenerateRequest g;
      g.input_ids = job->prompts[job->choices[i].prompt_index];
      g.params = job->params;
      g.params.max_new_tokens = job->max_tokens.value_or(context - int(g.input_ids.size()));
      if (g.params.seed && i > 0) *g.params.seed += i;  // n choices with one seed must still differ
      std::shared_ptr<HttpResponder> http = job->http;
      g.on_output = [this, job, i, http](RequestOutput&& out) {
        auto shared = std::make_shared<RequestOutput>(std::move(out));
        http->post([this, job, i, shared] { on_output(*job, i, std::move(*shared)); });
      };
      job->choices[i].engine_id = engine_.submit(std::move(g));
      job->choices[i].submitted = true;
    }
  } catch (...) {
    for (auto& c : job->choices)
      if (c.submitted) engine_.abort(c.engine_id);
    job->client_gone = true;  // nothing more goes to this client
    throw;
  }
  job->http->on_disconnect([this, job] {
    job->client_gone = true;
    for (auto& c : job->choices) {
      if (!c.finished) {
        engine_.abort(c.engine_id);
        metrics_.aborted_requests++;
      }
    }
  });

  if (job->stream) {
    job->http->start_stream();
    if (job->endpoint == Endpoint::Chat) {
      for (size_t i = 0; i < job->choices.size(); ++i) {
        Json chunk = {{"id", job->id},
                      {"object", "chat.completion.chunk"},
                      {"created", job->created},
                      {"model", options_.served_model_name},
                      {"choices", Json::array({Json{{"index", i},
                                                    {"delta", Json{{"role", "assistant"}, {"content", ""}}},
                                                    {"logprobs", nullptr},
                                                    {"finish_reason", nullptr}}})}};
        job->http->send_chunk(sse(dump(chunk)));
      }
    } else if (job->endpoint == Endpoint::Completion && job->echo) {
      for (size_t i = 0; i < job->choices.size(); ++i) {
        Json chunk = {{"id", job->id},
                      {"object", "text_completion"},
                      {"created", job->created},
                      {"model", options_.served_model_name},
                      {"choices", Json::array({Json{{"index", i},
                                                    {"text", job->prompt_texts[job->choices[i].prompt_index]},
                                                    {"logprobs", nullptr},
                                                    {"finish_reason", nullptr}}})}};
        job->http->send_chunk(sse(dump(chunk)));
      }
    }
  }
}

namespace {

Json chat_logprobs(const std::vector<runtime::SampledToken>& lps, const tokenizer::Tokenizer& tok) {
  Json content = Json::array();
  for (auto& s : lps) {
    Json top = Json::array();
    for (auto& [id, lp] : s.top)
      top.push_back({{"token", tok.decode({id}, false)}, {"logprob", lp}, {"bytes", byte_list(tok.token_bytes(id))}});
    content.push_back({{"token", tok.decode({s.id}, false)},
                       {"logprob", s.logprob},
                       {"bytes", byte_list(tok.token_bytes(s.id))},
                       {"top_logprobs", top}});
  }
  return Json{{"content", content}};
}

Json completion_logprobs(const std::vector<runtime::SampledToken>& lps, const tokenizer::Tokenizer& tok,
                         size_t text_offset) {
  Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(), offsets = Json::array();
  for (auto& s : lps) {
    std::string t = tok.decode({s.id}, false);
    tokens.push_back(t);
    token_lps.push_back(s.logprob);
    Json top = Json::object();
    for (auto& [id, lp] : s.top) top[tok.decode({id}, false)] = lp;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += t.size();
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

const char* native_finish_type(FinishReason r) { return runtime::finish_reason_name(r); }

}  // namespace

void ApiServer::on_output(Job& job, size_t i, RequestOutput&& out) {
  ChoiceState& c = job.choices[i];
  if (c.finished) return;
  if (!job.first_token_seen && !out.token_ids.empty()) {
    job.first_token_seen = true;
    metrics_.time_to_first_token.observe(std::chrono::duration<double>(Clock::now() - job.start_time).count());
  }
  c.ids.insert(c.ids.end(), out.token_ids.begin(), out.token_ids.end());
  c.text += out.text;
  c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  bool finished = out.finished();
  if (finished) {
    c.finished = true;
    job.unfinished--;
  }

  if (job.stream && !job.client_gone) {
    Json chunk;
    if (job.endpoint == Endpoint::Chat) {
      chat::StreamDelta delta = c.parser->push(out.text);
      if (finished) {
        chat::StreamDelta tail = c.parser->finish();
        delta.reasoning_content += tail.reasoning_content;
        delta.content += tail.content;
        for (auto& t : tail.tool_calls) {
          if (!t.id.empty() || t.arguments.empty()) {
            delta.tool_calls.push_back(t);
          } else {
            delta.add_arguments(t.index, t.arguments);
          }
        }
      }
      Json lp = job.want_logprobs && !out.logprobs.empty() ? chat_logprobs(out.logprobs, tokenizer_) : Json();
      if (!delta.empty() || !lp.is_null()) {
        chunk = {{"id", job.id},
                 {"object", "chat.completion.chunk"},
                 {"created", job.created},
                 {"model", options_.served_model_name},
                 {"choices", Json::array({Json{{"index", i},
                                               {"delta", delta.to_openai_delta()},
                                               {"logprobs", lp},
                                               {"finish_reason", nullptr}}})}};
        job.http->send_chunk(sse(dump(chunk)));
      }
      if (finished && out.finish != FinishReason::Abort) {
        std::string reason(chat::finish_reason(c.parser->result(), out.finish == FinishReason::Length));
        chunk = {{"id", job.id},
                 {"object", "chat.completion.chunk"},
                 {"created", job.created},
                 {"model", options_.served_model_name},
                 {"choices", Json::array({Json{{"index", i},
                                               {"delta", Json::object()},
                                               {"logprobs", nullptr},
                                               {"finish_reason", reason}}})}};
        job.http->send_chunk(sse(dump(chunk)));
      }
    } else if (job.endpoint == Endpoint::Completion) {
      bool has_lp = job.want_logprobs && !out.logprobs.empty();
      if (!out.text.empty() || has_lp || (finished && out.finish != FinishReason::Abort)) {
        chunk = {{"id", job.id},
                 {"object", "text_completion"},
                 {"created", job.created},
                 {"model", options_.served_model_name},
                 {"choices", Json::array({Json{
                                 {"index", i},
                                 {"text", out.text},
                                 {"logprobs", has_lp ? completion_logprobs(out.logprobs, tokenizer_, 0) : Json()},
                                 {"finish_reason", finished && out.finish != FinishReason::Abort
                                                       ? Json(runtime::finish_reason_name(out.finish))
                                                       : Json()}}})}};
        job.http->send_chunk(sse(dump(chunk)));
      }
    } else {
      chunk = {{"text", c.text},
               {"output_ids", c.ids},
               {"meta_info", {{"id", job.id}, {"completion_tokens", c.ids.size()}}}};
      if (finished) {
        chunk["meta_info"]["finish_reason"] = {{"type", native_finish_type(out.finish)}};
        chunk["meta_info"]["prompt_tokens"] = out.prompt_tokens;
        chunk["meta_info"]["cached_tokens"] = out.cached_tokens;
      }
      job.http->send_chunk(sse(dump(chunk)));
    }
    if (finished && out.finish == FinishReason::Abort) {
      job.http->send_chunk(sse(openai_error_body(503, "request aborted: " + out.abort_message)));
    }
  }
  if (finished) c.final = std::move(out);
  if (job.unfinished == 0) finish_job(job);
}

void ApiServer::finish_job(Job& job) {
  metrics_.e2e_latency.observe(std::chrono::duration<double>(Clock::now() - job.start_time).count());
  if (job.client_gone) return;
  // Usage: each prompt once, every choice's completion.
  int prompt_tokens = 0, completion_tokens = 0, cached = 0;
  std::vector<bool> seen(job.prompts.size(), false);
  bool aborted = false;
  std::string abort_message;
  for (auto& c : job.choices) {
    completion_tokens += c.final.completion_tokens;
    if (!seen[c.prompt_index]) {
      seen[c.prompt_index] = true;
      prompt_tokens += c.final.prompt_tokens;
      cached += c.final.cached_tokens;
    }
    if (c.final.finish == FinishReason::Abort) {
      aborted = true;
      abort_message = c.final.abort_message;
    }
  }
  Json usage = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  if (job.stream) {
    if (job.include_usage && job.endpoint != Endpoint::Generate) {
      Json chunk = {{"id", job.id},
                    {"object", job.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", job.created},
                    {"model", options_.served_model_name},
                    {"choices", Json::array()},
                    {"usage", usage}};
      job.http->send_chunk(sse(dump(chunk)));
    }
    job.http->send_chunk("data: [DONE]\n\n");
    job.http->end_stream();
    return;
  }
  if (aborted) {
    metrics_.aborted_requests++;
    respond_error(*job.http, 503, "request aborted: " + abort_message, {}, {{"Retry-After", "1"}});
    return;
  }
  Json choices = Json::array();
  Json response;
  if (job.endpoint == Endpoint::Chat) {
    for (size_t i = 0; i < job.choices.size(); ++i) {
      auto& c = job.choices[i];
      c.parser->push(c.text);
      c.parser->finish();
      const chat::AssistantMessage& m = c.parser->result();
      Json message = m.to_openai_message();
      choices.push_back({{"index", i},
                         {"message", message},
                         {"logprobs", job.want_logprobs ? chat_logprobs(c.logprobs, tokenizer_) : Json()},
                         {"finish_reason", std::string(chat::finish_reason(m, c.final.finish == FinishReason::Length))},
                         {"matched_stop", c.final.matched_stop_string  ? Json(*c.final.matched_stop_string)
                                          : c.final.matched_stop_token ? Json(*c.final.matched_stop_token)
                                                                       : Json()}});
    }
    response = {{"id", job.id}, {"object", "chat.completion"}, {"created", job.created},
                {"model", options_.served_model_name}, {"choices", choices}, {"usage", usage}};
  } else if (job.endpoint == Endpoint::Completion) {
    for (size_t i = 0; i < job.choices.size(); ++i) {
      auto& c = job.choices[i];
      std::string prefix = job.echo ? job.prompt_texts[c.prompt_index] : std::string();
      choices.push_back({{"index", i},
                         {"text", prefix + c.text},
                         {"logprobs", job.want_logprobs ? completion_logprobs(c.logprobs, tokenizer_, prefix.size())
                                                        : Json()},
                         {"finish_reason", runtime::finish_reason_name(c.final.finish)}});
    }
    response = {{"id", job.id}, {"object", "text_completion"}, {"created", job.created},
                {"model", options_.served_model_name}, {"choices", choices}, {"usage", usage}};
  } else {
    auto& c = job.choices[0];
    Json finish = {{"type", native_finish_type(c.final.finish)}};
    if (c.final.matched_stop_token) finish["matched"] = *c.final.matched_stop_token;
    if (c.final.matched_stop_string) finish["matched"] = *c.final.matched_stop_string;
    if (c.final.finish == FinishReason::Length) finish["length"] = c.final.completion_tokens;
    Json meta = {{"id", job.id},
                 {"finish_reason", finish},
                 {"prompt_tokens", c.final.prompt_tokens},
                 {"completion_tokens", c.final.completion_tokens},
                 {"cached_tokens", c.final.cached_tokens},
                 {"e2e_latency", std::chrono::duration<double>(Clock::now() - job.start_time).count()}};
    if (job.want_logprobs) {
      Json lps = Json::array();
      for (auto& s : c.logprobs) lps.push_back(Json::array({s.logprob, s.id, nullptr}));
      meta["output_token_logprobs"] = lps;
    }
    response = {{"text", c.text}, {"output_ids", c.ids}, {"meta_info", meta}};
  }
  job.http->respond(200, dump(response), "application/json", {});
}

}  // namespace mlaserve::server

#include "server/openai_sampling.h"

#include "server/api_error.h"

namespace mlaserve::server {

namespace {

constexpr int kMaxChoices = 16;

void check_range(const char* name, double v, double lo, double hi) {
  if (v < lo || v > hi) throw ApiError(400, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, v), name);
}

// Fields both APIs share (OpenAI names, plus SGLang's extensions).
void parse_common(const Json& b, runtime::SamplingParams& p) {
  if (auto v = number_field(b, "temperature")) {
    check_range("temperature", *v, 0, 2);
    p.temperature = float(*v);
  }
  if (auto v = number_field(b, "top_p")) {
    check_range("top_p", *v, 0, 1);
    if (*v == 0) throw ApiError(400, "'top_p' must be greater than 0", "top_p");
    p.top_p = float(*v);
  }
  if (auto v = integer_field(b, "top_k")) {
    if (*v != -1 && (*v < 1 || *v > INT32_MAX)) throw ApiError(400, "'top_k' must be -1 or a positive integer", "top_k");
    p.top_k = int(*v);
  }
  if (auto v = number_field(b, "min_p")) {
    check_range("min_p", *v, 0, 1);
    p.min_p = float(*v);
  }
  if (auto v = number_field(b, "presence_penalty")) {
    check_range("presence_penalty", *v, -2, 2);
    p.presence_penalty = float(*v);
  }
  if (auto v = number_field(b, "frequency_penalty")) {
    check_range("frequency_penalty", *v, -2, 2);
    p.frequency_penalty = float(*v);
  }
  if (auto v = number_field(b, "repetition_penalty")) {
    check_range("repetition_penalty", *v, 0.01, 2);
    p.repetition_penalty = float(*v);
  }
  p.stop = string_or_strings_field(b, "stop");
  if (p.stop.size() > 16) throw ApiError(400, "'stop' may hold at most 16 strings", "stop");
  for (auto& s : p.stop)
    if (s.empty()) throw ApiError(400, "'stop' strings must not be empty", "stop");
  if (auto v = token_ids_field(b, "stop_token_ids")) p.stop_token_ids = *v;
  if (auto v = integer_field(b, "seed")) p.seed = uint64_t(*v);
  if (auto v = bool_field(b, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = bool_field(b, "skip_special_tokens")) p.skip_special_tokens = *v;
}

}  // namespace

OpenAiOptions parse_openai_options(const Json& b, ApiKind kind) {
  OpenAiOptions o;
  parse_common(b, o.params);
  if (auto v = string_field(b, "model"); !v && b.contains("model") && !b["model"].is_null())
    throw ApiError(400, "'model' must be a string", "model");
  const char* max_name = "max_tokens";
  auto max_tokens = integer_field(b, "max_tokens");
  if (kind == ApiKind::Chat) {
    if (auto v = integer_field(b, "max_completion_tokens")) {
      max_tokens = v;
      max_name = "max_completion_tokens";
    }
  } else if (!max_tokens) {
    max_tokens = 16;  // OpenAI's completions default
  }
  if (max_tokens) {
    if (*max_tokens < (kind == ApiKind::Chat ? 1 : 0) || *max_tokens > INT32_MAX)
      throw ApiError(400, fmt::format("'{}' must be {}, got {}", max_name,
                                      kind == ApiKind::Chat ? "a positive integer" : "a non-negative integer", *max_tokens),
                     max_name);
    o.max_tokens = int(*max_tokens);
  }
  if (auto v = integer_field(b, "n")) {
    if (*v < 1 || *v > kMaxChoices)
      throw ApiError(400, fmt::format("'n' must be in [1, {}], got {}", kMaxChoices, *v), "n");
    o.n = int(*v);
  }
  if (auto v = integer_field(b, "best_of"); v && *v != o.n)
    throw ApiError(400, "'best_of' different from 'n' is not supported", "best_of");
  if (auto v = bool_field(b, "stream")) o.stream = *v;
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    const Json& so = b["stream_options"];
    if (!so.is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    if (!o.stream) throw ApiError(400, "'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (auto v = bool_field(so, "include_usage")) o.include_usage = *v;
  }
  if (b.contains("logit_bias") && !b["logit_bias"].is_null()) {
    if (!b["logit_bias"].is_object()) throw ApiError(400, "'logit_bias' must be an object", "logit_bias");
    if (!b["logit_bias"].empty()) throw ApiError(400, "'logit_bias' is not supported", "logit_bias");
  }
  if (b.contains("response_format") && !b["response_format"].is_null()) {
    const Json& rf = b["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      throw ApiError(400, "'response_format' must be an object with a string 'type'", "response_format");
    if (rf["type"] != "text")
      throw ApiError(400,
                     fmt::format("response_format type '{}' is not supported (only 'text')", rf["type"].get<std::string>()),
                     "response_format");
  }
  if (kind == ApiKind::Chat) {
    if (auto v = bool_field(b, "logprobs")) o.params.logprobs = *v;
    if (auto v = integer_field(b, "top_logprobs")) {
      if (*v < 0 || *v > 20) throw ApiError(400, "'top_logprobs' must be in [0, 20]", "top_logprobs");
      if (!o.params.logprobs) throw ApiError(400, "'top_logprobs' requires 'logprobs': true", "top_logprobs");
      o.params.top_logprobs = int(*v);
    }
  } else {
    if (auto v = integer_field(b, "logprobs")) {
      if (*v < 0 || *v > 5) throw ApiError(400, "'logprobs' must be in [0, 5]", "logprobs");
      o.params.logprobs = true;
      o.params.top_logprobs = int(*v);
    }
    if (auto v = string_field(b, "suffix"); v && !v->empty())
      throw ApiError(400, "'suffix' is not supported", "suffix");
  }
  return o;
}

runtime::SamplingParams parse_native_sampling_params(const Json& sp) {
  if (!sp.is_object()) throw ApiError(400, "'sampling_params' must be an object", "sampling_params");
  runtime::SamplingParams p;
  parse_common(sp, p);
  if (auto v = integer_field(sp, "max_new_tokens")) {
    if (*v < 0 || *v > INT32_MAX) throw ApiError(400, "'max_new_tokens' must be a non-negative integer", "max_new_tokens");
    p.max_new_tokens = int(*v);
  }
  return p;
}

}  // namespace mlaserve::server

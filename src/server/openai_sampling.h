#pragma once
// OpenAI (and SGLang's extra) sampling fields of a request body mapped onto
// the runtime's SamplingParams, each checked with a 400 naming the field.
#include "runtime/sampling_params.h"
#include "server/json_fields.h"

namespace mlaserve::server {

enum class ApiKind { Chat, Completion };

struct OpenAiOptions {
  runtime::SamplingParams params;
  std::optional<int> max_tokens;  // nullopt: up to the context length
  int n = 1;
  bool stream = false;
  bool include_usage = false;
};

OpenAiOptions parse_openai_options(const Json& body, ApiKind kind);

// SGLang's native `sampling_params` object (/generate).
runtime::SamplingParams parse_native_sampling_params(const Json& sampling_params);

}  // namespace mlaserve::server

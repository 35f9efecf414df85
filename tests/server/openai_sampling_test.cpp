#include "server/openai_sampling.h"

#include <gtest/gtest.h>

#include "server/api_error.h"

using namespace mlaserve::server;

namespace {

// The param an ApiError names, or "" when parsing succeeds.
std::string rejected_param(const char* body, ApiKind kind = ApiKind::Chat) {
  try {
    parse_openai_options(Json::parse(body), kind);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    return e.param().empty() ? "?" : e.param();
  }
  return "";
}

}  // namespace

TEST(OpenAiSampling, MapsOpenAiAndSglangFields) {
  auto o = parse_openai_options(Json::parse(R"({"temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "stop": "END",
      "seed": 7, "n": 2, "max_completion_tokens": 33, "stream": true, "stream_options": {"include_usage": true},
      "logprobs": true, "top_logprobs": 4, "ignore_eos": true, "stop_token_ids": [5, 6]})"),
                                ApiKind::Chat);
  EXPECT_FLOAT_EQ(o.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(o.params.top_p, 0.9f);
  EXPECT_EQ(o.params.top_k, 40);
  EXPECT_FLOAT_EQ(o.params.min_p, 0.1f);
  EXPECT_FLOAT_EQ(o.params.frequency_penalty, -0.5f);
  EXPECT_EQ(o.params.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(o.params.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(*o.params.seed, 7u);
  EXPECT_EQ(o.n, 2);
  EXPECT_EQ(*o.max_tokens, 33);
  EXPECT_TRUE(o.stream && o.include_usage && o.params.ignore_eos);
  EXPECT_TRUE(o.params.logprobs);
  EXPECT_EQ(o.params.top_logprobs, 4);
}

TEST(OpenAiSampling, DefaultsFollowOpenAi) {
  auto chat = parse_openai_options(Json::parse("{}"), ApiKind::Chat);
  EXPECT_FALSE(chat.max_tokens.has_value());  // up to the context
  EXPECT_FLOAT_EQ(chat.params.temperature, 1.0f);
  auto comp = parse_openai_options(Json::parse(R"({"logprobs": 3, "max_tokens": null})"), ApiKind::Completion);
  EXPECT_EQ(*comp.max_tokens, 16);
  EXPECT_EQ(comp.params.top_logprobs, 3);
  EXPECT_EQ(*parse_openai_options(Json::parse(R"({"max_tokens": 5.0})"), ApiKind::Completion).max_tokens, 5);
}

TEST(OpenAiSampling, RejectsWithTheFieldName) {
  EXPECT_EQ(rejected_param(R"({"temperature": "hot"})"), "temperature");
  EXPECT_EQ(rejected_param(R"({"temperature": 3})"), "temperature");
  EXPECT_EQ(rejected_param(R"({"top_p": 0})"), "top_p");
  EXPECT_EQ(rejected_param(R"({"top_k": 0})"), "top_k");
  EXPECT_EQ(rejected_param(R"({"max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(rejected_param(R"({"max_tokens": 2.5})", ApiKind::Completion), "max_tokens");
  EXPECT_EQ(rejected_param(R"({"max_completion_tokens": -1})"), "max_completion_tokens");
  EXPECT_EQ(rejected_param(R"({"n": 17})"), "n");
  EXPECT_EQ(rejected_param(R"({"stop": [1]})"), "stop");
  EXPECT_EQ(rejected_param(R"({"stop": [""]})"), "stop");
  EXPECT_EQ(rejected_param(R"({"stream_options": {"include_usage": true}})"), "stream_options");
  EXPECT_EQ(rejected_param(R"({"top_logprobs": 2})"), "top_logprobs");
  EXPECT_EQ(rejected_param(R"({"logit_bias": {"1": 5}})"), "logit_bias");
  EXPECT_EQ(rejected_param(R"({"response_format": {"type": "json_object"}})"), "response_format");
  EXPECT_EQ(rejected_param(R"({"logprobs": 9})", ApiKind::Completion), "logprobs");
  EXPECT_EQ(rejected_param(R"({"suffix": "x"})", ApiKind::Completion), "suffix");
  EXPECT_EQ(rejected_param(R"({"best_of": 3})", ApiKind::Completion), "best_of");
  EXPECT_EQ(rejected_param(R"({"stop_token_ids": [-1]})"), "stop_token_ids");
  EXPECT_EQ(rejected_param(R"({"response_format": {"type": "text"}, "logit_bias": {}})"), "");
}

TEST(OpenAiSampling, NativeSamplingParams) {
  auto p = parse_native_sampling_params(Json::parse(R"({"max_new_tokens": 9, "temperature": 0, "stop": ["a", "b"]})"));
  EXPECT_EQ(p.max_new_tokens, 9);
  EXPECT_TRUE(p.greedy());
  EXPECT_EQ(p.stop.size(), 2u);
  EXPECT_THROW(parse_native_sampling_params(Json::parse("[]")), ApiError);
  EXPECT_THROW(parse_native_sampling_params(Json::parse(R"({"max_new_tokens": -2})")), ApiError);
}

TEST(JsonFields, BodyMustBeAnObject) {
  EXPECT_THROW(parse_body("[1]"), ApiError);
  EXPECT_THROW(parse_body("{\"a\": "), ApiError);
  EXPECT_THROW(parse_body(""), ApiError);
  EXPECT_EQ(parse_body(R"({"a": 1})")["a"], 1);
}

TEST(ApiError, OpenAiBodyShape) {
  auto j = Json::parse(openai_error_body(503, "busy"));
  EXPECT_EQ(j["error"]["message"], "busy");
  EXPECT_EQ(j["error"]["type"], "service_unavailable_error");
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_EQ(Json::parse(openai_error_body(400, "x", "n"))["error"]["param"], "n");
}

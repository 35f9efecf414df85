#include "chat/output_parser.h"

namespace mlaserve::chat {

using nlohmann::ordered_json;

nlohmann::ordered_json AssistantMessage::to_openai_message() const {
  ordered_json m = {{"role", "assistant"}};
  m["content"] = content.empty() && !tool_calls.empty() ? ordered_json(nullptr) : ordered_json(content);
  m["reasoning_content"] = reasoning_content.empty() ? ordered_json(nullptr) : ordered_json(reasoning_content);
  if (!tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const ParsedToolCall& c : tool_calls) {
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    m["tool_calls"] = calls;
  }
  return m;
}

std::string_view finish_reason(const AssistantMessage& message, bool hit_length_limit) {
  if (hit_length_limit) return "length";
  return message.tool_calls.empty() ? "stop" : "tool_calls";
}

std::optional<ReasoningParserKind> default_reasoning_parser(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::V3: return std::nullopt;
    case ChatTemplateKind::R1: return ReasoningParserKind::DeepSeekR1;
    case ChatTemplateKind::V31:
    case ChatTemplateKind::V32: return ReasoningParserKind::DeepSeekV3;
  }
  return std::nullopt;
}

ToolParserKind default_tool_parser(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::V3:
    case ChatTemplateKind::R1: return ToolParserKind::DeepSeekV3;
    case ChatTemplateKind::V31: return ToolParserKind::DeepSeekV31;
    case ChatTemplateKind::V32: return ToolParserKind::DeepSeekV32;
  }
  return ToolParserKind::DeepSeekV3;
}

OutputParser::OutputParser(const OutputParserOptions& options) {
  if (options.reasoning_parser) {
    reasoning_ = std::make_unique<ReasoningParser>(starts_in_reasoning(*options.reasoning_parser, options.thinking));
  }
  if (options.tool_parser) {
    std::vector<std::string> names;
    if (options.tools.is_array()) {
      for (const auto& tool : options.tools) {
        if (tool.contains("function") && tool["function"].contains("name") && tool["function"]["name"].is_string()) {
          names.push_back(tool["function"]["name"].get<std::string>());
        }
      }
    }
    tools_ = make_tool_call_parser(*options.tool_parser, std::move(names));
  }
}

StreamDelta OutputParser::push(std::string_view text) {
  StreamDelta delta;
  std::string answer;
  if (reasoning_) {
    reasoning_->push(text, delta.reasoning_content, answer);
  } else {
    answer = text;
  }
  if (tools_) {
    tools_->push(answer, delta);
  } else {
    delta.content += answer;
  }
  apply(delta);
  return delta;
}

StreamDelta OutputParser::finish() {
  StreamDelta delta;
  std::string answer;
  if (reasoning_) reasoning_->finish(delta.reasoning_content, answer);
  if (tools_) {
    tools_->push(answer, delta);
    tools_->finish(delta);
  } else {
    delta.content += answer;
  }
  apply(delta);
  for (ParsedToolCall& call : message_.tool_calls) {
    ordered_json args = ordered_json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    call.arguments_valid = args.is_object();
  }
  if (tools_ && tools_->last_call_truncated() && !message_.tool_calls.empty()) {
    message_.tool_calls.back().complete = false;
  }
  return delta;
}

void OutputParser::apply(const StreamDelta& delta) {
  message_.reasoning_content += delta.reasoning_content;
  message_.content += delta.content;
  for (const ToolCallDelta& d : delta.tool_calls) {
    if (d.index == int(message_.tool_calls.size())) {
      message_.tool_calls.push_back({d.id, d.name, "", true, true});
    }
    message_.tool_calls[d.index].arguments += d.arguments;
  }
}

AssistantMessage parse_assistant_output(std::string_view text, const OutputParserOptions& options) {
  OutputParser parser(options);
  parser.push(text);
  parser.finish();
  return parser.result();
}

}  // namespace mlaserve::chat

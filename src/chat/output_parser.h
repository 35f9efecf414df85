#pragma once
// The whole output side of a chat completion: model text in, OpenAI
// assistant message out, streaming (push chunks, get deltas) or at once
// (parse_assistant_output). Reasoning is split off first; the answer goes
// through the tool-call parser. The final message is the sum of the deltas,
// whatever the chunking.
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/reasoning_parser.h"
#include "chat/stream_delta.h"
#include "chat/tool_call_parser.h"

namespace mlaserve::chat {

struct ParsedToolCall {
  std::string id;  // "call_" + 24 random alphanumerics
  std::string name;
  std::string arguments;        // JSON text as the model wrote it (DSML: built from its parameters)
  bool complete = true;         // false when the output ended inside the call
  bool arguments_valid = true;  // the arguments parse as a JSON object
};

struct AssistantMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ParsedToolCall> tool_calls;

  // OpenAI message: content null when there are tool calls and no text;
  // reasoning_content null when empty; tool_calls only when there are some.
  nlohmann::ordered_json to_openai_message() const;
};

// finish_reason for the response: "length" when generation hit max_tokens,
// else "tool_calls" when calls were produced, else "stop".
std::string_view finish_reason(const AssistantMessage& message, bool hit_length_limit);

struct OutputParserOptions {
  std::optional<ReasoningParserKind> reasoning_parser;
  std::optional<ToolParserKind> tool_parser;
  // The request's `tools` array: only these names become calls. Null or
  // empty: any name does.
  nlohmann::ordered_json tools;
  // The prompt opened a thinking block (thinking_enabled() of the request).
  bool thinking = false;
};

// The parsers that go with an encoding (what --reasoning-parser and
// --tool-call-parser default to for that model).
std::optional<ReasoningParserKind> default_reasoning_parser(ChatTemplateKind kind);
ToolParserKind default_tool_parser(ChatTemplateKind kind);

class OutputParser {
 public:
  explicit OutputParser(const OutputParserOptions& options);

  StreamDelta push(std::string_view text);
  // End of output; the returned delta holds whatever was held back.
  StreamDelta finish();
  // The message so far (final after finish()).
  const AssistantMessage& result() const { return message_; }

 private:
  void apply(const StreamDelta& delta);

  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
  AssistantMessage message_;
};

// One-shot: the message for a complete output.
AssistantMessage parse_assistant_output(std::string_view text, const OutputParserOptions& options);

}  // namespace mlaserve::chat

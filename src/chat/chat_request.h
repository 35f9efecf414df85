#pragma once
// An OpenAI chat-completions request body, checked and reduced to what the
// DeepSeek chat encodings read. Every problem is an mlaserve::Error naming
// the message and field, which the server answers with a 400.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace mlaserve::chat {

enum class Role { System, Developer, User, Assistant, Tool };

struct RequestToolCall {
  std::string name;
  // The JSON text of the arguments: a string as the client sent it (OpenAI
  // sends a string), or a JSON object some clients send instead.
  nlohmann::ordered_json arguments;
};

struct ChatMessage {
  Role role = Role::User;
  // Text parts of an array content are joined with "\n"; null only for an
  // assistant message that has tool calls.
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;  // assistant, V3.2 history
  std::vector<RequestToolCall> tool_calls;       // assistant
  bool prefix = false;  // DeepSeek chat-prefix completion: continue this assistant message
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  // the `tools` array as sent, or null when absent/empty
  bool add_generation_prompt = true;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
};

// Parse with nlohmann::ordered_json: tool schemas are rendered into the
// prompt with their keys in the order the client sent them.
ChatRequest parse_chat_request(const nlohmann::ordered_json& body);

}  // namespace mlaserve::chat

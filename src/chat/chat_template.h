#pragma once
// DeepSeek chat encodings in native code: an OpenAI chat request becomes the
// prompt text, byte for byte what the reference Jinja templates render
// (tests/data/chat/README.md says which reference governs which case and
// which reference bugs are corrected).
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "chat/chat_request.h"

namespace mlaserve::chat {

enum class ChatTemplateKind { V3, R1, V31, V32 };

std::string_view chat_template_name(ChatTemplateKind kind);  // "v3", "r1", "v31", "v32"
// Accepts the names above; throws mlaserve::Error listing them otherwise.
ChatTemplateKind parse_chat_template_name(std::string_view name);

// From config.json's architecture (DeepseekV32ForCausalLM means V3.2) and the
// model's name (directory or served name: "R1", "V3.1", "V3.2", any case,
// "." or "-" or "_" or nothing between V3 and the minor version); V3 otherwise.
ChatTemplateKind choose_chat_template(std::string_view architecture, std::string_view model_name);

struct ChatTokens {
  std::string bos = "<｜begin▁of▁sentence｜>";
  std::string eos = "<｜end▁of▁sentence｜>";
};

// Whether the prompt opens a thinking block, so the output starts inside the
// reasoning: always for R1, never for V3; V3.1 reads chat_template_kwargs
// `thinking` (then `enable_thinking`, default off); V3.2 reads
// `enable_thinking` (then `thinking`, default on).
bool thinking_enabled(const ChatRequest& request, ChatTemplateKind kind);

std::string apply_chat_template(const ChatRequest& request, ChatTemplateKind kind, const ChatTokens& tokens);

// Parses and checks the request body first (mlaserve::Error on bad input).
std::string apply_chat_template(const nlohmann::ordered_json& body, ChatTemplateKind kind, const ChatTokens& tokens);

}  // namespace mlaserve::chat

#include "chat/chat_request.h"

#include "core/error.h"

namespace mlaserve::chat {
namespace {

using nlohmann::ordered_json;

Role parse_role(const ordered_json& m, size_t i) {
  MLA_CHECK(m.contains("role") && m["role"].is_string(), "messages[{}]: `role` must be a string", i);
  const std::string& r = m["role"].get_ref<const std::string&>();
  if (r == "system") return Role::System;
  if (r == "developer") return Role::Developer;
  if (r == "user") return Role::User;
  if (r == "assistant") return Role::Assistant;
  if (r == "tool") return Role::Tool;
  fail("messages[{}]: unknown role \"{}\" (expected system, developer, user, assistant or tool)", i, r);
}

// String, null, or an array of {"type": "text", "text": ...} parts.
std::optional<std::string> parse_content(const ordered_json& m, size_t i) {
  if (!m.contains("content") || m["content"].is_null()) return std::nullopt;
  const ordered_json& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  MLA_CHECK(c.is_array(), "messages[{}]: `content` must be a string, null or an array of text parts", i);
  std::string text;
  for (size_t p = 0; p < c.size(); ++p) {
    const ordered_json& part = c[p];
    MLA_CHECK(part.is_object() && part.value("type", "") == "text",
              "messages[{}].content[{}]: only parts of type \"text\" are supported", i, p);
    MLA_CHECK(part.contains("text") && part["text"].is_string(),
              "messages[{}].content[{}]: `text` must be a string", i, p);
    if (p > 0) text += '\n';
    text += part["text"].get_ref<const std::string&>();
  }
  return text;
}

RequestToolCall parse_tool_call(const ordered_json& tc, size_t i, size_t k) {
  MLA_CHECK(tc.is_object(), "messages[{}].tool_calls[{}] must be an object", i, k);
  if (tc.contains("type")) {
    MLA_CHECK(tc["type"] == "function", "messages[{}].tool_calls[{}]: `type` must be \"function\"", i, k);
  }
  MLA_CHECK(tc.contains("function") && tc["function"].is_object(),
            "messages[{}].tool_calls[{}]: `function` must be an object", i, k);
  const ordered_json& f = tc["function"];
  MLA_CHECK(f.contains("name") && f["name"].is_string() && !f["name"].get_ref<const std::string&>().empty(),
            "messages[{}].tool_calls[{}].function: `name` must be a non-empty string", i, k);
  RequestToolCall call;
  call.name = f["name"].get<std::string>();
  if (!f.contains("arguments") || f["arguments"].is_null()) {
    call.arguments = "{}";
  } else {
    MLA_CHECK(f["arguments"].is_string() || f["arguments"].is_object(),
              "messages[{}].tool_calls[{}].function: `arguments` must be a JSON string or an object", i, k);
    call.arguments = f["arguments"];
  }
  return call;
}

ChatMessage parse_message(const ordered_json& m, size_t i) {
  MLA_CHECK(m.is_object(), "messages[{}] must be an object", i);
  ChatMessage msg;
  msg.role = parse_role(m, i);
  msg.content = parse_content(m, i);
  if (msg.role == Role::Assistant) {
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      MLA_CHECK(m["tool_calls"].is_array(), "messages[{}]: `tool_calls` must be an array", i);
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) msg.tool_calls.push_back(parse_tool_call(m["tool_calls"][k], i, k));
    }
    MLA_CHECK(msg.content || !msg.tool_calls.empty(),
              "messages[{}]: an assistant message needs `content` or `tool_calls`", i);
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      MLA_CHECK(m["reasoning_content"].is_string(), "messages[{}]: `reasoning_content` must be a string", i);
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    if (m.contains("prefix")) {
      MLA_CHECK(m["prefix"].is_boolean(), "messages[{}]: `prefix` must be a boolean", i);
      msg.prefix = m["prefix"].get<bool>();
    }
  } else {
    MLA_CHECK(msg.content.has_value(), "messages[{}]: a {} message needs a string `content`", i,
              m["role"].get_ref<const std::string&>());
    MLA_CHECK(!m.contains("tool_calls") || m["tool_calls"].is_null(),
              "messages[{}]: only assistant messages may have `tool_calls`", i);
  }
  if (msg.role == Role::Tool && m.contains("tool_call_id")) {
    MLA_CHECK(m["tool_call_id"].is_string(), "messages[{}]: `tool_call_id` must be a string", i);
  }
  return msg;
}

void check_tools(const ordered_json& tools) {
  MLA_CHECK(tools.is_array(), "`tools` must be an array");
  for (size_t t = 0; t < tools.size(); ++t) {
    const ordered_json& tool = tools[t];
    MLA_CHECK(tool.is_object() && tool.value("type", "function") == "function",
              "tools[{}] must be an object of type \"function\"", t);
    MLA_CHECK(tool.contains("function") && tool["function"].is_object(), "tools[{}]: `function` must be an object", t);
    const ordered_json& f = tool["function"];
    MLA_CHECK(f.contains("name") && f["name"].is_string() && !f["name"].get_ref<const std::string&>().empty(),
              "tools[{}].function: `name` must be a non-empty string", t);
    MLA_CHECK(!f.contains("description") || f["description"].is_string() || f["description"].is_null(),
              "tools[{}].function: `description` must be a string", t);
    MLA_CHECK(!f.contains("parameters") || f["parameters"].is_object() || f["parameters"].is_null(),
              "tools[{}].function: `parameters` must be an object", t);
  }
}

// A tool result answers the tool calls of the assistant message before it
// (possibly after other results); the encodings place it by that position.
void check_tool_results_follow_calls(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != Role::Tool) continue;
    size_t j = i;
    while (j > 0 && messages[j - 1].role == Role::Tool) --j;
    MLA_CHECK(j > 0 && messages[j - 1].role == Role::Assistant && !messages[j - 1].tool_calls.empty(),
              "messages[{}]: a tool message must follow an assistant message with `tool_calls`", i);
    MLA_CHECK(i - j < messages[j - 1].tool_calls.size(),
              "messages[{}]: more tool results than the {} tool call(s) of messages[{}]", i,
              messages[j - 1].tool_calls.size(), j - 1);
  }
  // Every call gets its result before the conversation goes on (as OpenAI
  // requires); only the last message may still wait for its results.
  for (size_t i = 0; i + 1 < messages.size(); ++i) {
    if (messages[i].role != Role::Assistant || messages[i].tool_calls.empty()) continue;
    size_t results = 0;
    while (i + 1 + results < messages.size() && messages[i + 1 + results].role == Role::Tool) ++results;
    MLA_CHECK(results == messages[i].tool_calls.size() || i + 1 + results == messages.size(),
              "messages[{}]: {} tool call(s) but {} tool result message(s) follow", i,
              messages[i].tool_calls.size(), results);
  }
}

}  // namespace

ChatRequest parse_chat_request(const ordered_json& body) {
  MLA_CHECK(body.is_object(), "the request body must be a JSON object");
  MLA_CHECK(body.contains("messages") && body["messages"].is_array() && !body["messages"].empty(),
            "`messages` must be a non-empty array");
  ChatRequest req;
  for (size_t i = 0; i < body["messages"].size(); ++i) req.messages.push_back(parse_message(body["messages"][i], i));
  check_tool_results_follow_calls(req.messages);
  if (body.contains("tools") && !body["tools"].is_null()) {
    check_tools(body["tools"]);
    if (!body["tools"].empty()) req.tools = body["tools"];
  }
  if (body.contains("add_generation_prompt")) {
    MLA_CHECK(body["add_generation_prompt"].is_boolean(), "`add_generation_prompt` must be a boolean");
    req.add_generation_prompt = body["add_generation_prompt"].get<bool>();
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    MLA_CHECK(body["chat_template_kwargs"].is_object(), "`chat_template_kwargs` must be an object");
    req.template_kwargs = body["chat_template_kwargs"];
  }
  return req;
}

}  // namespace mlaserve::chat

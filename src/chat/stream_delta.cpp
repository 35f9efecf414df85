#include "chat/stream_delta.h"

namespace mlaserve::chat {

void StreamDelta::add_arguments(int index, std::string_view text) {
  if (text.empty()) return;
  if (tool_calls.empty() || tool_calls.back().index != index) tool_calls.push_back({index, "", "", ""});
  tool_calls.back().arguments += text;
}

nlohmann::ordered_json StreamDelta::to_openai_delta() const {
  nlohmann::ordered_json d = nlohmann::ordered_json::object();
  if (!reasoning_content.empty()) d["reasoning_content"] = reasoning_content;
  if (!content.empty()) d["content"] = content;
  if (!tool_calls.empty()) {
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    for (const ToolCallDelta& c : tool_calls) {
      nlohmann::ordered_json call = {{"index", c.index}};
      nlohmann::ordered_json function = nlohmann::ordered_json::object();
      if (!c.id.empty()) {
        call["id"] = c.id;
        call["type"] = "function";
        function["name"] = c.name;
      }
      function["arguments"] = c.arguments;
      call["function"] = function;
      calls.push_back(call);
    }
    d["tool_calls"] = calls;
  }
  return d;
}

}  // namespace mlaserve::chat

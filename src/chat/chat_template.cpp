#include "chat/chat_template.h"

#include <cctype>
#include <optional>

#include "chat/deepseek_markers.h"
#include "chat/json_text.h"
#include "core/error.h"

namespace mlaserve::chat {

using nlohmann::ordered_json;
namespace mk = markers;

std::string_view chat_template_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::V3: return "v3";
    case ChatTemplateKind::R1: return "r1";
    case ChatTemplateKind::V31: return "v31";
    case ChatTemplateKind::V32: return "v32";
  }
  return "?";
}

ChatTemplateKind parse_chat_template_name(std::string_view name) {
  for (auto kind : {ChatTemplateKind::V3, ChatTemplateKind::R1, ChatTemplateKind::V31, ChatTemplateKind::V32}) {
    if (chat_template_name(kind) == name) return kind;
  }
  fail("unknown chat template \"{}\" (expected v3, r1, v31 or v32)", name);
}

ChatTemplateKind choose_chat_template(std::string_view architecture, std::string_view model_name) {
  if (architecture == "DeepseekV32ForCausalLM") return ChatTemplateKind::V32;
  // Lower-case and drop separators, so "DeepSeek-V3.1-Terminus" -> "deepseekv31terminus".
  std::string name;
  for (char c : model_name) {
    if (c == '.' || c == '-' || c == '_' || c == ' ') continue;
    name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (name.find("v32") != std::string::npos) return ChatTemplateKind::V32;
  if (name.find("v31") != std::string::npos) return ChatTemplateKind::V31;
  if (name.find("r1") != std::string::npos) return ChatTemplateKind::R1;
  return ChatTemplateKind::V3;
}

namespace {

// Jinja's truth value of a template variable (Python truthiness).
bool truthy(const ordered_json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_null()) return false;
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>() != 0;
  if (v.is_number_float()) return v.get<double>() != 0.0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return false;
}

std::optional<bool> kwarg(const ChatRequest& r, const char* name) {
  if (!r.template_kwargs.contains(name)) return std::nullopt;
  return truthy(r.template_kwargs[name]);
}

std::string_view content_of(const ChatMessage& m) { return m.content ? std::string_view(*m.content) : ""; }

// R1 history keeps only the answer: the text after the last </think>.
std::string_view after_last_think_end(std::string_view text) {
  size_t pos = text.rfind(mk::kThinkEnd);
  return pos == std::string_view::npos ? text : text.substr(pos + mk::kThinkEnd.size());
}

// V3.1 history: the text after the first </think>.
std::string_view after_first_think_end(std::string_view text) {
  size_t pos = text.find(mk::kThinkEnd);
  return pos == std::string_view::npos ? text : text.substr(pos + mk::kThinkEnd.size());
}

// Arguments as the JSON text the model writes: a string as given, an object
// as tojson renders it.
std::string arguments_text(const RequestToolCall& call) {
  return call.arguments.is_string() ? call.arguments.get<std::string>() : python_json_dumps(call.arguments);
}

// System messages joined by a blank line (R1-Distill keeps only the last).
std::string system_prompt(const ChatRequest& r, bool last_only) {
  std::string out;
  bool first = true;
  for (const ChatMessage& m : r.messages) {
    if (m.role != Role::System) continue;
    if (last_only) {
      out = content_of(m);
    } else {
      if (!first) out += "\n\n";
      out += content_of(m);
    }
    first = false;
  }
  return out;
}

const ordered_json& tool_function(const ordered_json& tool) { return tool["function"]; }

std::string string_field(const ordered_json& obj, const char* key) {
  return obj.contains(key) && obj[key].is_string() ? obj[key].get<std::string>() : std::string();
}

// --- V3 and R1 ---------------------------------------------------------------

// SGLang's V3/R1 tool templates: the call format, then each tool schema.
std::string v3_tool_prompt(const ordered_json& tools) {
  std::string out =
      "You are a helpful assistant with tool calling capabilities. When a tool call is needed, you MUST use the "
      "following format to issue the call:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
      "FUNCTION_NAME\n```json\n{\"param1\": \"value1\", \"param2\": \"value2\"}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>\n\nMake sure the JSON is valid.## Tools\n\n### Function\n\nYou have the following "
      "functions available:\n\n";
  for (const ordered_json& tool : tools) out += "\n```json\n" + python_json_dumps(tool) + "\n```\n";
  return out;
}

// The differences between the four V3-family references.
struct V3FamilyStyle {
  bool assistant_tag_in_user_turn;  // SGLang layout: "<｜User｜>...<｜Assistant｜>" (with tools)
  bool strip_reasoning;             // R1: history keeps the text after the last </think>
  bool last_system_only;            // R1-Distill: only the last system message counts
  bool results_preamble;            // SGLang V3: a sentence before the tool outputs
  std::string_view generation_prompt;
};

V3FamilyStyle v3_family_style(ChatTemplateKind kind, bool has_tools) {
  if (kind == ChatTemplateKind::R1) {
    if (has_tools) return {true, true, false, false, mk::kAssistant};
    return {false, true, true, false, "<｜Assistant｜><think>\n"};
  }
  if (has_tools) return {true, false, false, true, mk::kAssistant};
  return {false, false, false, false, mk::kAssistant};
}

std::string render_v3_family(const ChatRequest& r, ChatTemplateKind kind, const ChatTokens& tok) {
  const bool has_tools = !r.tools.is_null();
  const V3FamilyStyle style = v3_family_style(kind, has_tools);
  std::string system = system_prompt(r, style.last_system_only);
  if (has_tools) system += "\n\n" + v3_tool_prompt(r.tools);

  std::string out = tok.bos + system;
  bool in_tool_outputs = false;
  bool first_output = true;
  bool last_was_user = false;
  for (const ChatMessage& m : r.messages) {
    switch (m.role) {
      case Role::System:
      case Role::Developer:
        break;
      case Role::User:
        in_tool_outputs = false;
        last_was_user = true;
        out += mk::kUser;
        out += content_of(m);
        if (style.assistant_tag_in_user_turn) out += mk::kAssistant;
        break;
      case Role::Assistant: {
        last_was_user = false;
        std::string_view content = content_of(m);
        if (style.strip_reasoning && (!in_tool_outputs || style.assistant_tag_in_user_turn)) {
          content = after_last_think_end(content);
        }
        if (in_tool_outputs) {
          out += mk::kToolOutputsEnd;
        } else if (!style.assistant_tag_in_user_turn) {
          out += mk::kAssistant;
        }
        in_tool_outputs = false;
        out += content;
        if (!m.tool_calls.empty()) {
          first_output = true;
          out += mk::kToolCallsBegin;
          for (size_t k = 0; k < m.tool_calls.size(); ++k) {
            if (k > 0) out += '\n';
            out += mk::kToolCallBegin;
            out += "function";
            out += mk::kToolSep;
            out += m.tool_calls[k].name + "\n```json\n" + arguments_text(m.tool_calls[k]) + "\n```";
            out += mk::kToolCallEnd;
          }
          out += mk::kToolCallsEnd;
        }
        out += tok.eos;
        break;
      }
      case Role::Tool:
        last_was_user = false;
        in_tool_outputs = true;
        if (first_output) {
          if (style.results_preamble) {
            out += "Use the results below to formulate an answer to the user question unless additional "
                   "information is needed.";
          }
          out += mk::kToolOutputsBegin;
          first_output = false;
        } else {
          out += '\n';
        }
        out += mk::kToolOutputBegin;
        out += content_of(m);
        out += mk::kToolOutputEnd;
        break;
    }
  }
  if (in_tool_outputs) out += mk::kToolOutputsEnd;
  const bool prompt_already_open = style.assistant_tag_in_user_turn && last_was_user;
  if (r.add_generation_prompt && !in_tool_outputs && !prompt_already_open) out += style.generation_prompt;
  return out;
}

// --- V3.1 ----------------------------------------------------------------------

std::string v31_tool_prompt(const ordered_json& tools) {
  std::string out = "## Tools\nYou have access to the following tools:\n";
  for (const ordered_json& tool : tools) {
    const ordered_json& f = tool_function(tool);
    const ordered_json params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : ordered_json::object();
    out += "\n### " + string_field(f, "name") + "\nDescription: " + string_field(f, "description") +
           "\n\nParameters: " + python_json_dumps(params) + "\n";
  }
  out +=
      "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
      "tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}"
      "<｜tool▁calls▁end｜>\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n"
      "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
      "- For multiple tool calls, chain them directly without separators or spaces\n";
  return out;
}

std::string render_v31(const ChatRequest& r, const ChatTokens& tok) {
  const bool thinking = thinking_enabled(r, ChatTemplateKind::V31);
  std::string system = system_prompt(r, false);
  if (!r.tools.is_null()) system += "\n\n" + v31_tool_prompt(r.tools);

  std::string out = tok.bos + system;
  bool in_tool_outputs = false;
  bool last_was_user = false;
  for (const ChatMessage& m : r.messages) {
    switch (m.role) {
      case Role::System:
      case Role::Developer:
        break;
      case Role::User:
        in_tool_outputs = false;
        last_was_user = true;
        out += mk::kUser;
        out += content_of(m);
        break;
      case Role::Assistant:
        if (!m.tool_calls.empty()) {
          if (last_was_user) {
            out += mk::kAssistant;
            out += mk::kThinkEnd;
          }
          out += content_of(m);
          out += mk::kToolCallsBegin;
          for (const RequestToolCall& call : m.tool_calls) {
            out += mk::kToolCallBegin;
            out += call.name;
            out += mk::kToolSep;
            out += arguments_text(call);
            out += mk::kToolCallEnd;
          }
          out += mk::kToolCallsEnd;
        } else {
          if (last_was_user) {
            out += mk::kAssistant;
            out += m.prefix && thinking ? mk::kThinkStart : mk::kThinkEnd;
          }
          out += in_tool_outputs ? content_of(m) : after_first_think_end(content_of(m));
        }
        last_was_user = false;
        in_tool_outputs = false;
        out += tok.eos;
        break;
      case Role::Tool:
        last_was_user = false;
        in_tool_outputs = true;
        out += mk::kToolOutputBegin;
        out += content_of(m);
        out += mk::kToolOutputEnd;
        break;
    }
  }
  if (r.add_generation_prompt && last_was_user && !in_tool_outputs) {
    out += mk::kAssistant;
    out += thinking ? mk::kThinkStart : mk::kThinkEnd;
  }
  return out;
}

// --- V3.2 ----------------------------------------------------------------------

std::string v32_tool_prompt(const ordered_json& tools) {
  std::string out =
      "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\n"
      "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of "
      "your reply to the user:\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
      "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
      "...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n...\n</｜DSML｜invoke>\n"
      "</｜DSML｜function_calls>\n\nString and scalar parameters should be specified as is without any escaping "
      "or quotes, while lists and objects should use JSON format. The \"string\" attribute should be set to "
      "\"true\" for string type parameters and \"false\" for other types (numbers, booleans, arrays, objects).\n\n"
      "If the thinking_mode is enabled, then after function results you should strongly consider outputting a "
      "thinking block. Here is an example:\n\n<｜DSML｜function_calls>\n...\n</｜DSML｜function_calls>\n\n"
      "<function_results>\n...\n</function_results>\n\n<think>...thinking about results</think>\n\n"
      "Here are the functions available in JSONSchema format:\n<functions>";
  for (const ordered_json& tool : tools) out += "\n" + python_json_dumps(tool);
  out += "\n</functions>";
  return out;
}

// DSML parameters of one call: strings as they are, other values as JSON.
std::string dsml_parameters(const RequestToolCall& call, size_t message_index) {
  ordered_json args = call.arguments;
  if (args.is_string()) {
    args = ordered_json::parse(call.arguments.get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
  }
  MLA_CHECK(args.is_object(), "messages[{}]: the arguments of tool call \"{}\" must be a JSON object for V3.2",
            message_index, call.name);
  std::string out;
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += '\n';
    first = false;
    out += mk::kDsmlParameterBegin;
    out += key + "\" string=\"" + (value.is_string() ? "true" : "false") + "\">";
    out += value.is_string() ? value.get<std::string>() : python_json_dumps(value);
    out += mk::kDsmlParameterEnd;
  }
  return out;
}

std::string render_v32(const ChatRequest& r, const ChatTokens& tok) {
  const bool thinking = thinking_enabled(r, ChatTemplateKind::V32);
  const bool has_tools = !r.tools.is_null();
  const auto& msgs = r.messages;
  ptrdiff_t last_user = -1;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (msgs[i].role == Role::User || msgs[i].role == Role::Developer) last_user = ptrdiff_t(i);
  }
  // User and tool-result turns end with the assistant prefix of the next
  // turn: <think> when it is the turn to answer in thinking mode.
  auto open_assistant = [&](size_t i, bool at_or_after) {
    bool answer_turn = at_or_after ? ptrdiff_t(i) >= last_user : ptrdiff_t(i) == last_user;
    return answer_turn && thinking ? mk::kThinkStart : mk::kThinkEnd;
  };

  std::string out = tok.bos;
  const bool has_system = msgs[0].role == Role::System;
  if (has_system) {
    out += content_of(msgs[0]);
    if (has_tools) out += "\n\n" + v32_tool_prompt(r.tools) + "\n";
  } else if (msgs[0].role != Role::Developer && has_tools) {
    out += v32_tool_prompt(r.tools) + "\n";
  }
  for (size_t i = has_system ? 1 : 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    switch (m.role) {
      case Role::System:
        break;
      case Role::Developer:
        out += mk::kUser;
        if (has_tools) out += "\n\n" + v32_tool_prompt(r.tools) + "\n\n";
        out += "\n# The user's message is: ";
        out += content_of(m);
        out += mk::kAssistant;
        out += open_assistant(i, false);
        break;
      case Role::User:
        out += mk::kUser;
        out += content_of(m);
        out += mk::kAssistant;
        out += open_assistant(i, false);
        break;
      case Role::Tool: {
        size_t call_msg = i;
        while (msgs[call_msg - 1].role == Role::Tool) --call_msg;
        --call_msg;  // the assistant message whose calls these results answer
        const size_t order = i - call_msg;
        if (order == 1) out += "\n\n<function_results>";
        out += "\n<result>";
        out += content_of(m);
        out += "</result>";
        if (order == msgs[call_msg].tool_calls.size()) {
          out += "\n</function_results>\n\n";
          out += open_assistant(i, true);
        }
        break;
      }
      case Role::Assistant:
        if (thinking && ptrdiff_t(i) > last_user) {
          out += m.reasoning_content.value_or("");
          out += mk::kThinkEnd;
        }
        out += content_of(m);
        if (!m.tool_calls.empty()) {
          out += "\n\n";
          out += mk::kDsmlFunctionCallsBegin;
          for (const RequestToolCall& call : m.tool_calls) {
            out += "\n";
            out += mk::kDsmlInvokeBegin;
            out += call.name + "\">\n" + dsml_parameters(call, i) + "\n";
            out += mk::kDsmlInvokeEnd;
          }
          out += "\n";
          out += mk::kDsmlFunctionCallsEnd;
        }
        out += tok.eos;
        break;
    }
  }
  // No generation prompt: the last user or tool-result turn already ends
  // with the assistant prefix (the reference's extra empty user turn is a bug).
  return out;
}

}  // namespace

bool thinking_enabled(const ChatRequest& r, ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::V3: return false;
    case ChatTemplateKind::R1: return true;
    case ChatTemplateKind::V31: return kwarg(r, "thinking").value_or(kwarg(r, "enable_thinking").value_or(false));
    case ChatTemplateKind::V32: return kwarg(r, "enable_thinking").value_or(kwarg(r, "thinking").value_or(true));
  }
  return false;
}

std::string apply_chat_template(const ChatRequest& request, ChatTemplateKind kind, const ChatTokens& tokens) {
  MLA_CHECK(!request.messages.empty(), "`messages` must be a non-empty array");
  if (kind == ChatTemplateKind::V32) return render_v32(request, tokens);
  // Developer messages are system messages for the encodings without a developer turn.
  ChatRequest r = request;
  for (ChatMessage& m : r.messages) {
    if (m.role == Role::Developer) m.role = Role::System;
  }
  return kind == ChatTemplateKind::V31 ? render_v31(r, tokens) : render_v3_family(r, kind, tokens);
}

std::string apply_chat_template(const ordered_json& body, ChatTemplateKind kind, const ChatTokens& tokens) {
  return apply_chat_template(parse_chat_request(body), kind, tokens);
}

}  // namespace mlaserve::chat

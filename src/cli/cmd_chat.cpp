// mlaserve apply-chat-template / parse-output: the chat layer on its own,
// for debugging prompts and model outputs without a server.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>

#include "chat/chat_template.h"
#include "chat/model_chat_settings.h"
#include "chat/output_parser.h"
#include "cli/command.h"
#include "core/error.h"

namespace mlaserve::cli {
namespace {

using nlohmann::ordered_json;

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ordered_json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", where, e.what());
  }
}

struct ApplyChatTemplateOptions {
  std::string model_path;
  std::string chat_template;
};

int run_apply_chat_template(const ApplyChatTemplateOptions& o) {
  chat::ChatTemplateKind kind = o.chat_template.empty() ? chat::detect_chat_template(o.model_path)
                                                        : chat::parse_chat_template_name(o.chat_template);
  ordered_json body = parse_json_text(read_all(std::cin), "stdin");
  std::string prompt = chat::apply_chat_template(body, kind, chat::load_chat_tokens(o.model_path));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

CommandRegistration apply_chat_template_command(
    "apply-chat-template",
    "render an OpenAI chat request (JSON on stdin) into the model's prompt text, printed exactly",
    [](CLI::App& app) {
      auto o = std::make_shared<ApplyChatTemplateOptions>();
      app.add_option("--model-path", o->model_path, "checkpoint directory (config.json, tokenizer_config.json)")
          ->required();
      app.add_option("--chat-template", o->chat_template, "v3, r1, v31 or v32 (default: chosen from the model)")
          ->check(CLI::IsMember({"v3", "r1", "v31", "v32"}));
      return [=]() { return run_apply_chat_template(*o); };
    });

struct ParseOutputOptions {
  std::string reasoning_parser;
  std::string tool_call_parser;
  std::string tools_file;
  bool thinking = false;
};

// A tools file holds the `tools` array, or a whole request body with one.
ordered_json load_tools(const std::string& path) {
  std::ifstream f(path);
  MLA_CHECK(f.good(), "--tools: cannot open {}", path);
  ordered_json j = parse_json_text(read_all(f), path);
  if (j.is_object() && j.contains("tools")) j = j["tools"];
  MLA_CHECK(j.is_array(), "{}: expected a JSON array of tools (or an object with `tools`)", path);
  return j;
}

int run_parse_output(const ParseOutputOptions& o) {
  chat::OutputParserOptions options;
  if (!o.reasoning_parser.empty()) options.reasoning_parser = chat::parse_reasoning_parser_name(o.reasoning_parser);
  if (!o.tool_call_parser.empty()) options.tool_parser = chat::parse_tool_parser_name(o.tool_call_parser);
  if (!o.tools_file.empty()) options.tools = load_tools(o.tools_file);
  options.thinking = o.thinking;
  chat::AssistantMessage message = chat::parse_assistant_output(read_all(std::cin), options);
  std::string out = message.to_openai_message().dump(2) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

CommandRegistration parse_output_command(
    "parse-output",
    "split raw model output (stdin) into the OpenAI assistant message: content, reasoning_content, tool_calls",
    [](CLI::App& app) {
      auto o = std::make_shared<ParseOutputOptions>();
      app.add_option("--reasoning-parser", o->reasoning_parser, "deepseek-r1 or deepseek-v3 (default: none)")
          ->check(CLI::IsMember({"deepseek-r1", "deepseek-v3"}));
      app.add_option("--tool-call-parser", o->tool_call_parser, "deepseekv3, deepseekv31 or deepseekv32 (default: none)")
          ->check(CLI::IsMember({"deepseekv3", "deepseekv31", "deepseekv32"}));
      app.add_option("--tools", o->tools_file, "JSON file with the request's tools; only these names become calls");
      app.add_flag("--thinking", o->thinking,
                   "the prompt turned thinking on (V3.1/V3.2 chat_template_kwargs), so deepseek-v3 output starts "
                   "in the reasoning");
      return [=]() { return run_parse_output(*o); };
    });

}  // namespace
}  // namespace mlaserve::cli

// The native chat encodings against the reference renders in
// tests/data/chat/rendered.json (made by tools/reference/render_chat_templates.py
// with jinja2, not by this code).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "chat/chat_template.h"
#include "core/error.h"

namespace mlaserve::chat {
namespace {

using nlohmann::ordered_json;

ordered_json load_json(const std::string& name) {
  std::ifstream f(std::string(MLASERVE_SOURCE_DIR) + "/tests/data/chat/" + name);
  EXPECT_TRUE(f) << name;
  std::stringstream ss;
  ss << f.rdbuf();
  return ordered_json::parse(ss.str());
}

TEST(ChatTemplate, ByteIdenticalToReferenceRenders) {
  ordered_json cases = load_json("conversations.json");
  ordered_json rendered = load_json("rendered.json");
  std::map<std::string, ordered_json> expected;
  for (const auto& r : rendered) expected[r["name"].get<std::string>()] = r;
  ASSERT_GE(cases.size(), 40u);
  std::map<std::string, int> per_kind;
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.count(name)) << "no reference render; rerun tools/reference/render_chat_templates.py";
    ChatTemplateKind kind = parse_chat_template_name(c["template"].get<std::string>());
    std::string got = apply_chat_template(c["request"], kind, ChatTokens{});
    EXPECT_EQ(got, expected[name]["expected"].get<std::string>()) << "source: " << expected[name]["source"];
    ++per_kind[c["template"].get<std::string>()];
  }
  for (const char* kind : {"v3", "r1", "v31", "v32"}) EXPECT_GE(per_kind[kind], 8) << kind;
}

TEST(ChatTemplate, ChoosesEncodingFromModel) {
  EXPECT_EQ(choose_chat_template("DeepseekV32ForCausalLM", "anything"), ChatTemplateKind::V32);
  EXPECT_EQ(choose_chat_template("DeepseekV3ForCausalLM", "deepseek-ai/DeepSeek-V3.2-Exp"), ChatTemplateKind::V32);
  EXPECT_EQ(choose_chat_template("DeepseekV3ForCausalLM", "DeepSeek-V3.1-Terminus"), ChatTemplateKind::V31);
  EXPECT_EQ(choose_chat_template("DeepseekV3ForCausalLM", "/models/deepseek_v3_1"), ChatTemplateKind::V31);
  EXPECT_EQ(choose_chat_template("DeepseekV3ForCausalLM", "DeepSeek-R1-0528"), ChatTemplateKind::R1);
  EXPECT_EQ(choose_chat_template("DeepseekV3ForCausalLM", "DeepSeek-V3-0324"), ChatTemplateKind::V3);
  EXPECT_EQ(choose_chat_template("DeepseekV2ForCausalLM", "tiny"), ChatTemplateKind::V3);
  EXPECT_EQ(parse_chat_template_name("r1"), ChatTemplateKind::R1);
  EXPECT_THROW(parse_chat_template_name("v4"), Error);
}

TEST(ChatTemplate, ThinkingSwitches) {
  auto req = [](const char* kwargs) {
    return parse_chat_request(ordered_json::parse(std::string(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":)") + kwargs + "}"));
  };
  EXPECT_FALSE(thinking_enabled(req("{}"), ChatTemplateKind::V31));
  EXPECT_TRUE(thinking_enabled(req(R"({"thinking":true})"), ChatTemplateKind::V31));
  EXPECT_TRUE(thinking_enabled(req(R"({"enable_thinking":true})"), ChatTemplateKind::V31));
  EXPECT_TRUE(thinking_enabled(req("{}"), ChatTemplateKind::V32));
  EXPECT_FALSE(thinking_enabled(req(R"({"thinking":false})"), ChatTemplateKind::V32));
  EXPECT_FALSE(thinking_enabled(req(R"({"enable_thinking":false,"thinking":true})"), ChatTemplateKind::V32));
  EXPECT_TRUE(thinking_enabled(req("{}"), ChatTemplateKind::R1));
  EXPECT_FALSE(thinking_enabled(req(R"({"thinking":true})"), ChatTemplateKind::V3));
}

// Each invalid body throws mlaserve::Error whose message names the problem.
TEST(ChatTemplate, InvalidRequestsAreClearErrors) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"([])", "must be a JSON object"},
      {R"({})", "`messages` must be a non-empty array"},
      {R"({"messages":[]})", "`messages` must be a non-empty array"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "unknown role \"robot\""},
      {R"({"messages":[{"content":"x"}]})", "messages[0]: `role` must be a string"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0]: `content` must be a string"},
      {R"({"messages":[{"role":"user"}]})", "messages[0]: a user message needs a string `content`"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
       "messages[0].content[0]: only parts of type \"text\""},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null}]})",
       "messages[1]: an assistant message needs `content` or `tool_calls`"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"r","tool_call_id":"c"}]})",
       "messages[1]: a tool message must follow an assistant message with `tool_calls`"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"a"},{"role":"tool","content":"b"}]})",
       "messages[3]: more tool results than the 1 tool call(s) of messages[1]"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}},{"type":"function","function":{"name":"g","arguments":"{}"}}]},{"role":"tool","content":"a"},{"role":"user","content":"y"}]})",
       "messages[1]: 2 tool call(s) but 1 tool result message(s) follow"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"r","tool_call_id":7}]})",
       "messages[1]: `tool_call_id` must be a string"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}]})",
       "messages[1].tool_calls[0].function: `name` must be a non-empty string"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":[1]}}]}]})",
       "`arguments` must be a JSON string or an object"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{"a":1}})", "`tools` must be an array"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"description":"d"}}]})",
       "tools[0].function: `name` must be a non-empty string"},
      {R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"yes"})", "`add_generation_prompt` must be a boolean"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]})", "`chat_template_kwargs` must be an object"},
  };
  for (const auto& [body, message] : bad) {
    SCOPED_TRACE(body);
    try {
      apply_chat_template(ordered_json::parse(body), ChatTemplateKind::V3, ChatTokens{});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(ChatTemplate, V32NeedsObjectArguments) {
  auto body = ordered_json::parse(
      R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"[1, 2]"}}]}]})");
  EXPECT_THROW(apply_chat_template(body, ChatTemplateKind::V32, ChatTokens{}), Error);
  EXPECT_NO_THROW(apply_chat_template(body, ChatTemplateKind::V31, ChatTokens{}));
}

}  // namespace
}  // namespace mlaserve::chat

// Reasoning and tool-call parsing. The samples in
// tests/data/chat/parser_samples.json carry expected messages written by
// hand from the format definitions. Every sample is also parsed as a stream
// split into two and three chunks at every pair of byte positions: the
// streamed deltas must add up to the one-shot message.
#include <gtest/gtest.h>

#include <fstream>
#include <ostream>
#include <tuple>
#include <sstream>

#include "chat/output_parser.h"
#include "core/error.h"

namespace mlaserve::chat {
namespace {

using nlohmann::ordered_json;

struct Sample {
  std::string family;
  std::string name;
  std::string text;
  OutputParserOptions options;
  ordered_json expected;
};

std::vector<Sample> load_samples() {
  std::ifstream f(std::string(MLASERVE_SOURCE_DIR) + "/tests/data/chat/parser_samples.json");
  EXPECT_TRUE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<Sample> out;
  for (const auto& j : ordered_json::parse(ss.str())) {
    Sample s{j["family"], j["name"], j["text"], {}, j["expected"]};
    if (s.family.starts_with("deepseek-")) s.options.reasoning_parser = parse_reasoning_parser_name(s.family);
    if (j.contains("tool_parser")) s.options.tool_parser = parse_tool_parser_name(j["tool_parser"].get<std::string>());
    if (j.contains("tools") && j["tools"].is_array()) {
      s.options.tools = ordered_json::array();
      for (const auto& name : j["tools"]) s.options.tools.push_back({{"type", "function"}, {"function", {{"name", name}}}});
    }
    s.options.thinking = j.value("thinking", false);
    out.push_back(std::move(s));
  }
  return out;
}

// The message as the test compares it: ids left out (random), flags in.
struct Flat {
  std::string content, reasoning_content;
  std::vector<std::tuple<std::string, std::string, bool, bool>> tool_calls;  // name, arguments, complete, valid
  bool operator==(const Flat&) const = default;
};

Flat flatten(const AssistantMessage& m) {
  Flat f{m.content, m.reasoning_content, {}};
  for (const auto& c : m.tool_calls) f.tool_calls.emplace_back(c.name, c.arguments, c.complete, c.arguments_valid);
  return f;
}

std::ostream& operator<<(std::ostream& os, const Flat& f) {
  ordered_json calls = ordered_json::array();
  for (const auto& [name, args, complete, valid] : f.tool_calls) {
    calls.push_back({{"name", name}, {"arguments", args}, {"complete", complete}, {"valid", valid}});
  }
  return os << ordered_json{{"content", f.content}, {"reasoning_content", f.reasoning_content}, {"tool_calls", calls}}.dump();
}

Flat from_expected(const ordered_json& e) {
  Flat f{e["content"], e["reasoning_content"], {}};
  for (const auto& c : e["tool_calls"]) f.tool_calls.emplace_back(c["name"], c["arguments"], c["complete"], c["valid"]);
  return f;
}

// Streams `chunks` and adds the deltas up independently of OutputParser's
// own bookkeeping, checking the OpenAI delta rules on the way.
Flat stream(const Sample& s, std::initializer_list<std::string_view> chunks) {
  OutputParser parser(s.options);
  AssistantMessage sum;
  auto add = [&](const StreamDelta& d) {
    sum.content += d.content;
    sum.reasoning_content += d.reasoning_content;
    for (const ToolCallDelta& t : d.tool_calls) {
      if (t.index == int(sum.tool_calls.size())) {
        // A call's first delta has its id and name.
        if (!t.id.starts_with("call_") || t.id.size() != 29 || t.name.empty()) ADD_FAILURE() << "bad first delta";
        sum.tool_calls.push_back({t.id, t.name, "", true, true});
      } else if (t.index > int(sum.tool_calls.size()) || !t.id.empty() || !t.name.empty()) {
        ADD_FAILURE() << "bad argument delta for call " << t.index;
        continue;
      }
      sum.tool_calls[t.index].arguments += t.arguments;
    }
  };
  for (std::string_view c : chunks) add(parser.push(c));
  add(parser.finish());
  const AssistantMessage& result = parser.result();
  if (sum.tool_calls.size() == result.tool_calls.size()) {
    for (size_t i = 0; i < sum.tool_calls.size(); ++i) {
      if (sum.tool_calls[i].id != result.tool_calls[i].id) ADD_FAILURE() << "result id differs from streamed id";
      sum.tool_calls[i].complete = result.tool_calls[i].complete;
      sum.tool_calls[i].arguments_valid = result.tool_calls[i].arguments_valid;
    }
  }
  return flatten(sum);
}

TEST(OutputParser, EnoughSamplesPerParser) {
  std::map<std::string, int> per_family;
  for (const Sample& s : load_samples()) ++per_family[s.family];
  for (const char* family : {"deepseek-r1", "deepseek-v3", "deepseekv3", "deepseekv31", "deepseekv32"}) {
    EXPECT_GE(per_family[family], 20) << family;
  }
}

TEST(OutputParser, OneShotMatchesHandWrittenExpectations) {
  for (const Sample& s : load_samples()) {
    SCOPED_TRACE(s.family + "/" + s.name);
    EXPECT_EQ(flatten(parse_assistant_output(s.text, s.options)), from_expected(s.expected));
  }
}

TEST(OutputParser, EverySplitIntoTwoOrThreeChunksGivesTheSameMessage) {
  for (const Sample& s : load_samples()) {
    SCOPED_TRACE(s.family + "/" + s.name);
    const Flat whole = flatten(parse_assistant_output(s.text, s.options));
    const std::string_view text = s.text;
    const size_t n = text.size();
    for (size_t i = 0; i <= n; ++i) {
      ASSERT_EQ(stream(s, {text.substr(0, i), text.substr(i)}), whole) << "split at " << i;
      for (size_t j = i + 1; j < n; ++j) {
        ASSERT_EQ(stream(s, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}), whole)
            << "split at " << i << ", " << j;
      }
    }
  }
}

TEST(OutputParser, ByteAtATime) {
  for (const Sample& s : load_samples()) {
    SCOPED_TRACE(s.family + "/" + s.name);
    OutputParser parser(s.options);
    for (char c : s.text) parser.push(std::string_view(&c, 1));
    parser.finish();
    EXPECT_EQ(flatten(parser.result()), flatten(parse_assistant_output(s.text, s.options)));
  }
}

TEST(OutputParser, ToolCallDeltasStreamNameFirstThenArguments) {
  OutputParserOptions o;
  o.tool_parser = ToolParserKind::DeepSeekV31;
  OutputParser p(o);
  StreamDelta d1 = p.push("Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>");
  EXPECT_EQ(d1.content, "Sure.");
  ASSERT_EQ(d1.tool_calls.size(), 1u);
  EXPECT_EQ(d1.tool_calls[0].index, 0);
  EXPECT_EQ(d1.tool_calls[0].name, "get_time");
  EXPECT_EQ(d1.tool_calls[0].arguments, "");
  StreamDelta d2 = p.push("{\"timezone\": \"UTC\"}<｜tool▁call");
  ASSERT_EQ(d2.tool_calls.size(), 1u);
  EXPECT_TRUE(d2.tool_calls[0].id.empty());
  EXPECT_EQ(d2.tool_calls[0].arguments, "{\"timezone\": \"UTC\"}");
  StreamDelta d3 = p.push("▁end｜><｜tool▁calls▁end｜>");
  EXPECT_TRUE(d3.empty());
  p.finish();
  ordered_json delta = d1.to_openai_delta();
  EXPECT_EQ(delta["content"], "Sure.");
  EXPECT_EQ(delta["tool_calls"][0]["type"], "function");
  EXPECT_EQ(delta["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(p.result().to_openai_message()["content"], "Sure.");
  EXPECT_EQ(finish_reason(p.result(), false), "tool_calls");
  EXPECT_EQ(finish_reason(p.result(), true), "length");
}

TEST(OutputParser, OpenAIMessageShape) {
  OutputParserOptions o;
  o.reasoning_parser = ReasoningParserKind::DeepSeekR1;
  o.tool_parser = ToolParserKind::DeepSeekV3;
  AssistantMessage m = parse_assistant_output(
      "Think.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      o);
  ordered_json j = m.to_openai_message();
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_TRUE(j["content"].is_null());
  EXPECT_EQ(j["reasoning_content"], "Think.");
  EXPECT_EQ(j["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(finish_reason(m, false), "tool_calls");

  AssistantMessage plain = parse_assistant_output("Hello", OutputParserOptions{});
  ordered_json pj = plain.to_openai_message();
  EXPECT_EQ(pj["content"], "Hello");
  EXPECT_TRUE(pj["reasoning_content"].is_null());
  EXPECT_FALSE(pj.contains("tool_calls"));
  EXPECT_EQ(finish_reason(plain, false), "stop");
}

TEST(OutputParser, ParserNamesAndDefaults) {
  EXPECT_EQ(parse_tool_parser_name("deepseekv32"), ToolParserKind::DeepSeekV32);
  EXPECT_THROW(parse_tool_parser_name("hermes"), Error);
  EXPECT_THROW(parse_reasoning_parser_name("qwen3"), Error);
  EXPECT_EQ(default_tool_parser(ChatTemplateKind::R1), ToolParserKind::DeepSeekV3);
  EXPECT_EQ(default_tool_parser(ChatTemplateKind::V31), ToolParserKind::DeepSeekV31);
  EXPECT_EQ(default_reasoning_parser(ChatTemplateKind::V32), ReasoningParserKind::DeepSeekV3);
  EXPECT_FALSE(default_reasoning_parser(ChatTemplateKind::V3).has_value());
}

}  // namespace
}  // namespace mlaserve::chat

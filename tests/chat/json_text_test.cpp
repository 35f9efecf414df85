// The expected strings are what Python 3's json.dumps(x, ensure_ascii=False)
// prints for the same values (checked with python3, not with this code).
#include <gtest/gtest.h>

#include "chat/json_text.h"

namespace mlaserve::chat {
namespace {

TEST(JsonText, MatchesPythonJsonDumps) {
  auto v = nlohmann::ordered_json::parse(
      "{\"b\": [1, 2.5, true, null, 1e-05, 1e16, -0.0], \"a\": \"\\u00e9\\\"\\\\\\n\\t\\u0001\\u007f\\ud83d\\ude00\", "
      "\"e\": {}, \"f\": []}");
  EXPECT_EQ(python_json_dumps(v),
            "{\"b\": [1, 2.5, true, null, 1e-05, 1e+16, -0.0], \"a\": \"\xC3\xA9\\\"\\\\\\n\\t\\u0001\x7F\xF0\x9F\x98\x80\", "
            "\"e\": {}, \"f\": []}");
}

TEST(JsonText, EscapingIsBytewiseSoSplitUtf8StaysWhole) {
  std::string out;
  const std::string text = "\xC3\xA9\"";
  append_json_escaped(out, text.substr(0, 1));
  append_json_escaped(out, text.substr(1));
  EXPECT_EQ(out, "\xC3\xA9\\\"");
}

}  // namespace
}  // namespace mlaserve::chat

#pragma once
// DeepSeek V3.2 DSML tool calls (--tool-call-parser deepseekv32), the format
// of the official V3.2 template:
//   <｜DSML｜function_calls>
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="KEY" string="true">text as is</｜DSML｜parameter>
//   <｜DSML｜parameter name="KEY" string="false">JSON value</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   </｜DSML｜function_calls>
// The parameters become the JSON object {"KEY": value, ...} (string values
// JSON-escaped as they stream, other values copied as the JSON they are).
#include "chat/tool_call_parser.h"

namespace mlaserve::chat {

class DsmlToolCallParser : public ToolCallParser {
 public:
  explicit DsmlToolCallParser(std::vector<std::string> tool_names);

 protected:
  Header parse_call_header(std::string_view text) const override;
  void begin_arguments() override;
  ArgumentsStep parse_arguments(std::string_view text, bool at_end, std::string& args) override;

 private:
  enum class Part { Body, ParameterHeader, ParameterValue };
  Part part_ = Part::Body;
  int parameters_ = 0;
  bool value_is_string_ = false;
};

}  // namespace mlaserve::chat

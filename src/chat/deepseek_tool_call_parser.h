#pragma once
// DeepSeek V3 / R1 and V3.1 tool calls (--tool-call-parser deepseekv3 | deepseekv31):
//   V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//         (calls joined by "\n") <｜tool▁calls▁end｜>
//   V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
// ARGS is the JSON text of the arguments, passed on verbatim.
#include "chat/tool_call_parser.h"

namespace mlaserve::chat {

class DeepSeekToolCallParser : public ToolCallParser {
 public:
  enum class Format { V3, V31 };
  DeepSeekToolCallParser(Format format, std::vector<std::string> tool_names);

 protected:
  Header parse_call_header(std::string_view text) const override;
  ArgumentsStep parse_arguments(std::string_view text, bool at_end, std::string& args) override;

 private:
  Format format_;
};

}  // namespace mlaserve::chat

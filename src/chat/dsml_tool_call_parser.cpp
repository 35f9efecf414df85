#include "chat/dsml_tool_call_parser.h"

#include "chat/deepseek_markers.h"
#include "chat/json_text.h"
#include "chat/marker_scan.h"

namespace mlaserve::chat {

namespace mk = markers;

namespace {

constexpr std::string_view kNameEnd = "\">";
constexpr std::string_view kStringTrue = "\" string=\"true\">";
constexpr std::string_view kStringFalse = "\" string=\"false\">";
constexpr size_t kMaxParameterHeaderBytes = 512;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

DsmlToolCallParser::DsmlToolCallParser(std::vector<std::string> tool_names)
    : ToolCallParser({mk::kDsmlFunctionCallsBegin, mk::kDsmlInvokeBegin, mk::kDsmlFunctionCallsEnd},
                     std::move(tool_names)) {}

ToolCallParser::Header DsmlToolCallParser::parse_call_header(std::string_view text) const {
  Header h;
  size_t end = text.find(kNameEnd);
  if (end == std::string_view::npos) {
    h.status = text.find('\n') == std::string_view::npos ? HeaderStatus::NeedMore : HeaderStatus::Invalid;
    return h;
  }
  h.status = HeaderStatus::Done;
  h.name = text.substr(0, end);
  h.consumed = end + kNameEnd.size();
  return h;
}

void DsmlToolCallParser::begin_arguments() {
  part_ = Part::Body;
  parameters_ = 0;
}

ToolCallParser::ArgumentsStep DsmlToolCallParser::parse_arguments(std::string_view text, bool at_end,
                                                                 std::string& args) {
  size_t pos = 0;
  auto close_object = [&] { args += parameters_ == 0 ? "{}" : "}"; };
  for (;;) {
    std::string_view rest = text.substr(pos);
    switch (part_) {
      case Part::Body: {
        while (!rest.empty() && is_space(rest.front())) {
          rest.remove_prefix(1);
          ++pos;
        }
        if (rest.empty()) return {ArgumentsStatus::Continue, pos};
        if (rest.starts_with(mk::kDsmlParameterBegin)) {
          pos += mk::kDsmlParameterBegin.size();
          part_ = Part::ParameterHeader;
          break;
        }
        if (rest.starts_with(mk::kDsmlInvokeEnd)) {
          close_object();
          return {ArgumentsStatus::CallEnd, pos + mk::kDsmlInvokeEnd.size()};
        }
        if (rest.starts_with(mk::kDsmlFunctionCallsEnd)) {  // invoke left open
          close_object();
          return {ArgumentsStatus::BlockEnd, pos + mk::kDsmlFunctionCallsEnd.size()};
        }
        if (is_marker_prefix(rest, {mk::kDsmlParameterBegin, mk::kDsmlInvokeEnd, mk::kDsmlFunctionCallsEnd})) {
          return {ArgumentsStatus::Continue, pos};
        }
        // Junk inside the invoke: end the call here, the rest is content.
        close_object();
        return {ArgumentsStatus::Invalid, pos};
      }
      case Part::ParameterHeader: {
        // Checked the same way whether or not the closing quote has arrived,
        // so the outcome does not depend on chunking.
        size_t quote = rest.find('"');
        std::string_view key = rest.substr(0, quote);
        if (key.size() > kMaxParameterHeaderBytes || key.find('\n') != std::string_view::npos) {
          close_object();
          return {ArgumentsStatus::Invalid, pos};
        }
        if (quote == std::string_view::npos) return {ArgumentsStatus::Continue, pos};
        std::string_view attrs = rest.substr(quote);
        bool is_string = attrs.starts_with(kStringTrue);
        if (!is_string && !attrs.starts_with(kStringFalse)) {
          if (is_marker_prefix(attrs, {kStringTrue, kStringFalse})) return {ArgumentsStatus::Continue, pos};
          close_object();
          return {ArgumentsStatus::Invalid, pos};
        }
        args += parameters_ == 0 ? "{\"" : ", \"";
        append_json_escaped(args, key);
        args += is_string ? "\": \"" : "\": ";
        ++parameters_;
        value_is_string_ = is_string;
        pos += quote + (is_string ? kStringTrue.size() : kStringFalse.size());
        part_ = Part::ParameterValue;
        break;
      }
      case Part::ParameterValue: {
        size_t end = rest.find(mk::kDsmlParameterEnd);
        size_t take = end;
        if (end == std::string_view::npos) {
          take = rest.size() - (at_end ? 0 : partial_marker_suffix(rest, {mk::kDsmlParameterEnd}));
        }
        if (value_is_string_) {
          append_json_escaped(args, rest.substr(0, take));
        } else {
          args.append(rest.substr(0, take));
        }
        pos += take;
        if (end == std::string_view::npos) return {ArgumentsStatus::Continue, pos};
        if (value_is_string_) args += '"';
        pos += mk::kDsmlParameterEnd.size();
        part_ = Part::Body;
        break;
      }
    }
  }
}

}  // namespace mlaserve::chat

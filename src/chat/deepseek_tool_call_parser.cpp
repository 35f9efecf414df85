#include "chat/deepseek_tool_call_parser.h"

#include "chat/deepseek_markers.h"
#include "chat/marker_scan.h"

namespace mlaserve::chat {

namespace mk = markers;

namespace {

constexpr std::string_view kV3ArgumentsOpen = "```json\n";
// V3 arguments end with a closing fence right before the call's end marker.
constexpr std::string_view kV3ArgumentsClose = "\n```<｜tool▁call▁end｜>";

}  // namespace

DeepSeekToolCallParser::DeepSeekToolCallParser(Format format, std::vector<std::string> tool_names)
    : ToolCallParser({mk::kToolCallsBegin, mk::kToolCallBegin, mk::kToolCallsEnd}, std::move(tool_names)),
      format_(format) {}

ToolCallParser::Header DeepSeekToolCallParser::parse_call_header(std::string_view text) const {
  Header h;
  size_t sep = text.find(mk::kToolSep);
  if (sep == std::string_view::npos) {
    // Neither the type nor a name spans lines.
    h.status = text.find('\n') == std::string_view::npos ? HeaderStatus::NeedMore : HeaderStatus::Invalid;
    return h;
  }
  if (format_ == Format::V31) {
    h.status = HeaderStatus::Done;
    h.name = text.substr(0, sep);
    h.consumed = sep + mk::kToolSep.size();
    return h;
  }
  if (text.substr(0, sep) != "function") {
    h.status = HeaderStatus::Invalid;
    return h;
  }
  std::string_view rest = text.substr(sep + mk::kToolSep.size());
  size_t newline = rest.find('\n');
  if (newline == std::string_view::npos) return h;  // name still coming
  std::string_view fence = rest.substr(newline + 1);
  if (fence.size() < kV3ArgumentsOpen.size()) {
    h.status = kV3ArgumentsOpen.starts_with(fence) ? HeaderStatus::NeedMore : HeaderStatus::Invalid;
    return h;
  }
  if (!fence.starts_with(kV3ArgumentsOpen)) {
    h.status = HeaderStatus::Invalid;
    return h;
  }
  h.status = HeaderStatus::Done;
  h.name = rest.substr(0, newline);
  h.consumed = sep + mk::kToolSep.size() + newline + 1 + kV3ArgumentsOpen.size();
  return h;
}

ToolCallParser::ArgumentsStep DeepSeekToolCallParser::parse_arguments(std::string_view text, bool at_end,
                                                                     std::string& args) {
  // A call ends at its end marker (V3: after the closing fence, or without
  // it); a block end right after the arguments closes both.
  const std::string_view close = format_ == Format::V3 ? kV3ArgumentsClose : mk::kToolCallEnd;
  auto hit = find_first_marker(text, {close, mk::kToolCallEnd, mk::kToolCallsEnd});
  if (hit) {
    args.append(text.substr(0, hit->pos));
    ArgumentsStatus status = hit->marker == mk::kToolCallsEnd ? ArgumentsStatus::BlockEnd : ArgumentsStatus::CallEnd;
    return {status, hit->pos + hit->marker.size()};
  }
  size_t keep = at_end ? 0 : partial_marker_suffix(text, {close, mk::kToolCallEnd, mk::kToolCallsEnd});
  args.append(text.substr(0, text.size() - keep));
  return {ArgumentsStatus::Continue, text.size() - keep};
}

}  // namespace mlaserve::chat

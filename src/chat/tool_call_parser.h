#pragma once
// Turns DeepSeek tool-call text into OpenAI tool calls, chunk by chunk.
//
// Text before (and after) a tool-call block is content. A call is committed
// once its name is complete and valid (a known tool when a tool list is
// given): its first delta carries id and name, then its arguments stream as
// they arrive (as OpenAI streams them). Until that point the call's text is
// held back; if the block turns out malformed (stray markers, a bad or
// unknown name, junk between calls) that text and everything after it is
// returned as content and parsing stops. Arguments already streamed cannot
// be taken back: truncated or invalid arguments stay in their call, which
// OutputParser marks incomplete / not valid JSON. Decisions depend only on
// the text, never on where chunks split it, so streaming and one-shot
// parsing give the same message.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/stream_delta.h"

namespace mlaserve::chat {

enum class ToolParserKind { DeepSeekV3, DeepSeekV31, DeepSeekV32 };

std::string_view tool_parser_name(ToolParserKind kind);  // "deepseekv3", "deepseekv31", "deepseekv32"
// Throws mlaserve::Error listing the names above otherwise.
ToolParserKind parse_tool_parser_name(std::string_view name);

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;

  // Feeds answer text; appends what is decided to `out` (content, tool-call deltas).
  void push(std::string_view text, StreamDelta& out);
  // End of output: releases held text. A call still open is left truncated.
  void finish(StreamDelta& out);
  // After finish(): whether the last call was cut off before its end marker.
  bool last_call_truncated() const { return state_ == State::Arguments; }

 protected:
  struct BlockMarkers {
    std::string_view block_begin;  // opens a block of calls
    std::string_view call_begin;   // opens one call (also accepted without block_begin)
    std::string_view block_end;
  };
  enum class HeaderStatus { NeedMore, Invalid, Done };
  struct Header {
    HeaderStatus status = HeaderStatus::NeedMore;
    std::string name;
    size_t consumed = 0;
  };
  enum class ArgumentsStatus { Continue, CallEnd, BlockEnd, Invalid };
  struct ArgumentsStep {
    ArgumentsStatus status = ArgumentsStatus::Continue;
    size_t consumed = 0;
  };

  // tool_names empty: any well-formed name is accepted.
  ToolCallParser(BlockMarkers markers, std::vector<std::string> tool_names);

  // The call's header after call_begin, up to where its arguments start.
  virtual Header parse_call_header(std::string_view text) const = 0;
  // Called when a call is committed, before its arguments.
  virtual void begin_arguments() {}
  // Consumes argument text from the start of `text`, appending the
  // arguments' JSON text to `args`. at_end: no more text will come; release
  // everything held back. Invalid: stop; text from `consumed` on is content.
  virtual ArgumentsStep parse_arguments(std::string_view text, bool at_end, std::string& args) = 0;

 private:
  enum class State { Text, BetweenCalls, CallHeader, Arguments, Failed };
  bool step(bool at_end, StreamDelta& out);
  void fail(StreamDelta& out);
  bool known_tool(const std::string& name) const;

  BlockMarkers markers_;
  std::vector<std::string> tool_names_;
  State state_ = State::Text;
  std::string pending_;  // received, not yet decided
  std::string held_;     // consumed block text not yet committed to a call
  int calls_ = 0;
  int calls_in_block_ = 0;
};

// tool_names: the request's tools (unknown names are not calls); empty
// accepts any name.
std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolParserKind kind, std::vector<std::string> tool_names);

}  // namespace mlaserve::chat

#pragma once
// What one step of output parsing adds to the assistant message: the pieces
// an OpenAI streaming chunk carries in `choices[].delta`.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mlaserve::chat {

// A tool call's first delta carries its id and name (arguments may be
// empty); later deltas for the same index carry argument text only.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct StreamDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  // Appends argument text, merging it into the previous delta of the same call.
  void add_arguments(int index, std::string_view text);
  // The OpenAI `delta` object: only the fields that have something.
  nlohmann::ordered_json to_openai_delta() const;
};

}  // namespace mlaserve::chat

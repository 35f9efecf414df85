#pragma once
// The special strings of DeepSeek's chat format, shared by the encoders
// (chat_template.cpp) and the output parsers. The bars are U+FF5C and the
// spaces U+2581, as in tokenizer.json's added tokens.
#include <string_view>

namespace mlaserve::chat::markers {

inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// V3 / R1 / V3.1 tool calls and results.
inline constexpr std::string_view kToolCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kToolCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kToolCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kToolCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kToolOutputsBegin = "<｜tool▁outputs▁begin｜>";
inline constexpr std::string_view kToolOutputsEnd = "<｜tool▁outputs▁end｜>";
inline constexpr std::string_view kToolOutputBegin = "<｜tool▁output▁begin｜>";
inline constexpr std::string_view kToolOutputEnd = "<｜tool▁output▁end｜>";

// V3.2 DSML tool calls (official DeepSeek-V3.2 template).
inline constexpr std::string_view kDsmlFunctionCallsBegin = "<｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlFunctionCallsEnd = "</｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlInvokeBegin = "<｜DSML｜invoke name=\"";
inline constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParameterBegin = "<｜DSML｜parameter name=\"";
inline constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";

}  // namespace mlaserve::chat::markers

#pragma once
// Splits DeepSeek output into reasoning and answer, chunk by chunk.
//
// DeepSeek prompts open the thinking block themselves (R1 always; V3.1 and
// V3.2 when thinking is on), so the output starts inside the reasoning with
// no <think> tag (one the model repeats anyway is dropped) and the answer
// starts after </think>. Without </think> everything is reasoning. The
// answer's leading whitespace (R1 writes "</think>\n\n") is dropped. Tags
// split across chunks are held back until the next chunk decides, so any
// chunking of the same text gives the same result.
#include <string>
#include <string_view>

namespace mlaserve::chat {

enum class ReasoningParserKind { DeepSeekR1, DeepSeekV3 };

std::string_view reasoning_parser_name(ReasoningParserKind kind);  // "deepseek-r1", "deepseek-v3"
// "deepseek-r1" | "deepseek-v3"; throws mlaserve::Error otherwise.
ReasoningParserKind parse_reasoning_parser_name(std::string_view name);

// Whether output under this parser starts inside the reasoning: R1 always,
// V3 (V3.1/V3.2) when the request turned thinking on.
bool starts_in_reasoning(ReasoningParserKind kind, bool thinking_enabled);

class ReasoningParser {
 public:
  // starts_in_reasoning false: all text is content, passed through as is.
  explicit ReasoningParser(bool starts_in_reasoning);

  // Appends the newly decided text to `reasoning` and `content`.
  void push(std::string_view text, std::string& reasoning, std::string& content);
  // End of output: releases anything held back.
  void finish(std::string& reasoning, std::string& content);

 private:
  enum class State { Opening, Reasoning, AnswerStart, Answer };
  void step(bool at_end, std::string& reasoning, std::string& content);

  State state_;
  std::string pending_;
};

}  // namespace mlaserve::chat

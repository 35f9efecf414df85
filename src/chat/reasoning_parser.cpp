#include "chat/reasoning_parser.h"

#include "chat/deepseek_markers.h"
#include "chat/marker_scan.h"
#include "core/error.h"

namespace mlaserve::chat {

namespace mk = markers;

std::string_view reasoning_parser_name(ReasoningParserKind kind) {
  return kind == ReasoningParserKind::DeepSeekR1 ? "deepseek-r1" : "deepseek-v3";
}

ReasoningParserKind parse_reasoning_parser_name(std::string_view name) {
  if (name == "deepseek-r1") return ReasoningParserKind::DeepSeekR1;
  if (name == "deepseek-v3") return ReasoningParserKind::DeepSeekV3;
  fail("unknown reasoning parser \"{}\" (expected deepseek-r1 or deepseek-v3)", name);
}

bool starts_in_reasoning(ReasoningParserKind kind, bool thinking_enabled) {
  return kind == ReasoningParserKind::DeepSeekR1 || thinking_enabled;
}

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::Opening : State::Answer) {}

void ReasoningParser::push(std::string_view text, std::string& reasoning, std::string& content) {
  pending_ += text;
  step(false, reasoning, content);
}

void ReasoningParser::finish(std::string& reasoning, std::string& content) { step(true, reasoning, content); }

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

void ReasoningParser::step(bool at_end, std::string& reasoning, std::string& content) {
  for (;;) {
    switch (state_) {
      case State::Opening:
        // A <think> the model writes itself, right at the start.
        if (pending_.starts_with(mk::kThinkStart)) {
          pending_.erase(0, mk::kThinkStart.size());
        } else if (!at_end && mk::kThinkStart.starts_with(pending_)) {
          return;  // empty, or could still become <think>
        }
        state_ = State::Reasoning;
        break;
      case State::Reasoning: {
        size_t end = pending_.find(mk::kThinkEnd);
        if (end == std::string::npos) {
          size_t keep = at_end ? 0 : partial_marker_suffix(pending_, {mk::kThinkEnd});
          reasoning.append(pending_, 0, pending_.size() - keep);
          pending_.erase(0, pending_.size() - keep);
          return;
        }
        reasoning.append(pending_, 0, end);
        pending_.erase(0, end + mk::kThinkEnd.size());
        state_ = State::AnswerStart;
        break;
      }
      case State::AnswerStart: {
        size_t first = 0;
        while (first < pending_.size() && is_space(pending_[first])) ++first;
        pending_.erase(0, first);
        if (pending_.empty()) return;
        state_ = State::Answer;
        break;
      }
      case State::Answer:
        content += pending_;
        pending_.clear();
        return;
    }
  }
}

}  // namespace mlaserve::chat

#include "chat/tool_call_parser.h"

#include <algorithm>
#include <random>

#include "chat/deepseek_tool_call_parser.h"
#include "chat/dsml_tool_call_parser.h"
#include "chat/marker_scan.h"
#include "core/error.h"

namespace mlaserve::chat {

std::string_view tool_parser_name(ToolParserKind kind) {
  switch (kind) {
    case ToolParserKind::DeepSeekV3: return "deepseekv3";
    case ToolParserKind::DeepSeekV31: return "deepseekv31";
    case ToolParserKind::DeepSeekV32: return "deepseekv32";
  }
  return "?";
}

ToolParserKind parse_tool_parser_name(std::string_view name) {
  for (auto kind : {ToolParserKind::DeepSeekV3, ToolParserKind::DeepSeekV31, ToolParserKind::DeepSeekV32}) {
    if (tool_parser_name(kind) == name) return kind;
  }
  fail("unknown tool-call parser \"{}\" (expected deepseekv3, deepseekv31 or deepseekv32)", name);
}

std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolParserKind kind, std::vector<std::string> tool_names) {
  switch (kind) {
    case ToolParserKind::DeepSeekV3:
      return std::make_unique<DeepSeekToolCallParser>(DeepSeekToolCallParser::Format::V3, std::move(tool_names));
    case ToolParserKind::DeepSeekV31:
      return std::make_unique<DeepSeekToolCallParser>(DeepSeekToolCallParser::Format::V31, std::move(tool_names));
    case ToolParserKind::DeepSeekV32:
      return std::make_unique<DsmlToolCallParser>(std::move(tool_names));
  }
  fail("unknown tool-call parser kind");
}

namespace {

// Longest header we wait for before calling the block malformed: names are
// short, and an unbounded wait would hold back all later text.
constexpr size_t kMaxHeaderBytes = 512;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// A name the model could mean as a function name: no whitespace, quotes or
// markup, which only appear when the format is broken.
bool plausible_name(const std::string& name) {
  if (name.empty() || name.size() > 256) return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    return is_space(c) || c == '<' || c == '>' || c == '"' || static_cast<unsigned char>(c) < 0x20;
  });
}

std::string new_call_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

}  // namespace

ToolCallParser::ToolCallParser(BlockMarkers markers, std::vector<std::string> tool_names)
    : markers_(markers), tool_names_(std::move(tool_names)) {}

bool ToolCallParser::known_tool(const std::string& name) const {
  return tool_names_.empty() || std::find(tool_names_.begin(), tool_names_.end(), name) != tool_names_.end();
}

void ToolCallParser::push(std::string_view text, StreamDelta& out) {
  pending_ += text;
  while (step(false, out)) {
  }
}

void ToolCallParser::finish(StreamDelta& out) {
  while (step(true, out)) {
  }
  switch (state_) {
    case State::Text:
    case State::Failed:
      out.content += pending_;
      break;
    case State::BetweenCalls:
    case State::CallHeader: {
      // An unfinished block with no call to show for it: its text is content.
      std::string rest = held_ + pending_;
      bool only_space = std::all_of(rest.begin(), rest.end(), is_space);
      if (!(only_space && calls_in_block_ > 0)) out.content += rest;
      break;
    }
    case State::Arguments:
      break;  // parse_arguments released what it held; the call stays truncated
  }
  pending_.clear();
  held_.clear();
}

void ToolCallParser::fail(StreamDelta& out) {
  out.content += held_ + pending_;
  held_.clear();
  pending_.clear();
  state_ = State::Failed;
}

// One decision on the pending text; false when nothing more can be decided now.
bool ToolCallParser::step(bool at_end, StreamDelta& out) {
  switch (state_) {
    case State::Text: {
      auto hit = find_first_marker(pending_, {markers_.block_begin, markers_.call_begin});
      if (!hit) {
        size_t keep = at_end ? 0 : partial_marker_suffix(pending_, {markers_.block_begin, markers_.call_begin});
        out.content.append(pending_, 0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return false;
      }
      out.content.append(pending_, 0, hit->pos);
      held_ = hit->marker;
      pending_.erase(0, hit->pos + hit->marker.size());
      calls_in_block_ = 0;
      state_ = hit->marker == markers_.call_begin ? State::CallHeader : State::BetweenCalls;
      return true;
    }
    case State::BetweenCalls: {
      size_t first = 0;
      while (first < pending_.size() && is_space(pending_[first])) ++first;
      held_.append(pending_, 0, first);
      pending_.erase(0, first);
      if (pending_.empty()) return false;
      if (pending_.starts_with(markers_.call_begin)) {
        held_ += markers_.call_begin;
        pending_.erase(0, markers_.call_begin.size());
        state_ = State::CallHeader;
        return true;
      }
      if (pending_.starts_with(markers_.block_end)) {
        pending_.erase(0, markers_.block_end.size());
        if (calls_in_block_ == 0) out.content += held_ + std::string(markers_.block_end);  // an empty block is stray text
        held_.clear();
        state_ = State::Text;
        return true;
      }
      if (!at_end && is_marker_prefix(pending_, {markers_.call_begin, markers_.block_end})) return false;
      if (at_end) return false;
      fail(out);
      return false;
    }
    case State::CallHeader: {
      Header h = parse_call_header(pending_);
      if (h.status == HeaderStatus::NeedMore) {
        if (pending_.size() <= kMaxHeaderBytes || at_end) return false;
        h.status = HeaderStatus::Invalid;
      }
      if (h.status == HeaderStatus::Invalid || !plausible_name(h.name) || !known_tool(h.name)) {
        fail(out);
        return false;
      }
      out.tool_calls.push_back({calls_, new_call_id(), h.name, ""});
      ++calls_;
      ++calls_in_block_;
      held_.clear();
      pending_.erase(0, h.consumed);
      begin_arguments();
      state_ = State::Arguments;
      return true;
    }
    case State::Arguments: {
      std::string args;
      ArgumentsStep s = parse_arguments(pending_, at_end, args);
      out.add_arguments(calls_ - 1, args);
      pending_.erase(0, s.consumed);
      switch (s.status) {
        case ArgumentsStatus::Continue:
          return false;
        case ArgumentsStatus::CallEnd:
          state_ = State::BetweenCalls;
          return true;
        case ArgumentsStatus::BlockEnd:
          state_ = State::Text;
          return true;
        case ArgumentsStatus::Invalid:
          fail(out);
          return false;
      }
      return false;
    }
    case State::Failed:
      out.content += pending_;
      pending_.clear();
      return false;
  }
  return false;
}

}  // namespace mlaserve::chat

#include "tokenizer/regex_pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mlaserve::tokenizer {

struct RegexPreTokenizer::CompiledPattern {
  pcre2_code* code = nullptr;
  ~CompiledPattern() { pcre2_code_free(code); }
};

namespace {

// Per-thread match state: the compiled patterns are shared and read-only, the
// match data and JIT stack are not.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  // Long runs (100 KB of whitespace) can need more than the default 32 KB
  // of JIT stack for the backtracking in \s+(?!\S).
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& match_scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

RegexPreTokenizer RegexPreTokenizer::from_json(const nlohmann::json& spec) {
  MLA_CHECK(spec.is_object(), "tokenizer.json: pre_tokenizer must be an object");
  std::vector<nlohmann::json> steps;
  if (spec.value("type", "") == "Sequence") {
    for (const auto& step : spec.at("pretokenizers")) steps.push_back(step);
  } else {
    steps.push_back(spec);
  }
  RegexPreTokenizer result;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& step = steps[i];
    const std::string type = step.value("type", "");
    if (type == "ByteLevel") {
      // Only as the last step, and only as the byte mapping (done by the BPE
      // model here); its GPT-2 regex and prefix space are not implemented.
      MLA_CHECK(i + 1 == steps.size(), "tokenizer.json: ByteLevel pre-tokenizer must be the last step");
      MLA_CHECK(!step.value("use_regex", true), "tokenizer.json: ByteLevel pre-tokenizer with use_regex=true is not supported");
      MLA_CHECK(!step.value("add_prefix_space", false), "tokenizer.json: ByteLevel pre-tokenizer with add_prefix_space=true is not supported");
      continue;
    }
    MLA_CHECK(type == "Split", "tokenizer.json: pre-tokenizer step {} has unsupported type '{}'", i, type);
    MLA_CHECK(step.value("behavior", "") == "Isolated",
              "tokenizer.json: Split step {} has behavior '{}'; only Isolated is supported", i,
              step.value("behavior", ""));
    MLA_CHECK(!step.value("invert", false), "tokenizer.json: Split step {} with invert=true is not supported", i);
    const auto& pattern_spec = step.at("pattern");
    MLA_CHECK(pattern_spec.contains("Regex"), "tokenizer.json: Split step {} must have a Regex pattern", i);
    const std::string pattern = pattern_spec.at("Regex").get<std::string>();

    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    MLA_CHECK(code != nullptr, "tokenizer.json: Split step {} pattern does not compile at offset {}: {}", i,
              error_offset, pcre2_message(error_code));
    auto compiled = std::make_shared<CompiledPattern>();
    compiled->code = code;
    // Without JIT support PCRE2 falls back to its interpreter: same matches, slower.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    result.steps_.push_back(std::move(compiled));
  }
  MLA_CHECK(!result.steps_.empty(), "tokenizer.json: pre_tokenizer has no Split step");
  return result;
}

void RegexPreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (!text.empty()) split_step(0, text, pieces);
}

void RegexPreTokenizer::split_step(size_t step, std::string_view text, std::vector<std::string_view>& pieces) const {
  if (step == steps_.size()) {
    pieces.push_back(text);
    return;
  }
  MatchScratch& scratch = match_scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t emitted = 0;  // end of the last piece handed on
  size_t start = 0;
  while (start < text.size()) {
    // Each piece is its own subject, as in Hugging Face: lookarounds never
    // see the neighbouring pieces.
    const int rc = pcre2_match(steps_[step]->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, scratch.data,
                               scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MLA_CHECK(rc >= 0, "pre-tokenizer regex {} failed on a {}-byte piece: {}", step, text.size(), pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
    const size_t match_begin = ovector[0], match_end = ovector[1];
    if (match_begin > emitted) split_step(step + 1, text.substr(emitted, match_begin - emitted), pieces);
    if (match_end > match_begin) {
      split_step(step + 1, text.substr(match_begin, match_end - match_begin), pieces);
      emitted = match_end;
      start = match_end;
    } else {
      // An empty match cuts nothing; step over one character.
      start = match_begin + 1;
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  if (emitted < text.size()) split_step(step + 1, text.substr(emitted), pieces);
}

}  // namespace mlaserve::tokenizer

#include "tokenizer/incremental_detokenizer.h"

#include "tokenizer/utf8.h"

namespace mlaserve::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  std::string text;
  const size_t consumed = append_utf8_lossy(pending_, /*final=*/false, text);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDetokenizer::flush() {
  std::string text;
  append_utf8_lossy(pending_, /*final=*/true, text);
  pending_.clear();
  return text;
}

}  // namespace mlaserve::tokenizer

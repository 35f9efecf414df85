#pragma once
// The pre-tokenizer of tokenizer.json when it is a Sequence of Split steps
// (regex pattern, "Isolated" behaviour) followed by a ByteLevel step that does
// not split (use_regex false): every step cuts each piece into its regex
// matches and the text between them, all kept as pieces.
//
// The patterns are compiled verbatim from the file with PCRE2 (UTF, UCP,
// JIT). Hugging Face runs them with Oniguruma; for these patterns both
// engines agree (Unicode general categories for \p{..}, the White_Space set,
// U+0085 included, for \s), which tests/tokenizer checks against Hugging Face.
#include <memory>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mlaserve::tokenizer {

class RegexPreTokenizer {
 public:
  // `spec` is tokenizer.json's "pre_tokenizer" object; anything other than
  // the shape described above fails with a message naming what is unsupported.
  static RegexPreTokenizer from_json(const nlohmann::json& spec);

  // Appends the pieces of `text` (valid UTF-8), in order, to `pieces`; the
  // pieces are views into `text`, never empty. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct CompiledPattern;
  void split_step(size_t step, std::string_view text, std::vector<std::string_view>& pieces) const;

  std::vector<std::shared_ptr<const CompiledPattern>> steps_;
};

}  // namespace mlaserve::tokenizer

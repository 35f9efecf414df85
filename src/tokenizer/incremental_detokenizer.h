#pragma once
// Streaming decode: feed ids one at a time and get the text they complete.
// The concatenation of every push() and the final flush() equals
// Tokenizer::decode of all the ids, byte for byte: bytes of a character cut
// between tokens are held back until it completes (or is known to be invalid,
// then U+FFFD exactly where the one-shot decode puts it).
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace mlaserve::tokenizer {

class IncrementalDetokenizer {
 public:
  // Keeps a (cheap, shared) copy of the tokenizer.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Newly completed text; never ends inside a UTF-8 character.
  std::string push(int32_t id);
  // Whatever is still held back (an unfinished character becomes U+FFFD).
  std::string flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // at most 3 bytes of an unfinished character
};

}  // namespace mlaserve::tokenizer

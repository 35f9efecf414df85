#pragma once
// Token ids -> text, incrementally, for one sequence. The runtime only needs
// this much of a tokenizer; the tokenizer layer's IncrementalDetokenizer is
// adapted to it, and unit tests use a table of strings.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace mlaserve::runtime {

class TextStream {
 public:
  virtual ~TextStream() = default;
  // Newly completed text (never a broken UTF-8 sequence).
  virtual std::string push(int32_t id) = 0;
  virtual std::string flush() = 0;
};

using TextStreamFactory = std::function<std::unique_ptr<TextStream>(bool skip_special_tokens)>;

}  // namespace mlaserve::runtime

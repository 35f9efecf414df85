#include "runtime/detokenizer_stream.h"

#include "tokenizer/incremental_detokenizer.h"

namespace mlaserve::runtime {

namespace {

class DetokenizerStream : public TextStream {
 public:
  DetokenizerStream(const tokenizer::Tokenizer& tok, bool skip_special) : detok_(tok, skip_special) {}
  std::string push(int32_t id) override { return detok_.push(id); }
  std::string flush() override { return detok_.flush(); }

 private:
  tokenizer::IncrementalDetokenizer detok_;
};

}  // namespace

TextStreamFactory detokenizer_streams(const tokenizer::Tokenizer& tok) {
  return [tok](bool skip_special) { return std::make_unique<DetokenizerStream>(tok, skip_special); };
}

}  // namespace mlaserve::runtime

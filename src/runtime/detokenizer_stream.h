#pragma once
// The tokenizer's incremental detokenizer as the runtime's TextStream.
#include "runtime/text_stream.h"
#include "tokenizer/tokenizer.h"

namespace mlaserve::runtime {

TextStreamFactory detokenizer_streams(const tokenizer::Tokenizer& tok);

}  // namespace mlaserve::runtime

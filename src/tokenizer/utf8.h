#pragma once
// UTF-8 validation and lossy decoding with the exact replacement rule Hugging
// Face tokenizers uses (Rust's String::from_utf8_lossy): each maximal invalid
// subpart (Unicode 15, ch. 3, "U+FFFD Substitution of Maximal Subparts")
// becomes one U+FFFD.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mlaserve::tokenizer {

// Byte offset of the first byte that does not start a well-formed UTF-8
// sequence (overlong forms, surrogates, code points above U+10FFFF and
// truncated sequences are all ill-formed), or nullopt if `text` is valid.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// Appends `bytes` to `out` as valid UTF-8, replacing ill-formed subparts with
// U+FFFD. With `final` false it stops before a trailing sequence that is
// incomplete but could still become valid with more bytes, so a stream can
// be decoded chunk by chunk into exactly the one-shot result. Returns the
// number of bytes consumed.
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out);

}  // namespace mlaserve::tokenizer

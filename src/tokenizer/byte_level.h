#pragma once
// GPT-2's byte-level alphabet: every byte is spelled as one printable Unicode
// character so that BPE vocabularies are plain strings ("Ġ" is the space).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace mlaserve::tokenizer {

// Code point that spells each byte in vocabulary strings.
const std::array<char32_t, 256>& byte_to_code_point();

// Byte spelled by a code point of the alphabet, or -1 for any other code point.
int code_point_to_byte(char32_t cp);

// UTF-8 spelling of one byte in the byte-level alphabet ("Ġ" for 0x20).
std::string byte_level_spelling(uint8_t byte);

// The bytes a vocabulary string stands for, as Hugging Face's ByteLevel
// decoder computes them: if every character is in the alphabet, the bytes
// they spell; otherwise (added tokens such as "<｜User｜>") the string's own
// UTF-8 bytes, unchanged.
std::string byte_level_decode(std::string_view token);

}  // namespace mlaserve::tokenizer

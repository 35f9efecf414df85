#include "tokenizer/byte_level.h"

#include <gtest/gtest.h>

#include <set>

namespace mlaserve::tokenizer {
namespace {

TEST(ByteLevel, AlphabetIsGpt2s) {
  const auto& alphabet = byte_to_code_point();
  EXPECT_EQ(alphabet[' '], U'\u0120');   // "Ġ"
  EXPECT_EQ(alphabet['\n'], U'\u010A');  // "Ċ"
  EXPECT_EQ(alphabet[0], U'\u0100');
  EXPECT_EQ(alphabet['!'], U'!');
  EXPECT_EQ(alphabet[0xE9], U'\u00E9');  // printable Latin-1 keeps its code point
  EXPECT_EQ(alphabet[0xAD], U'\u0143');  // soft hyphen is the last remapped byte
  EXPECT_EQ(std::set<char32_t>(alphabet.begin(), alphabet.end()).size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(code_point_to_byte(alphabet[b]), b);
  EXPECT_EQ(code_point_to_byte(U' '), -1);
  EXPECT_EQ(byte_level_spelling(' '), "\xC4\xA0");
}

TEST(ByteLevel, DecodesAlphabetStringsToBytesAndLeavesOthersAsIs) {
  EXPECT_EQ(byte_level_decode("\xC4\xA0the"), " the");
  EXPECT_EQ(byte_level_decode("\xC3\xA4\xC2\xB8"), std::string("\xE4\xB8"));  // half of 中
  // Added tokens hold characters outside the alphabet: kept byte for byte.
  EXPECT_EQ(byte_level_decode("<\xEF\xBD\x9CUser\xEF\xBD\x9C>"), "<\xEF\xBD\x9CUser\xEF\xBD\x9C>");
  EXPECT_EQ(byte_level_decode("a b"), "a b");  // ' ' is not in the alphabet
}

}  // namespace
}  // namespace mlaserve::tokenizer

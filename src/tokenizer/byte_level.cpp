#include "tokenizer/byte_level.h"

#include <vector>

namespace mlaserve::tokenizer {
namespace {

// Printable Latin-1 bytes keep their own code point; the other 68 bytes are
// numbered upward from U+0100 in byte order.
std::array<char32_t, 256> make_byte_alphabet() {
  std::array<char32_t, 256> table{};
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next_extra++;
  }
  return table;
}

// Inverse of the alphabet over its whole range (all code points are < 0x144).
std::vector<int16_t> make_inverse(const std::array<char32_t, 256>& alphabet) {
  std::vector<int16_t> inverse(0x200, -1);
  for (int b = 0; b < 256; ++b) inverse[alphabet[b]] = static_cast<int16_t>(b);
  return inverse;
}

const std::vector<int16_t>& inverse_alphabet() {
  static const std::vector<int16_t> inverse = make_inverse(byte_to_code_point());
  return inverse;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes the code point at `pos` of valid UTF-8 and advances `pos`.
char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  int extra = b0 < 0x80 ? 0 : b0 < 0xE0 ? 1 : b0 < 0xF0 ? 2 : 3;
  char32_t cp = extra == 0 ? b0 : extra == 1 ? (b0 & 0x1F) : extra == 2 ? (b0 & 0x0F) : (b0 & 0x07);
  ++pos;
  for (; extra > 0 && pos < s.size(); --extra, ++pos) cp = (cp << 6) | (static_cast<uint8_t>(s[pos]) & 0x3F);
  return cp;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_code_point() {
  static const std::array<char32_t, 256> table = make_byte_alphabet();
  return table;
}

int code_point_to_byte(char32_t cp) {
  const auto& inverse = inverse_alphabet();
  return cp < inverse.size() ? inverse[cp] : -1;
}

std::string byte_level_spelling(uint8_t byte) {
  std::string out;
  append_utf8(byte_to_code_point()[byte], out);
  return out;
}

std::string byte_level_decode(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = code_point_to_byte(next_code_point(token, pos));
    if (b < 0) return std::string(token);
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

}  // namespace mlaserve::tokenizer

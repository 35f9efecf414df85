#include "tokenizer/utf8.h"

#include <cstdint>

namespace mlaserve::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Result of reading one sequence starting at a position.
struct SequenceScan {
  size_t length;  // bytes of a well-formed sequence, or of the ill-formed subpart
  bool valid;     // a complete well-formed sequence
  bool truncated; // ill-formed only because the input ended inside it
};

// Allowed range of the second byte for each lead byte (Unicode Table 3-7);
// later continuation bytes are always 80..BF.
SequenceScan scan_sequence(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {1, true, false};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // excludes UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false, false};  // stray continuation byte, C0/C1, F5..FF
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= s.size()) return {k, false, true};
    const auto b = static_cast<uint8_t>(s[pos + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {k, false, false};
  }
  return {need + 1, true, false};
}

}  // namespace

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const SequenceScan scan = scan_sequence(text, pos);
    if (!scan.valid) return pos;
    pos += scan.length;
  }
  return std::nullopt;
}

size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out) {
  size_t pos = 0;
  size_t run_start = 0;  // start of the pending run of valid bytes
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const SequenceScan scan = scan_sequence(bytes, pos);
    if (scan.valid) {
      pos += scan.length;
      continue;
    }
    out.append(bytes.substr(run_start, pos - run_start));
    if (scan.truncated && !final) return pos;
    out.append(kReplacement);
    pos += scan.length;
    run_start = pos;
  }
  out.append(bytes.substr(run_start, pos - run_start));
  return pos;
}

}  // namespace mlaserve::tokenizer

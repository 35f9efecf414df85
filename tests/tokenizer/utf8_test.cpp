#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace mlaserve::tokenizer {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string lossy(std::string_view bytes) {
  std::string out;
  EXPECT_EQ(append_utf8_lossy(bytes, /*final=*/true, out), bytes.size());
  return out;
}

TEST(Utf8, FindsFirstIllFormedSequence) {
  EXPECT_EQ(first_invalid_utf8("plain ascii"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("\xE4\xB8\xAD\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"), std::nullopt);  // 中😀U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ab\xC0\x80"), 2u);           // overlong NUL
  EXPECT_EQ(first_invalid_utf8("a\xE0\x80\xAF"), 1u);        // overlong '/'
  EXPECT_EQ(first_invalid_utf8("\xED\xA0\x80"), 0u);         // UTF-16 surrogate
  EXPECT_EQ(first_invalid_utf8("xy\xF4\x90\x80\x80"), 2u);   // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("xyz\xE4\xB8"), 3u);          // truncated at the end
  EXPECT_EQ(first_invalid_utf8("\x80"), 0u);                 // lone continuation byte
  EXPECT_EQ(first_invalid_utf8("\xFF"), 0u);
}

TEST(Utf8, ReplacesMaximalSubpartsLikeTheUnicodeStandard) {
  // The example of Unicode 15 section 3.9 ("U+FFFD Substitution of Maximal
  // Subparts"): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  EXPECT_EQ(lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  // Each byte of a surrogate or overlong form is its own subpart.
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(lossy("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(lossy("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
  EXPECT_EQ(lossy("\xF0\x9F\x98"), kFffd);  // truncated at the end: one replacement
}

TEST(Utf8, ChunkedDecodingEqualsOneShotForEverySplit) {
  const std::string bytes = "a\xF0\x9F\x98\x80\xF1\x80\x80\xE1\x80\xC2" "b\xE4\xB8\xAD\x80\xBF\xE4\xB8";
  const std::string one_shot = lossy(bytes);
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    std::string pending, out;
    for (const auto chunk : {std::string_view(bytes).substr(0, cut), std::string_view(bytes).substr(cut)}) {
      pending += chunk;
      pending.erase(0, append_utf8_lossy(pending, /*final=*/false, out));
      EXPECT_LE(pending.size(), 3u);
    }
    append_utf8_lossy(pending, /*final=*/true, out);
    EXPECT_EQ(out, one_shot) << "cut at " << cut;
  }
}

TEST(Utf8, HoldsBackOnlyAnUnfinishedCharacter) {
  std::string out;
  EXPECT_EQ(append_utf8_lossy("ab\xE4\xB8", /*final=*/false, out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  // A byte that can never continue the sequence makes it invalid at once.
  EXPECT_EQ(append_utf8_lossy("\xE4\xB8" "c", /*final=*/false, out), 3u);
  EXPECT_EQ(out, kFffd + "c");
}

}  // namespace
}  // namespace mlaserve::tokenizer

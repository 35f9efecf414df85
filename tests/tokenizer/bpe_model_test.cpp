#include "tokenizer/bpe_model.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace mlaserve::tokenizer {
namespace {

// A toy model whose merge order is known by hand: "a b" (rank 0) before
// "b c" (rank 1), then "ab c" (rank 2).
nlohmann::json toy_model() {
  nlohmann::json vocab;
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_level_spelling(static_cast<uint8_t>(b))] = id++;
  for (const char* t : {"ab", "bc", "abc"}) vocab[t] = id++;
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "b c", "ab c"}}};
}

std::vector<int32_t> encode(const BpeModel& m, std::string_view piece) {
  std::vector<int32_t> out;
  m.encode_piece(piece, out);
  return out;
}

TEST(BpeModel, MergesLowestRankFirstAndLeftmostAmongEquals) {
  const BpeModel m = BpeModel::from_json(toy_model());
  const int32_t ab = *m.token_to_id("ab"), bc = *m.token_to_id("bc"), abc = *m.token_to_id("abc");
  const int32_t a = *m.token_to_id("a"), b = *m.token_to_id("b"), c = *m.token_to_id("c");
  EXPECT_EQ(encode(m, "abc"), (std::vector<int32_t>{abc}));    // a b -> ab, then ab c
  EXPECT_EQ(encode(m, "bbc"), (std::vector<int32_t>{b, bc}));
  EXPECT_EQ(encode(m, "ababab"), (std::vector<int32_t>{ab, ab, ab}));
  EXPECT_EQ(encode(m, "abcbc"), (std::vector<int32_t>{abc, bc}));
  EXPECT_EQ(encode(m, "ca"), (std::vector<int32_t>{c, a}));
  EXPECT_EQ(encode(m, "abc"), (std::vector<int32_t>{abc}));  // second time from the cache
}

TEST(BpeModel, RejectsWhatItCannotRun) {
  auto spec = toy_model();
  spec["merges"].push_back("a q");
  spec["vocab"]["q"] = 9999;
  EXPECT_THROW(BpeModel::from_json(spec), Error);  // "aq" is not in the vocabulary
  spec = toy_model();
  spec["byte_fallback"] = true;
  EXPECT_THROW(BpeModel::from_json(spec), Error);
  spec = toy_model();
  spec["vocab"].erase(byte_level_spelling('z'));
  EXPECT_THROW(BpeModel::from_json(spec), Error);
}

TEST(BpeModel, ScanAndHeapMergeLoopsAgreeOnTheRealVocabulary) {
  std::ifstream in(MLASERVE_SOURCE_DIR "/assets/tokenizer/tokenizer.json");
  ASSERT_TRUE(in.good());
  std::stringstream buffer;
  buffer << in.rdbuf();
  const BpeModel m = BpeModel::from_json(nlohmann::json::parse(buffer.str()).at("model"));
  // Pieces from a small alphabet so that many merges apply, of every length.
  const std::string alphabet[] = {"e", "t", "a", " ", "th", "in", "\xE7\x9A\x84", "\xE4\xB8\x80", "0", "\n"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string piece;
    const int parts = 1 + static_cast<int>(rng() % 150);
    for (int i = 0; i < parts; ++i) piece += alphabet[rng() % std::size(alphabet)];
    std::vector<int32_t> by_scan, by_heap;
    m.merge_by_scan(piece, by_scan);
    m.merge_by_heap(piece, by_heap);
    ASSERT_EQ(by_scan, by_heap) << "piece of " << piece.size() << " bytes";
  }
}

}  // namespace
}  // namespace mlaserve::tokenizer

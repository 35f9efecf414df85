// Exactness against Hugging Face tokenizers 0.23 on the golden corpus made by
// tools/reference/make_tokenizer_golden.py (data in tests/data/tokenizer/):
// identical ids for every string, exact decoding, and the incremental
// detokenizer fed token by token giving exactly the one-shot decode.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace mlaserve::tokenizer {
namespace {

const std::string kDataDir = MLASERVE_SOURCE_DIR "/tests/data/tokenizer/";

const Tokenizer& deepseek_v3() {
  static const Tokenizer tok = Tokenizer::load(MLASERVE_SOURCE_DIR "/assets/tokenizer");
  return tok;
}

std::vector<nlohmann::json> read_records(const std::string& name) {
  std::ifstream in(kDataDir + name);
  EXPECT_TRUE(in.good()) << "missing " << kDataDir + name;
  std::vector<nlohmann::json> records;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

std::string streamed(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special_tokens) {
  IncrementalDetokenizer stream(tok, skip_special_tokens);
  std::string text;
  for (const int32_t id : ids) text += stream.push(id);
  return text + stream.flush();
}

std::string excerpt(const std::string& text) { return nlohmann::json(text.substr(0, 80)).dump(); }

// Stops reporting after a few failures so one bug does not print 3000 diffs.
constexpr int kMaxReported = 10;

TEST(TokenizerGolden, EncodeMatchesHuggingFaceOnEveryString) {
  const Tokenizer& tok = deepseek_v3();
  const auto records = read_records("golden.jsonl");
  ASSERT_GE(records.size(), 3000u);
  int failures = 0;
  for (size_t i = 0; i < records.size() && failures < kMaxReported; ++i) {
    const auto text = records[i]["text"].get<std::string>();
    const auto expected = records[i]["ids"].get<std::vector<int32_t>>();
    const auto ids = tok.encode(text, /*add_special_tokens=*/false);
    if (ids == expected) continue;
    ++failures;
    size_t at = 0;
    while (at < ids.size() && at < expected.size() && ids[at] == expected[at]) ++at;
    ADD_FAILURE() << "string " << i << " " << excerpt(text) << ": ids differ from token " << at << " of "
                  << expected.size() << " (ours " << (at < ids.size() ? ids[at] : -1) << ", HF "
                  << (at < expected.size() ? expected[at] : -1) << ")";
  }
}

TEST(TokenizerGolden, DecodeAndStreamingMatchHuggingFace) {
  const Tokenizer& tok = deepseek_v3();
  int failures = 0;
  for (const auto& record : read_records("golden.jsonl")) {
    if (failures >= kMaxReported) break;
    const auto ids = record["ids"].get<std::vector<int32_t>>();
    const auto text = record["text"].get<std::string>();
    // The corpus is valid UTF-8, so decoding must give the text back exactly.
    const auto decoded = record.value("decoded", text);
    const auto decoded_skip = record.value("decoded_skip_special", decoded);
    const bool ok = tok.decode(ids, false) == decoded && tok.decode(ids, true) == decoded_skip &&
                    streamed(tok, ids, false) == decoded && streamed(tok, ids, true) == decoded_skip;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "decode differs for " << excerpt(text);
    }
  }
}

TEST(TokenizerGolden, DecodeOfArbitraryIdsMatchesHuggingFace) {
  // Characters cut between tokens, bytes that never form UTF-8, special
  // tokens with and without skipping, ids past the vocabulary.
  const Tokenizer& tok = deepseek_v3();
  const auto records = read_records("golden_decode.jsonl");
  ASSERT_GE(records.size(), 100u);
  for (const auto& record : records) {
    const auto ids = record["ids"].get<std::vector<int32_t>>();
    const bool skip = record["skip_special_tokens"].get<bool>();
    const auto expected = record["text"].get<std::string>();
    EXPECT_EQ(tok.decode(ids, skip), expected) << record["ids"].dump();
    EXPECT_EQ(streamed(tok, ids, skip), expected) << record["ids"].dump();
  }
}

}  // namespace
}  // namespace mlaserve::tokenizer

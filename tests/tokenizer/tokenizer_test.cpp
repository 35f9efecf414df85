// The Tokenizer API on the real DeepSeek-V3 files (assets/tokenizer). Ids for
// BOS/EOS and the vocabulary size are transformers' own answers for these
// files (auto_tokenizer in tests/data/tokenizer/perf.json); the rest follows
// from tokenizer.json itself.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/incremental_detokenizer.h"

namespace mlaserve::tokenizer {
namespace {

const std::filesystem::path kAssets = MLASERVE_SOURCE_DIR "/assets/tokenizer";

const Tokenizer& deepseek_v3() {
  static const Tokenizer tok = Tokenizer::load(kAssets);
  return tok;
}

TEST(Tokenizer, SpecialTokensAndVocabulary) {
  const Tokenizer& tok = deepseek_v3();
  std::ifstream perf(MLASERVE_SOURCE_DIR "/tests/data/tokenizer/perf.json");
  const auto transformers_view = nlohmann::json::parse(perf).at("auto_tokenizer");
  EXPECT_EQ(tok.bos_id(), transformers_view.at("bos_token_id").get<int32_t>());
  EXPECT_EQ(tok.eos_id(), transformers_view.at("eos_token_id").get<int32_t>());
  EXPECT_EQ(tok.vocab_size(), transformers_view.at("len").get<int>());

  EXPECT_EQ(tok.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok.id_to_token(128803), "<｜User｜>");
  EXPECT_EQ(tok.token_to_id("\xC4\xA0the"), 270);  // "Ġthe"
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_THROW(tok.id_to_token(tok.vocab_size()), Error);
  EXPECT_THROW(tok.id_to_token(-1), Error);
  // special is a per-token flag in the file: the role markers are not special.
  EXPECT_TRUE(tok.is_special(tok.bos_id()));
  EXPECT_TRUE(tok.is_special(*tok.token_to_id("<|EOT|>")));
  EXPECT_FALSE(tok.is_special(128803));
  EXPECT_FALSE(tok.is_special(270));
  EXPECT_FALSE(tok.is_special(tok.vocab_size() + 5));
}

TEST(Tokenizer, AddSpecialTokensPrependsBosAsTheConfigSays) {
  // tokenizer_config.json: add_bos_token true, add_eos_token false.
  const Tokenizer& tok = deepseek_v3();
  for (const char* text : {"", "Hello world!", "<｜begin▁of▁sentence｜>x"}) {
    auto expected = tok.encode(text, false);
    expected.insert(expected.begin(), tok.bos_id());
    EXPECT_EQ(tok.encode(text, true), expected) << text;
  }
  EXPECT_EQ(tok.decode(tok.encode("Hi", true), true), "Hi");
}

TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheOffset) {
  const Tokenizer& tok = deepseek_v3();
  try {
    tok.encode("abc\xED\xA0\x80", false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnknownIdsDecodeToNothing) {
  const Tokenizer& tok = deepseek_v3();
  const auto hi = tok.encode("hi", false);
  EXPECT_EQ(tok.decode({-1, hi[0], tok.vocab_size(), 1 << 30}, false), "hi");
  IncrementalDetokenizer stream(tok, false);
  EXPECT_EQ(stream.push(tok.vocab_size()), "");
}

TEST(Tokenizer, StreamingHoldsBackACharacterCutBetweenTokens) {
  const Tokenizer& tok = deepseek_v3();
  // Byte tokens for the three bytes of 中 (E4 B8 AD), spelled "ä", "¸", "Ń".
  const int32_t e4 = *tok.token_to_id("\xC3\xA4"), b8 = *tok.token_to_id("\xC2\xB8"), ad = *tok.token_to_id("\xC5\x83");
  IncrementalDetokenizer stream(tok, false);
  EXPECT_EQ(stream.push(e4), "");
  EXPECT_EQ(stream.push(b8), "");
  EXPECT_EQ(stream.push(ad), "\xE4\xB8\xAD");
  EXPECT_EQ(stream.push(e4), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");  // unfinished at the end, as decode() gives
  EXPECT_EQ(tok.decode({e4}, false), "\xEF\xBF\xBD");
}

TEST(Tokenizer, LoadsADirectoryWithOnlyTokenizerJson) {
  const auto dir = std::filesystem::temp_directory_path() / "mlaserve_tokenizer_only_json";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kAssets / "tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  const Tokenizer tok = Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.encode("Hello", true), deepseek_v3().encode("Hello", false));
}

TEST(Tokenizer, MissingOrBrokenFilesGiveErrorsNamingThem) {
  try {
    Tokenizer::load("/nonexistent/model");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
  const auto dir = std::filesystem::temp_directory_path() / "mlaserve_tokenizer_broken";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "Unigram"}, "decoder": {"type": "ByteLevel"}})";
  EXPECT_THROW(Tokenizer::load(dir), Error);
  std::ofstream(dir / "tokenizer.json") << "{not json";
  EXPECT_THROW(Tokenizer::load(dir), Error);
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, ConcurrentEncodingGivesTheSameIds) {
  const Tokenizer& tok = deepseek_v3();
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back("thread-safe cache " + std::to_string(i * 7919) + " 日本語のテキスト " + std::string(i % 13, ' ') +
                    "word" + std::to_string(i));
  }
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok.encode(t, false));
  const Tokenizer fresh = Tokenizer::load(kAssets);  // empty cache, filled by all threads at once
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * (t + 1) + round) % texts.size();
          if (fresh.encode(texts[k], false) != expected[k]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace mlaserve::tokenizer

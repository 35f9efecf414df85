#pragma once
// The DeepSeek-V3 tokenizer: Hugging Face tokenizer.json (byte-level BPE,
// regex pre-tokenizer, added tokens, ByteLevel decoder) plus the BOS/EOS
// settings of tokenizer_config.json. Encodes and decodes exactly as Hugging
// Face tokenizers 0.23 does for that file (tests/tokenizer holds the proof).
//
// Immutable after load; copies share one instance, and encode/decode may be
// called from any number of threads at once.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mlaserve::tokenizer {

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json and, when present, model_dir/tokenizer_config.json
  // (add_bos_token, add_eos_token, bos_token, eos_token; all off/absent without it).
  static Tokenizer load(const std::filesystem::path& model_dir);

  // Special tokens written in the text are recognized (Hugging Face's
  // default). add_special_tokens adds BOS/EOS as tokenizer_config.json says.
  // Throws mlaserve::Error on invalid UTF-8, which Hugging Face cannot even
  // receive (a Rust &str is valid UTF-8 by construction).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

  // Ids that are not in the vocabulary produce no text, as in Hugging Face.
  // Bytes that do not form valid UTF-8 (a character cut between tokens)
  // become U+FFFD, one per maximal invalid subpart (Rust's from_utf8_lossy).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  // Beginning/end-of-sentence ids from tokenizer_config.json, -1 if not set.
  int32_t bos_id() const;
  int32_t eos_id() const;
  // One past the largest id, added tokens included (len(tokenizer) in transformers).
  int vocab_size() const;
  // Vocabulary strings: byte-level spelling for BPE tokens ("Ġthe"), content
  // for added tokens.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Throws mlaserve::Error for an id that is not in the vocabulary.
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  // The bytes token `id` stands for in decoded text (empty for an unknown id);
  // they may be part of a UTF-8 character. For the incremental detokenizer.
  std::string_view token_bytes(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mlaserve::tokenizer

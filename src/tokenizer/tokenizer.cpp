#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/added_token_matcher.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex_pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace mlaserve::tokenizer {

struct Tokenizer::Impl {
  BpeModel model;
  RegexPreTokenizer pre_tokenizer;
  // Hugging Face matches added tokens in two passes: first those with
  // normalized=false on the raw text, then those with normalized=true on the
  // remaining spans after normalization (the identity for this file).
  AddedTokenMatcher raw_added;
  AddedTokenMatcher normalized_added;
  std::unordered_map<std::string, int32_t> added_to_id;

  // Indexed by id.
  std::vector<std::string> token_text;   // vocabulary string
  std::vector<std::string> token_bytes;  // what the ByteLevel decoder makes of it
  std::vector<uint8_t> known;
  std::vector<uint8_t> special;

  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  bool add_eos = false;

  void encode_segment(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_unnormalized(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& ids) const;
  bool is_known(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < known.size() && known[id]; }
};

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MLA_CHECK(in.good(), "cannot open {}", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", path.string(), e.what());
  }
}

void check_supported_pipeline(const nlohmann::json& spec) {
  const auto& normalizer = spec.value("normalizer", nlohmann::json());
  const bool identity_normalizer =
      normalizer.is_null() || (normalizer.value("type", "") == "Sequence" && normalizer.value("normalizers", nlohmann::json::array()).empty());
  MLA_CHECK(identity_normalizer, "tokenizer.json: normalizer {} is not supported", normalizer.dump());
  const auto& post = spec.value("post_processor", nlohmann::json());
  // ByteLevel post-processing only trims offsets; ids are untouched.
  MLA_CHECK(post.is_null() || post.value("type", "") == "ByteLevel",
            "tokenizer.json: post_processor of type '{}' is not supported", post.value("type", ""));
  const auto& decoder = spec.value("decoder", nlohmann::json());
  MLA_CHECK(decoder.is_object() && decoder.value("type", "") == "ByteLevel",
            "tokenizer.json: only the ByteLevel decoder is supported");
}

// bos_token / eos_token in tokenizer_config.json: a string or an AddedToken object.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const auto& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  MLA_CHECK(value.is_object() && value.contains("content"), "tokenizer_config.json: {} has no content", key);
  return value["content"].get<std::string>();
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& model_dir) {
  const auto tokenizer_path = model_dir / "tokenizer.json";
  MLA_CHECK(std::filesystem::exists(tokenizer_path), "no tokenizer.json in {}", model_dir.string());
  const nlohmann::json spec = read_json(tokenizer_path);
  auto impl = std::make_shared<Impl>();
  try {
    check_supported_pipeline(spec);
    impl->model = BpeModel::from_json(spec.at("model"));
    impl->pre_tokenizer = RegexPreTokenizer::from_json(spec.at("pre_tokenizer"));

    const auto& model_tokens = impl->model.id_to_token();
    size_t size = model_tokens.size();
    const auto& added = spec.value("added_tokens", nlohmann::json::array());
    for (const auto& token : added) size = std::max<size_t>(size, token.at("id").get<int64_t>() + 1);
    impl->token_text.resize(size);
    impl->known.assign(size, 0);
    impl->special.assign(size, 0);
    for (size_t id = 0; id < model_tokens.size(); ++id) {
      if (model_tokens[id].empty()) continue;
      impl->token_text[id] = model_tokens[id];
      impl->known[id] = 1;
    }
    for (const auto& token : added) {
      const auto content = token.at("content").get<std::string>();
      MLA_CHECK(!token.value("lstrip", false) && !token.value("rstrip", false) && !token.value("single_word", false),
                "tokenizer.json: added token '{}' uses lstrip/rstrip/single_word, which is not supported", content);
      MLA_CHECK(first_invalid_utf8(content) == std::nullopt, "tokenizer.json: added token is not valid UTF-8");
      // Hugging Face gives an added token that is also a vocabulary string the
      // vocabulary's id.
      const int32_t id = impl->model.token_to_id(content).value_or(token.at("id").get<int32_t>());
      MLA_CHECK(id >= 0, "tokenizer.json: added token '{}' has a negative id", content);
      impl->added_to_id.try_emplace(content, id);
      impl->token_text[id] = content;
      impl->known[id] = 1;
      if (token.value("special", false)) impl->special[id] = 1;
      (token.value("normalized", false) ? impl->normalized_added : impl->raw_added).add(content, id);
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: unexpected structure: {}", tokenizer_path.string(), e.what());
  }
  impl->token_bytes.resize(impl->token_text.size());
  for (size_t id = 0; id < impl->token_text.size(); ++id) impl->token_bytes[id] = byte_level_decode(impl->token_text[id]);

  const auto config_path = model_dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const nlohmann::json config = read_json(config_path);
    impl->add_bos = config.value("add_bos_token", false);
    impl->add_eos = config.value("add_eos_token", false);
    auto resolve = [&](const char* key) -> int32_t {
      const auto content = config_token(config, key);
      if (!content) return -1;
      const auto it = impl->added_to_id.find(*content);
      if (it != impl->added_to_id.end()) return it->second;
      const auto id = impl->model.token_to_id(*content);
      MLA_CHECK(id.has_value(), "{}: {} '{}' is not in the vocabulary", config_path.string(), key, *content);
      return *id;
    };
    impl->bos_id = resolve("bos_token");
    impl->eos_id = resolve("eos_token");
    MLA_CHECK(!impl->add_bos || impl->bos_id >= 0, "{}: add_bos_token is set but bos_token is not", config_path.string());
    MLA_CHECK(!impl->add_eos || impl->eos_id >= 0, "{}: add_eos_token is set but eos_token is not", config_path.string());
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_ordinary(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  pre_tokenizer.split(text, pieces);
  for (const std::string_view piece : pieces) model.encode_piece(piece, ids);
}

void Tokenizer::Impl::encode_unnormalized(std::string_view text, std::vector<int32_t>& ids) const {
  size_t pos = 0;
  while (const auto match = normalized_added.find(text, pos)) {
    encode_ordinary(text.substr(pos, match->begin - pos), ids);
    ids.push_back(match->id);
    pos = match->end;
  }
  encode_ordinary(text.substr(pos), ids);
}

void Tokenizer::Impl::encode_segment(std::string_view text, std::vector<int32_t>& ids) const {
  size_t pos = 0;
  while (const auto match = raw_added.find(text, pos)) {
    encode_unnormalized(text.substr(pos, match->begin - pos), ids);
    ids.push_back(match->id);
    pos = match->end;
  }
  encode_unnormalized(text.substr(pos), ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const auto bad = first_invalid_utf8(text)) {
    fail("cannot tokenize invalid UTF-8: byte 0x{:02X} at offset {} does not start a valid sequence",
         static_cast<uint8_t>(text[*bad]), *bad);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special_tokens && impl_->add_bos) ids.push_back(impl_->bos_id);
  impl_->encode_segment(text, ids);
  if (add_special_tokens && impl_->add_eos) ids.push_back(impl_->eos_id);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (!impl_->is_known(id) || (skip_special_tokens && impl_->special[id])) continue;
    bytes += impl_->token_bytes[id];
  }
  std::string text;
  text.reserve(bytes.size());
  append_utf8_lossy(bytes, /*final=*/true, text);
  return text;
}

int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
int Tokenizer::vocab_size() const { return static_cast<int>(impl_->token_text.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->added_to_id.find(std::string(token));
  if (it != impl_->added_to_id.end()) return it->second;
  return impl_->model.token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  MLA_CHECK(impl_->is_known(id), "token id {} is not in the vocabulary (size {})", id, vocab_size());
  return impl_->token_text[id];
}

bool Tokenizer::is_special(int32_t id) const { return impl_->is_known(id) && impl_->special[id]; }

std::string_view Tokenizer::token_bytes(int32_t id) const {
  return impl_->is_known(id) ? std::string_view(impl_->token_bytes[id]) : std::string_view();
}

}  // namespace mlaserve::tokenizer

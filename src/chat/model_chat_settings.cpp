#include "chat/model_chat_settings.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>

#include "core/error.h"

namespace mlaserve::chat {
namespace {

std::optional<nlohmann::json> read_json_if_present(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", path.string(), e.what());
  }
}

void read_token(const nlohmann::json& config, const char* key, std::string& out, const std::filesystem::path& path) {
  if (!config.contains(key) || config[key].is_null()) return;
  const nlohmann::json& t = config[key];
  if (t.is_string()) {
    out = t.get<std::string>();
  } else if (t.is_object() && t.contains("content") && t["content"].is_string()) {
    out = t["content"].get<std::string>();
  } else {
    fail("{}: `{}` must be a string or an object with a string `content`", path.string(), key);
  }
}

}  // namespace

ChatTemplateKind detect_chat_template(const std::filesystem::path& model_dir) {
  std::string architecture;
  std::string name = std::filesystem::absolute(model_dir).lexically_normal().filename().string();
  if (name.empty()) name = std::filesystem::absolute(model_dir).lexically_normal().parent_path().filename().string();
  const std::filesystem::path path = model_dir / "config.json";
  if (auto config = read_json_if_present(path)) {
    if (config->contains("architectures") && (*config)["architectures"].is_array() &&
        !(*config)["architectures"].empty() && (*config)["architectures"][0].is_string()) {
      architecture = (*config)["architectures"][0].get<std::string>();
    }
    if (config->contains("_name_or_path") && (*config)["_name_or_path"].is_string()) {
      name += " " + (*config)["_name_or_path"].get<std::string>();
    }
  }
  return choose_chat_template(architecture, name);
}

ChatTokens load_chat_tokens(const std::filesystem::path& model_dir) {
  ChatTokens tokens;
  const std::filesystem::path path = model_dir / "tokenizer_config.json";
  if (auto config = read_json_if_present(path)) {
    read_token(*config, "bos_token", tokens.bos, path);
    read_token(*config, "eos_token", tokens.eos, path);
  }
  return tokens;
}

}  // namespace mlaserve::chat

#pragma once
// The chat encoding and special-token strings of a checkpoint directory.
#include <filesystem>

#include "chat/chat_template.h"

namespace mlaserve::chat {

// From config.json (`architectures`, `_name_or_path`) and the directory's
// name; see choose_chat_template. A missing config.json leaves the name only.
ChatTemplateKind detect_chat_template(const std::filesystem::path& model_dir);

// bos_token / eos_token of tokenizer_config.json (string or AddedToken
// object); DeepSeek's strings when the file or a field is absent.
ChatTokens load_chat_tokens(const std::filesystem::path& model_dir);

}  // namespace mlaserve::chat

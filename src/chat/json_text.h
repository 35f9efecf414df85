#pragma once
// JSON text exactly as Python's json.dumps(x, ensure_ascii=False) writes it
// with its default separators (", " and ": "): the `tojson` filter that
// transformers gives chat templates. Prompts embed tool schemas and arguments
// this way, so the bytes must match the reference renders.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace mlaserve::chat {

// Key order is kept as inserted (ordered_json), as Python dicts keep it.
std::string python_json_dumps(const nlohmann::ordered_json& value);

// Appends `text` escaped for the inside of a JSON string literal (no quotes):
// `"`, `\` and control characters are escaped, everything else (UTF-8
// included) is copied. Byte-wise, so a UTF-8 sequence split across calls
// comes out whole.
void append_json_escaped(std::string& out, std::string_view text);

}  // namespace mlaserve::chat

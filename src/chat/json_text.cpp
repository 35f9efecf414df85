#include "chat/json_text.h"

#include <fmt/format.h>

namespace mlaserve::chat {

void append_json_escaped(std::string& out, std::string_view text) {
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
}

namespace {

void dump(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += '"';
        append_json_escaped(out, key);
        out += "\": ";
        dump(item, out);
      }
      out += '}';
      break;
    }
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump(item, out);
      }
      out += ']';
      break;
    }
    case nlohmann::ordered_json::value_t::string:
      out += '"';
      append_json_escaped(out, v.get_ref<const std::string&>());
      out += '"';
      break;
    default:
      // Numbers, booleans and null print the same in both (shortest
      // round-trip floats, "1e-05" / "1e+16" exponents).
      out += v.dump();
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace mlaserve::chat

#pragma once
// Typed access to fields of a request body: a wrong type is a 400 naming the
// field and what it should be, never an exception from the JSON library.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace mlaserve::server {

using Json = nlohmann::ordered_json;

// Absent and null fields read as nullopt.
std::optional<double> number_field(const Json& body, const char* name);
std::optional<int64_t> integer_field(const Json& body, const char* name);
std::optional<bool> bool_field(const Json& body, const char* name);
std::optional<std::string> string_field(const Json& body, const char* name);
// A string or an array of strings (OpenAI's `stop`).
std::vector<std::string> string_or_strings_field(const Json& body, const char* name);
std::optional<std::vector<int32_t>> token_ids_field(const Json& body, const char* name);
// Parses the request body; it must be a JSON object.
Json parse_body(const std::string& body);

}  // namespace mlaserve::server

#include "server/json_fields.h"

#include <cmath>

#include "server/api_error.h"

namespace mlaserve::server {

namespace {

[[noreturn]] void wrong_type(const char* name, const char* what) {
  throw ApiError(400, fmt::format("'{}' must be {}", name, what), name);
}

const Json* find(const Json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

std::optional<double> number_field(const Json& body, const char* name) {
  const Json* v = find(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(name, "a number");
  double d = v->get<double>();
  if (!std::isfinite(d)) wrong_type(name, "a finite number");
  return d;
}

std::optional<int64_t> integer_field(const Json& body, const char* name) {
  const Json* v = find(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  // 5.0 is an integer to a JavaScript client.
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  wrong_type(name, "an integer");
}

std::optional<bool> bool_field(const Json& body, const char* name) {
  const Json* v = find(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(name, "a boolean");
  return v->get<bool>();
}

std::optional<std::string> string_field(const Json& body, const char* name) {
  const Json* v = find(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(name, "a string");
  return v->get<std::string>();
}

std::vector<std::string> string_or_strings_field(const Json& body, const char* name) {
  const Json* v = find(body, name);
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) wrong_type(name, "a string or an array of strings");
  std::vector<std::string> out;
  for (auto& e : *v) {
    if (!e.is_string()) wrong_type(name, "a string or an array of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<std::vector<int32_t>> token_ids_field(const Json& body, const char* name) {
  const Json* v = find(body, name);
  if (!v) return std::nullopt;
  if (!v->is_array()) wrong_type(name, "an array of token ids");
  std::vector<int32_t> ids;
  for (auto& e : *v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX)
      wrong_type(name, "an array of non-negative integer token ids");
    ids.push_back(int32_t(e.get<int64_t>()));
  }
  return ids;
}

Json parse_body(const std::string& body) {
  Json j;
  try {
    j = Json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

}  // namespace mlaserve::server

#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace mlaserve::server {

const char* openai_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string openai_error_body(int status, const std::string& message, const std::string& param,
                              const std::string& code) {
  nlohmann::json e = {{"message", message},
                      {"type", openai_error_type(status)},
                      {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                      {"code", code.empty() ? nlohmann::json() : nlohmann::json(code)}};
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace mlaserve::server

#pragma once
// OpenAI-style error responses: the status, and a body of the form
// {"error": {"message", "type", "param", "code"}} that OpenAI clients parse.
#include <string>

#include "core/error.h"

namespace mlaserve::server {

// A request that cannot be served, with the HTTP status it maps to.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : Error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// The error type OpenAI uses for a status (invalid_request_error, ...).
const char* openai_error_type(int status);
std::string openai_error_body(int status, const std::string& message, const std::string& param = {},
                              const std::string& code = {});

}  // namespace mlaserve::server

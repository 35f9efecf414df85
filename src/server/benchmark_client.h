#pragma once
// The load generator of bench-serving: streams requests to an
// OpenAI-compatible server (ours, SGLang, vLLM...) on one io thread,
// arrivals as a Poisson process (or all at once), at most max_concurrency
// in flight, and times every streamed token.
#include <cstdint>
#include <string>
#include <vector>

#include "server/benchmark_dataset.h"

namespace mlaserve::server {

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;
  std::string api_key;
  double request_rate = 0;  // requests/s; <= 0 or infinity: all at once
  int max_concurrency = 0;  // 0: no limit
  bool ignore_eos = true;   // SGLang/vLLM extension: exact output lengths
  uint64_t seed = 1;
  double request_timeout_s = 3600;
};

struct RequestResult {
  bool success = false;  // HTTP 200 and a stream that ended with [DONE]
  std::string error;
  int prompt_len = 0;
  int output_len = 0;  // from usage when the server reports it, else streamed chunks
  double ttft = 0;     // seconds
  double latency = 0;
  std::vector<double> itl;  // gaps between streamed chunks
  std::string generated_text;
};

// The first model id GET /v1/models lists (throws mlaserve::Error when the
// server cannot be reached or lists none).
std::string first_served_model(const LoadOptions& options);

// Results in prompt order; *duration_s is the wall time of the whole run.
std::vector<RequestResult> run_load(const std::vector<BenchPrompt>& prompts, const LoadOptions& options,
                                    double* duration_s);

}  // namespace mlaserve::server

#pragma once
// What bench-serving prints and writes: SGLang's bench_serving table and
// its JSON line (same names), computed from the per-request results.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/benchmark_client.h"

namespace mlaserve::server {

struct BenchmarkSettings {
  std::string backend = "mlaserve";
  std::string dataset_name;
  double request_rate = 0;  // <= 0: inf
  int max_concurrency = 0;  // 0: not set
  int random_input_len = 0, random_output_len = 0;
  double random_range_ratio = 0;
};

struct BenchmarkReport {
  int completed = 0, failed = 0;
  double duration_s = 0;
  int64_t total_input = 0, total_output = 0, total_output_retokenized = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  double concurrency = 0;
  double mean_e2e_ms = 0, median_e2e_ms = 0, std_e2e_ms = 0, p99_e2e_ms = 0;
  double mean_ttft_ms = 0, median_ttft_ms = 0, std_ttft_ms = 0, p99_ttft_ms = 0;
  double mean_tpot_ms = 0, median_tpot_ms = 0, std_tpot_ms = 0, p99_tpot_ms = 0;
  double mean_itl_ms = 0, median_itl_ms = 0, std_itl_ms = 0, p95_itl_ms = 0, p99_itl_ms = 0, max_itl_ms = 0;
  std::vector<std::string> first_errors;
};

// numpy.percentile's default (linear interpolation); 0 for no data.
double percentile(std::vector<double> values, double p);

// retokenized[i]: token count of request i's generated text by our tokenizer.
BenchmarkReport summarize(const std::vector<RequestResult>& results, const std::vector<int>& retokenized,
                          double duration_s);
std::string format_report(const BenchmarkReport& r, const BenchmarkSettings& s);
nlohmann::json report_json(const BenchmarkReport& r, const BenchmarkSettings& s);

}  // namespace mlaserve::server

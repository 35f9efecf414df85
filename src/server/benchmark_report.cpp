#include "server/benchmark_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mlaserve::server {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double rank = p / 100.0 * double(v.size() - 1);
  size_t lo = size_t(std::floor(rank)), hi = size_t(std::ceil(rank));
  return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

namespace {

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

double stddev(const std::vector<double>& v) {  // population, as numpy.std
  if (v.empty()) return 0;
  double m = mean(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

std::vector<double> ms(std::vector<double> v) {
  for (auto& x : v) x *= 1000.0;
  return v;
}

}  // namespace

BenchmarkReport summarize(const std::vector<RequestResult>& results, const std::vector<int>& retokenized,
                          double duration_s) {
  BenchmarkReport r;
  r.duration_s = duration_s;
  std::vector<double> e2e, ttft, tpot, itl;
  double latency_sum = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& x = results[i];
    if (!x.success) {
      r.failed++;
      if (r.first_errors.size() < 5) r.first_errors.push_back(x.error);
      continue;
    }
    r.completed++;
    r.total_input += x.prompt_len;
    r.total_output += x.output_len;
    r.total_output_retokenized += retokenized[i];
    e2e.push_back(x.latency);
    ttft.push_back(x.ttft);
    if (x.output_len > 1) tpot.push_back((x.latency - x.ttft) / double(x.output_len - 1));
    itl.insert(itl.end(), x.itl.begin(), x.itl.end());
    latency_sum += x.latency;
  }
  if (duration_s > 0) {
    r.request_throughput = r.completed / duration_s;
    r.input_throughput = double(r.total_input) / duration_s;
    r.output_throughput = double(r.total_output) / duration_s;
    r.total_throughput = double(r.total_input + r.total_output) / duration_s;
    r.concurrency = latency_sum / duration_s;
  }
  e2e = ms(e2e), ttft = ms(ttft), tpot = ms(tpot), itl = ms(itl);
  r.mean_e2e_ms = mean(e2e), r.median_e2e_ms = percentile(e2e, 50), r.std_e2e_ms = stddev(e2e);
  r.p99_e2e_ms = percentile(e2e, 99);
  r.mean_ttft_ms = mean(ttft), r.median_ttft_ms = percentile(ttft, 50), r.std_ttft_ms = stddev(ttft);
  r.p99_ttft_ms = percentile(ttft, 99);
  r.mean_tpot_ms = mean(tpot), r.median_tpot_ms = percentile(tpot, 50), r.std_tpot_ms = stddev(tpot);
  r.p99_tpot_ms = percentile(tpot, 99);
  r.mean_itl_ms = mean(itl), r.median_itl_ms = percentile(itl, 50), r.std_itl_ms = stddev(itl);
  r.p95_itl_ms = percentile(itl, 95), r.p99_itl_ms = percentile(itl, 99);
  r.max_itl_ms = itl.empty() ? 0 : *std::max_element(itl.begin(), itl.end());
  return r;
}

std::string format_report(const BenchmarkReport& r, const BenchmarkSettings& s) {
  std::string o;
  auto row = [&](const std::string& name, const std::string& value) { o += fmt::format("{:<40} {:<10}\n", name, value); };
  auto num = [&](const std::string& name, double v) { row(name, fmt::format("{:.2f}", v)); };
  auto title = [&](const std::string& t) { o += fmt::format("{:-^50}\n", t); };
  o += fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  row("Backend:", s.backend);
  row("Traffic request rate:", s.request_rate > 0 && std::isfinite(s.request_rate) ? fmt::format("{}", s.request_rate) : "inf");
  row("Max request concurrency:", s.max_concurrency > 0 ? std::to_string(s.max_concurrency) : "not set");
  row("Successful requests:", std::to_string(r.completed));
  if (r.failed) row("Failed requests:", std::to_string(r.failed));
  num("Benchmark duration (s):", r.duration_s);
  row("Total input tokens:", std::to_string(r.total_input));
  row("Total generated tokens:", std::to_string(r.total_output));
  row("Total generated tokens (retokenized):", std::to_string(r.total_output_retokenized));
  num("Request throughput (req/s):", r.request_throughput);
  num("Input token throughput (tok/s):", r.input_throughput);
  num("Output token throughput (tok/s):", r.output_throughput);
  num("Total token throughput (tok/s):", r.total_throughput);
  num("Concurrency:", r.concurrency);
  title("End-to-End Latency");
  num("Mean E2E Latency (ms):", r.mean_e2e_ms);
  num("Median E2E Latency (ms):", r.median_e2e_ms);
  num("P99 E2E Latency (ms):", r.p99_e2e_ms);
  title("Time to First Token");
  num("Mean TTFT (ms):", r.mean_ttft_ms);
  num("Median TTFT (ms):", r.median_ttft_ms);
  num("P99 TTFT (ms):", r.p99_ttft_ms);
  title("Time per Output Token (excl. 1st token)");
  num("Mean TPOT (ms):", r.mean_tpot_ms);
  num("Median TPOT (ms):", r.median_tpot_ms);
  num("P99 TPOT (ms):", r.p99_tpot_ms);
  title("Inter-Token Latency");
  num("Mean ITL (ms):", r.mean_itl_ms);
  num("Median ITL (ms):", r.median_itl_ms);
  num("P95 ITL (ms):", r.p95_itl_ms);
  num("P99 ITL (ms):", r.p99_itl_ms);
  num("Max ITL (ms):", r.max_itl_ms);
  o += std::string(50, '=') + "\n";
  return o;
}

nlohmann::json report_json(const BenchmarkReport& r, const BenchmarkSettings& s) {
  return {{"backend", s.backend},
          {"dataset_name", s.dataset_name},
          {"request_rate", s.request_rate > 0 && std::isfinite(s.request_rate) ? nlohmann::json(s.request_rate)
                                                                               : nlohmann::json("inf")},
          {"max_concurrency", s.max_concurrency > 0 ? nlohmann::json(s.max_concurrency) : nlohmann::json()},
          {"random_input_len", s.random_input_len},
          {"random_output_len", s.random_output_len},
          {"random_range_ratio", s.random_range_ratio},
          {"duration", r.duration_s},
          {"completed", r.completed},
          {"failed", r.failed},
          {"total_input_tokens", r.total_input},
          {"total_output_tokens", r.total_output},
          {"total_output_tokens_retokenized", r.total_output_retokenized},
          {"request_throughput", r.request_throughput},
          {"input_throughput", r.input_throughput},
          {"output_throughput", r.output_throughput},
          {"total_throughput", r.total_throughput},
          {"concurrency", r.concurrency},
          {"mean_e2e_latency_ms", r.mean_e2e_ms},
          {"median_e2e_latency_ms", r.median_e2e_ms},
          {"std_e2e_latency_ms", r.std_e2e_ms},
          {"p99_e2e_latency_ms", r.p99_e2e_ms},
          {"mean_ttft_ms", r.mean_ttft_ms},
          {"median_ttft_ms", r.median_ttft_ms},
          {"std_ttft_ms", r.std_ttft_ms},
          {"p99_ttft_ms", r.p99_ttft_ms},
          {"mean_tpot_ms", r.mean_tpot_ms},
          {"median_tpot_ms", r.median_tpot_ms},
          {"std_tpot_ms", r.std_tpot_ms},
          {"p99_tpot_ms", r.p99_tpot_ms},
          {"mean_itl_ms", r.mean_itl_ms},
          {"median_itl_ms", r.median_itl_ms},
          {"std_itl_ms", r.std_itl_ms},
          {"p95_itl_ms", r.p95_itl_ms},
          {"p99_itl_ms", r.p99_itl_ms},
          {"max_itl_ms", r.max_itl_ms}};
}

}  // namespace mlaserve::server

#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace mlaserve::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

namespace {

void metric(std::string& out, const char* type, const std::string& name, const std::string& help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

}  // namespace

std::string render_metrics(const runtime::SchedulerStats& e, int in_flight, int page_size,
                           const HttpServerStats& http, const RequestMetrics& r) {
  std::string out;
  metric(out, "gauge", "mlaserve_num_requests_in_flight", "Requests accepted and not yet answered in full.",
         in_flight);
  metric(out, "gauge", "mlaserve_num_running_reqs", "Requests in the running batch.", e.running);
  metric(out, "gauge", "mlaserve_num_queue_reqs", "Requests waiting to be scheduled.", e.waiting);
  metric(out, "gauge", "mlaserve_kv_total_tokens", "Capacity of the paged KV pool in tokens.",
         double(e.total_pages) * page_size);
  metric(out, "gauge", "mlaserve_kv_free_tokens", "Tokens of the KV pool on the free list.",
         double(e.free_pages) * page_size);
  metric(out, "gauge", "mlaserve_kv_available_tokens",
         "Tokens of the KV pool free or held only by the prefix cache (evictable).",
         double(e.free_pages + e.evictable_pages) * page_size);
  metric(out, "gauge", "mlaserve_kv_cached_tokens", "Tokens held by the radix prefix cache.",
         double(e.cached_pages) * page_size);
  metric(out, "gauge", "mlaserve_token_usage", "Fraction of the KV pool in use by requests.",
         e.total_pages ? 1.0 - double(e.free_pages + e.evictable_pages) / e.total_pages : 0.0);
  metric(out, "gauge", "mlaserve_last_batch_tokens", "New tokens in the latest model step.", e.last_batch_tokens);
  metric(out, "gauge", "mlaserve_last_batch_seqs", "Sequences in the latest model step.", e.last_batch_seqs);
  metric(out, "counter", "mlaserve_prompt_tokens_total", "Prompt tokens of finished requests.",
         double(e.prompt_tokens));
  metric(out, "counter", "mlaserve_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.",
         double(e.cached_prompt_tokens));
  metric(out, "counter", "mlaserve_generation_tokens_total", "Tokens generated.", double(e.generated_tokens));
  metric(out, "counter", "mlaserve_finished_requests_total", "Requests finished (any reason).",
         double(e.finished_requests));
  metric(out, "counter", "mlaserve_retractions_total", "Requests sent back to the queue when KV ran out.",
         double(e.retractions));
  metric(out, "counter", "mlaserve_aborted_requests_total", "Requests aborted (client gone, errors).",
         double(r.aborted_requests));
  metric(out, "counter", "mlaserve_rejected_requests_total", "Requests answered 503 (queue full, shutting down).",
         double(r.rejected_requests));
  metric(out, "gauge", "mlaserve_open_connections", "Open HTTP connections.", http.open_connections);
  metric(out, "gauge", "mlaserve_active_http_responses", "HTTP responses in progress.", http.active_responses);
  out += "# HELP mlaserve_http_responses_total HTTP responses by status code.\n"
         "# TYPE mlaserve_http_responses_total counter\n";
  for (auto& [code, n] : http.responses_by_status)
    out += fmt::format("mlaserve_http_responses_total{{code=\"{}\"}} {}\n", code, n);
  r.time_to_first_token.render(out, "mlaserve_time_to_first_token_seconds", "Time to first token.");
  r.e2e_latency.render(out, "mlaserve_e2e_request_latency_seconds", "End-to-end request latency.");
  return out;
}

}  // namespace mlaserve::server

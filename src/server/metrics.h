#pragma once
// Prometheus text exposition (format 0.0.4) of the engine and server state.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/http_server.h"

namespace mlaserve::server {

// Cumulative-bucket histogram, observed and rendered on the io thread.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct RequestMetrics {
  Histogram time_to_first_token{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram e2e_latency{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  int64_t aborted_requests = 0;
  int64_t rejected_requests = 0;  // 503: queue full or shutting down
};

std::string render_metrics(const runtime::SchedulerStats& engine, int in_flight, int page_size,
                           const HttpServerStats& http, const RequestMetrics& requests);

}  // namespace mlaserve::server

#include "server/benchmark_report.h"

#include <gtest/gtest.h>

#include "server/metrics.h"

using namespace mlaserve::server;

TEST(BenchmarkReport, PercentileInterpolatesLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], q): rank q/100 * 3, linear between neighbours.
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(BenchmarkReport, SummarizesSuccessfulRequests) {
  RequestResult a;
  a.success = true;
  a.prompt_len = 10;
  a.output_len = 5;
  a.ttft = 0.1;
  a.latency = 0.5;  // TPOT (0.5 - 0.1) / 4 = 0.1
  a.itl = {0.1, 0.1, 0.1, 0.1};
  RequestResult b = a;
  b.ttft = 0.3;
  b.latency = 1.5;  // TPOT 0.3
  b.itl = {0.2, 0.4, 0.3, 0.3};
  RequestResult failed;
  failed.error = "HTTP 503";
  auto r = summarize({a, b, failed}, {5, 6, 0}, 2.0);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.total_input, 20);
  EXPECT_EQ(r.total_output, 10);
  EXPECT_EQ(r.total_output_retokenized, 11);
  EXPECT_DOUBLE_EQ(r.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(r.output_throughput, 5.0);
  EXPECT_DOUBLE_EQ(r.concurrency, 1.0);  // (0.5 + 1.5) / 2 s
  EXPECT_NEAR(r.mean_ttft_ms, 200, 1e-9);
  EXPECT_NEAR(r.mean_tpot_ms, 200, 1e-9);
  EXPECT_NEAR(r.max_itl_ms, 400, 1e-9);
  EXPECT_NEAR(r.median_e2e_ms, 1000, 1e-9);
  EXPECT_EQ(r.first_errors, std::vector<std::string>{"HTTP 503"});
  auto j = report_json(r, BenchmarkSettings{});
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_NE(format_report(r, BenchmarkSettings{}).find("Successful requests:                     2"),
            std::string::npos);
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({1, 2});
  h.observe(0.5);
  h.observe(1.5);
  h.observe(7);
  std::string out;
  h.render(out, "x", "help");
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"2\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_sum 9\n"), std::string::npos) << out;
}

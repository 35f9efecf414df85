#include "server/benchmark_client.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <memory>

#include "core/error.h"
#include "runtime/sampler.h"

namespace mlaserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One streamed request, from connect to the end of the response.
class StreamingRequest : public std::enable_shared_from_this<StreamingRequest> {
 public:
  StreamingRequest(net::io_context& ioc, const tcp::resolver::results_type& endpoints, std::string target,
                   std::string host, std::string body, const LoadOptions& o, RequestResult& result,
                   std::function<void()> done)
      : stream_(ioc), endpoints_(endpoints), result_(result), done_(std::move(done)), timeout_(o.request_timeout_s) {
    req_.method(http::verb::post);
    req_.target(target);
    req_.version(11);
    req_.set(http::field::host, host);
    req_.set(http::field::content_type, "application/json");
    req_.set(http::field::connection, "close");
    if (!o.api_key.empty()) req_.set(http::field::authorization, "Bearer " + o.api_key);
    req_.body() = std::move(body);
    req_.prepare_payload();
    parser_.body_limit(std::numeric_limits<uint64_t>::max());
    on_chunk_ = [this](uint64_t, beast::string_view data, beast::error_code&) {
      consume(data);
      return data.size();
    };
    parser_.on_chunk_body(on_chunk_);
  }

  void start() {
    start_ = Clock::now();
    stream_.expires_after(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::duration<double>(timeout_)));
    stream_.async_connect(endpoints_, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->finish("connect: " + ec.message());
      http::async_write(self->stream_, self->req_, [self](beast::error_code ec, size_t) {
        if (ec) return self->finish("write: " + ec.message());
        self->read();
      });
    });
  }

 private:
  void read() {
    http::async_read_some(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec && ec != http::error::end_of_stream) return self->finish("read: " + ec.message());
      if (!self->parser_.is_done() && !ec) return self->read();
      auto& res = self->parser_.get();
      if (res.result_int() != 200) {
        self->finish(fmt::format("HTTP {}: {}", res.result_int(), res.body().substr(0, 500)));
        return;
      }
      if (!self->parser_.chunked()) self->consume(res.body());  // a server that does not chunk its stream
      self->finish(self->saw_done_ ? "" : "stream ended without [DONE]");
    });
  }

  void consume(beast::string_view data) {
    pending_.append(data.data(), data.size());
    size_t end;
    while ((end = pending_.find("\n\n")) != std::string::npos) {
      std::string event = pending_.substr(0, end);
      pending_.erase(0, end + 2);
      size_t pos = 0;
      while (pos < event.size()) {
        size_t eol = event.find('\n', pos);
        if (eol == std::string::npos) eol = event.size();
        std::string_view line(event.data() + pos, eol - pos);
        if (line.substr(0, 6) == "data: ") on_data(line.substr(6));
        pos = eol + 1;
      }
    }
  }

  void on_data(std::string_view data) {
    if (data == "[DONE]") {
      saw_done_ = true;
      return;
    }
    nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
    if (j.is_discarded()) return;
    if (j.contains("error")) {
      error_ = j["error"].is_object() && j["error"].contains("message") ? j["error"]["message"].dump() : j.dump();
      return;
    }
    if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens"))
      usage_tokens_ = j["usage"]["completion_tokens"].get<int>();
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
    const auto& c = j["choices"][0];
    std::string text;
    if (c.contains("text") && c["text"].is_string()) text = c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].is_object()) {
      for (const char* k : {"content", "reasoning_content"})
        if (c["delta"].contains(k) && c["delta"][k].is_string()) text += c["delta"][k].get<std::string>();
    }
    if (text.empty()) return;
    auto now = Clock::now();
    if (chunks_ == 0) {
      result_.ttft = std::chrono::duration<double>(now - start_).count();
    } else {
      result_.itl.push_back(std::chrono::duration<double>(now - last_).count());
    }
    last_ = now;
    ++chunks_;
    result_.generated_text += text;
  }

  void finish(const std::string& error) {
    if (finished_) return;
    finished_ = true;
    result_.latency = seconds_since(start_);
    result_.error = !error_.empty() ? error_ : error;
    result_.success = result_.error.empty();
    // Tokens that decode to no text (special tokens, skipped) stream no
    // chunk; then the first "token" is the end of the stream.
    if (chunks_ == 0) result_.ttft = result_.latency;
    result_.output_len = usage_tokens_ >= 0 ? usage_tokens_ : chunks_;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    done_();
  }

  beast::tcp_stream stream_;
  tcp::resolver::results_type endpoints_;
  http::request<http::string_body> req_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  std::function<size_t(uint64_t, beast::string_view, beast::error_code&)> on_chunk_;
  RequestResult& result_;
  std::function<void()> done_;
  double timeout_;
  std::string pending_;
  std::string error_;
  Clock::time_point start_, last_;
  int chunks_ = 0;
  int usage_tokens_ = -1;
  bool saw_done_ = false;
  bool finished_ = false;
};

std::string request_body(const BenchPrompt& p, const LoadOptions& o) {
  nlohmann::json b = {{"model", o.model},
                      {"max_tokens", p.output_len},
                      {"temperature", 0},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}}};
  if (o.ignore_eos) b["ignore_eos"] = true;
  if (o.endpoint.find("chat") != std::string::npos) {
    b["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", p.text}}});
  } else {
    b["prompt"] = p.text;
  }
  return b.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string first_served_model(const LoadOptions& o) {
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
  MLA_CHECK(!ec, "cannot resolve {}:{}: {}", o.host, o.port, ec.message());
  stream.expires_after(std::chrono::seconds(30));
  stream.connect(endpoints, ec);
  MLA_CHECK(!ec, "cannot connect to {}:{}: {}", o.host, o.port, ec.message());
  http::request<http::empty_body> req(http::verb::get, "/v1/models", 11);
  req.set(http::field::host, o.host);
  if (!o.api_key.empty()) req.set(http::field::authorization, "Bearer " + o.api_key);
  http::write(stream, req, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  if (!ec) http::read(stream, buffer, res, ec);
  MLA_CHECK(!ec, "GET /v1/models on {}:{}: {}", o.host, o.port, ec.message());
  MLA_CHECK(res.result_int() == 200, "GET /v1/models: HTTP {}: {}", res.result_int(), res.body().substr(0, 300));
  auto j = nlohmann::json::parse(res.body(), nullptr, false);
  MLA_CHECK(!j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
                j["data"][0].contains("id") && j["data"][0]["id"].is_string(),
            "GET /v1/models listed no model; pass --model");
  return j["data"][0]["id"].get<std::string>();
}

std::vector<RequestResult> run_load(const std::vector<BenchPrompt>& prompts, const LoadOptions& o,
                                    double* duration_s) {
  net::io_context ioc{1};
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
  MLA_CHECK(!ec, "cannot resolve {}:{}: {}", o.host, o.port, ec.message());

  std::vector<RequestResult> results(prompts.size());
  std::deque<size_t> ready;  // arrived, waiting for a concurrency slot
  int in_flight = 0;
  std::function<void()> launch_ready = [&] {
    while (!ready.empty() && (o.max_concurrency <= 0 || in_flight < o.max_concurrency)) {
      size_t i = ready.front();
      ready.pop_front();
      results[i].prompt_len = prompts[i].prompt_len;
      ++in_flight;
      auto r = std::make_shared<StreamingRequest>(ioc, endpoints, o.endpoint, o.host, request_body(prompts[i], o), o,
                                                  results[i], [&] {
                                                    --in_flight;
                                                    net::post(ioc, launch_ready);
                                                  });
      r->start();
    }
  };

  // Poisson arrivals: exponential gaps with mean 1 / rate.
  runtime::Rng rng(o.seed);
  const bool all_at_once = o.request_rate <= 0 || std::isinf(o.request_rate);
  const auto t0 = Clock::now();
  net::steady_timer timer(ioc);
  double arrival = 0;
  size_t next = 0;
  std::function<void()> arrive = [&] {
    ready.push_back(next++);
    launch_ready();
    if (next == prompts.size()) return;
    if (!all_at_once) arrival += -std::log(1.0 - rng.uniform()) / o.request_rate;
    timer.expires_at(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival)));
    timer.async_wait([&](beast::error_code) { arrive(); });
  };
  if (!prompts.empty()) net::post(ioc, arrive);
  ioc.run();
  *duration_s = seconds_since(t0);
  return results;
}

}  // namespace mlaserve::server

#include "server/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "server/api_error.h"

namespace mlaserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

std::string response_head(int status, const std::string& content_type, bool keep_alive, const HeaderList& extra) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\nServer: mlaserve\r\n", status,
                              std::string(http::obsolete_reason(http::status(status))));
  if (!content_type.empty()) h += fmt::format("Content-Type: {}\r\n", content_type);
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (auto& [k, v] : extra) h += fmt::format("{}: {}\r\n", k, v);
  return h;
}

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions options;
  HttpHandler handler;
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  net::signal_set signals{ioc};
  mutable std::mutex stats_mu;
  HttpServerStats stats;

  void count_response(int status) {
    std::lock_guard lk(stats_mu);
    stats.responses_by_status[status]++;
  }
  void add(int HttpServerStats::*field, int delta) {
    std::lock_guard lk(stats_mu);
    stats.*field += delta;
  }
  void accept();
};

namespace {

class Session : public HttpResponder, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)), read_timer_(server_->ioc) {
    server_->add(&HttpServerStats::open_connections, 1);
  }
  ~Session() override {
    if (active_) server_->add(&HttpServerStats::active_responses, -1);
    server_->add(&HttpServerStats::open_connections, -1);
  }

  void start() { read_request(); }

  // Too many connections: answer 503 and close.
  void reject_busy() {
    keep_alive_ = false;
    respond(503, openai_error_body(503, "too many open connections, retry later"), "application/json",
            {{"Retry-After", "1"}});
  }

  void respond(int status, std::string body, std::string content_type, HeaderList headers) override {
    if (closed_ || streaming_ || response_done_) return;
    std::string out = response_head(status, content_type, keep_alive_, headers);
    out += fmt::format("Content-Length: {}\r\n\r\n", body.size());
    out += body;
    server_->count_response(status);
    response_done_ = true;
    enqueue(std::move(out));
  }

  void start_stream(std::string content_type) override {
    if (closed_ || streaming_ || response_done_) return;
    streaming_ = true;
    std::string out = response_head(200, content_type, keep_alive_,
                                    {{"Cache-Control", "no-cache"}, {"Transfer-Encoding", "chunked"}});
    out += "\r\n";
    server_->count_response(200);
    enqueue(std::move(out));
  }

  void send_chunk(std::string data) override {
    if (closed_ || !streaming_ || response_done_ || data.empty()) return;
    enqueue(fmt::format("{:x}\r\n", data.size()) + data + "\r\n");
  }

  void end_stream() override {
    if (closed_ || !streaming_ || response_done_) return;
    response_done_ = true;
    enqueue("0\r\n\r\n");
  }

  void on_disconnect(std::function<void()> fn) override { on_disconnect_ = std::move(fn); }
  bool closed() const override { return closed_; }

  void post(std::function<void()> fn) override { net::post(server_->ioc, std::move(fn)); }

 private:
  void read_request() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(uint32_t(server_->options.max_header_bytes));
    // Our own deadline rather than the stream's: the stream would close the
    // socket on expiry, and a slow client should still read its 408.
    stream_.expires_never();
    reading_ = true;
    read_timed_out_ = false;
    read_timer_.expires_after(server_->options.request_timeout);
    read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->reading_) return;
      self->read_timed_out_ = true;
      beast::error_code cancel_ec;
      self->stream_.socket().cancel(cancel_ec);
    });
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // curl and others send `Expect: 100-continue` before a large body and wait
  // for the interim response; answer it, then read the body.
  void on_header(beast::error_code ec) {
    if (ec) return on_read(ec);
    auto read_body = [self = shared_from_this()] {
      http::async_read(self->stream_, self->buffer_, *self->parser_,
                       [self](beast::error_code ec, size_t) { self->on_read(ec); });
    };
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue), [read_body](beast::error_code ec, size_t) {
        if (!ec) read_body();
      });
      return;
    }
    read_body();
  }

  void on_read(beast::error_code ec) {
    reading_ = false;
    read_timer_.cancel();
    if (ec == net::error::operation_aborted && read_timed_out_) ec = beast::error::timeout;
    if (ec) {
      bool started = parser_->got_some() || buffer_.size() > 0;
      if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
          ec == net::error::operation_aborted || (ec == beast::error::timeout && !started)) {
        close();
        return;
      }
      keep_alive_ = false;
      int status = 400;
      std::string message = fmt::format("malformed HTTP request: {}", ec.message());
      if (ec == beast::error::timeout) {
        status = 408;
        message = fmt::format("the request did not arrive within {} ms", server_->options.request_timeout.count());
      } else if (ec == http::error::body_limit) {
        status = 413;
        message = fmt::format("request body larger than the limit of {} bytes", server_->options.max_body_bytes);
      } else if (ec == http::error::header_limit) {
        status = 431;
        message = fmt::format("request headers larger than the limit of {} bytes", server_->options.max_header_bytes);
      }
      linger_after_response_ = true;
      respond(status, openai_error_body(status, message), "application/json", {});
      return;
    }
    stream_.expires_never();
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    std::string target(msg.target());
    req.path = target.substr(0, target.find('?'));
    req.body = std::move(msg.body());
    for (auto& f : msg) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      req.headers[name] = std::string(f.value());
    }
    {
      std::lock_guard lk(server_->stats_mu);
      server_->stats.requests++;
      server_->stats.active_responses++;
    }
    active_ = true;
    response_done_ = false;
    streaming_ = false;
    ++request_seq_;
    watch_disconnect();
    try {
      server_->handler(std::move(req), shared_from_this());
    } catch (const std::exception& e) {
      spdlog::error("request handler failed: {}", e.what());
      respond(500, openai_error_body(500, std::string("internal error: ") + e.what()), "application/json", {});
    }
  }

  // Until the response is complete, notice a client that closes its end.
  void watch_disconnect() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), seq = request_seq_](
                                                            beast::error_code ec) {
      if (ec || self->closed_ || seq != self->request_seq_ || self->response_done_) return;
      char c;
      beast::error_code peek_ec;
      size_t n = self->stream_.socket().receive(net::buffer(&c, 1), tcp::socket::message_peek, peek_ec);
      if (peek_ec || n == 0) self->client_gone();
    });
  }

  void client_gone() {
    if (!response_done_ && on_disconnect_) {
      auto fn = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      fn();
    }
    close();
  }

  void enqueue(std::string data) {
    queue_.push_back(std::move(data));
    if (!writing_) write_next();
  }

  void write_next() {
    if (closed_) return;
    if (queue_.empty()) {
      writing_ = false;
      if (response_done_) response_complete();
      return;
    }
    writing_ = true;
    stream_.expires_after(server_->options.write_timeout);
    net::async_write(stream_, net::buffer(queue_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) {
                         self->client_gone();
                         return;
                       }
                       self->queue_.pop_front();
                       self->write_next();
                     });
  }

  void response_complete() {
    if (active_) {
      active_ = false;
      server_->add(&HttpServerStats::active_responses, -1);
    }
    on_disconnect_ = nullptr;
    stream_.expires_never();
    beast::error_code ec;
    stream_.socket().cancel(ec);  // the disconnect watch
    if (linger_after_response_) {
      linger();
    } else if (keep_alive_) {
      read_request();
    } else {
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      close();
    }
  }

  // After an error response on a request we did not read to the end: stop
  // sending, and drain what the client still sends for a moment, so its
  // unread bytes do not turn our close into a reset before it reads the error.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    stream_.async_read_some(net::buffer(drain_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->close();
        return;
      }
      self->stream_.expires_after(std::chrono::seconds(2));
      self->linger_more();
    });
  }
  void linger_more() {
    stream_.async_read_some(net::buffer(drain_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->close();
        return;
      }
      self->linger_more();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> queue_;
  std::function<void()> on_disconnect_;
  net::steady_timer read_timer_;
  char drain_[4096];
  bool reading_ = false;
  bool read_timed_out_ = false;
  uint64_t request_seq_ = 0;
  bool keep_alive_ = true;
  bool writing_ = false;
  bool streaming_ = false;
  bool response_done_ = false;
  bool closed_ = false;
  bool active_ = false;
  bool linger_after_response_ = false;
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !self->acceptor.is_open()) return;
    if (!ec) {
      bool busy;
      {
        std::lock_guard lk(self->stats_mu);
        busy = self->stats.open_connections >= self->options.max_connections;
      }
      auto session = std::make_shared<Session>(std::move(socket), self);
      if (busy) {
        session->reject_busy();
      } else {
        session->start();
      }
      self->accept();
      return;
    }
    // Out of file descriptors and the like: back off a little rather than
    // spin on a listening socket that keeps failing, then accept again.
    spdlog::warn("accept failed: {}", ec.message());
    auto timer = std::make_shared<net::steady_timer>(self->ioc, std::chrono::milliseconds(50));
    timer->async_wait([self, timer](beast::error_code) {
      if (self->acceptor.is_open()) self->accept();
    });
  });
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
  beast::error_code ec;
  auto address = net::ip::make_address(impl_->options.host, ec);
  MLA_CHECK(!ec, "--host '{}' is not an IP address: {}", impl_->options.host, ec.message());
  tcp::endpoint ep(address, uint16_t(impl_->options.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  MLA_CHECK(!ec, "cannot listen on {}:{}: {}", impl_->options.host, impl_->options.port, ec.message());
  impl_->accept();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? impl_->options.port : ep.port();
}

void HttpServer::run() { impl_->ioc.run(); }

void HttpServer::stop_accepting() {
  net::post(impl_->ioc, [impl = impl_] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
}

void HttpServer::stop() { impl_->ioc.stop(); }

void HttpServer::post(std::function<void()> fn) { net::post(impl_->ioc, std::move(fn)); }

void HttpServer::on_shutdown_signal(std::function<void(int)> fn) {
  impl_->signals.add(SIGINT);
  impl_->signals.add(SIGTERM);
  impl_->signals.async_wait([fn = std::move(fn)](beast::error_code ec, int sig) {
    if (!ec) fn(sig);
  });
}

HttpServerStats HttpServer::stats() const {
  std::lock_guard lk(impl_->stats_mu);
  return impl_->stats;
}

}  // namespace mlaserve::server

#pragma once
// A small asynchronous HTTP/1.1 server on Boost.Asio/Beast: one io thread
// serves every connection (no thread per connection), so thousands of idle
// streaming clients cost memory, not threads. Requests are parsed by Beast
// with a header and body size limit and a deadline for the whole request
// (slow clients get 408); responses are either whole or streamed with
// chunked transfer encoding (Server-Sent Events).
//
// Everything a handler or responder does runs on the io thread; work from
// other threads comes in through HttpResponder::post.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mlaserve::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void respond(int status, std::string body, std::string content_type = "application/json",
                       HeaderList headers = {}) = 0;
  // Streaming: headers now, then any number of chunks, then the end.
  virtual void start_stream(std::string content_type = "text/event-stream") = 0;
  virtual void send_chunk(std::string data) = 0;
  virtual void end_stream() = 0;
  // Called once, on the io thread, if the client goes away before the
  // response is complete (closed socket, failed or stalled write).
  virtual void on_disconnect(std::function<void()> fn) = 0;
  // The client is gone (nothing sent from now on reaches anyone).
  virtual bool closed() const = 0;
  // Runs fn on the io thread (engine callbacks hand their data over here).
  virtual void post(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(HttpRequest&& request, std::shared_ptr<HttpResponder> responder)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;  // 0: any free port (see HttpServer::port)
  size_t max_body_bytes = size_t(32) << 20;
  size_t max_header_bytes = 64 << 10;
  // Whole request, headers and body; also how long a keep-alive connection
  // may sit idle. Slow-loris clients are cut off (408) when it runs out.
  std::chrono::milliseconds request_timeout{30000};
  std::chrono::milliseconds write_timeout{60000};    // one write to a client that does not read
  int max_connections = 8192;
};

struct HttpServerStats {
  int open_connections = 0;
  int active_responses = 0;
  int64_t requests = 0;
  std::map<int, int64_t> responses_by_status;
};

class HttpServer {
 public:
  // Binds and listens (throws mlaserve::Error naming the address on failure).
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  int port() const;
  // Serves on the calling thread until stop().
  void run();
  // Closes the listening socket; open connections keep being served.
  void stop_accepting();
  // Stops the io loop (open connections are dropped).
  void stop();
  // Runs fn on the io thread.
  void post(std::function<void()> fn);
  // SIGINT/SIGTERM call fn on the io thread (once).
  void on_shutdown_signal(std::function<void(int signal)> fn);
  HttpServerStats stats() const;  // thread safe

  struct Impl;  // the io state, shared with the connections (http_server.cpp)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace mlaserve::server

// A small HTTP/1.1 server for Prometheus scrapes, on a thread of its own:
//
//   GET /metrics  200, text/plain; version=0.0.4 (the `metrics` callback's text)
//   GET /status   200, application/json (the `status` callback's text; 404 without one)
//   other paths   404;  other methods on those paths: 405
//   with a bearer_token, any request without `Authorization: Bearer <it>`: 401
//
// Requests are headers only (8 KiB at most; a body gets 413, a malformed
// request 400 and the connection closed). Reading a request and writing a
// response each have `io_timeout`, so a client that sends nothing or reads
// nothing is dropped.
//
// What no set of clients can do is keep a scraper out. A kept-alive
// connection waits at most `idle_timeout` for its next request, serves at
// most `max_requests_per_connection` and is not kept alive past
// `max_connection_age`. At most `max_connections` are open, and at most
// `max_connections_per_source` from one address; a newcomer over either
// limit is admitted by closing another of those connections: the one that
// has waited longest for its next request, or when none is waiting, the one
// whose read or write has been under way longest. A client that holds
// connections open therefore only ever pushes out its own or the idlest.
//
// The callbacks run on the server's thread, one request at a time, and may
// throw (the client gets a 500). Thread safety: port() and stop() may be
// called from any thread but the server's own (not from a callback).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace fedwan::metrics {

class MetricsServer {
 public:
  struct Options {
    // host:port, "[v6]:port" for IPv6; port 0 picks a free port (see port()).
    std::string bind = "127.0.0.1:0";
    std::function<std::string()> metrics;          // required: the exposition text
    std::function<std::string()> status;           // optional: a JSON document
    std::chrono::milliseconds io_timeout{5000};    // one request read, one answer written
    std::chrono::milliseconds idle_timeout{5000};  // kept alive, waiting for the next request
    std::chrono::milliseconds max_connection_age{60000};
    size_t max_requests_per_connection = 100;
    size_t max_connections = 16;
    size_t max_connections_per_source = 4;  // per client IP address
    // Not empty: every request must carry `Authorization: Bearer <token>`
    // (compared in constant time); see read_bearer_token_file.
    std::string bearer_token;
  };

  // Binds, listens and starts the thread. Throws ConfigError for an address
  // it cannot parse or resolve, without a metrics callback, or for a limit
  // or timeout of 0, and
  // TransportError when it cannot bind or listen there.
  explicit MetricsServer(Options options);
  // stop()s.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port it listens on (the one picked when bind asked for port 0).
  uint16_t port() const;
  // Closes the listener and every connection and joins the thread; returns
  // once a callback in progress has returned. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedwan::metrics

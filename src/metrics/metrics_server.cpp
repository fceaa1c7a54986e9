#include "metrics/metrics_server.hpp"

#include <exception>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/log.hpp"
#include "fedwan/error.hpp"

namespace fedwan::metrics {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr uint32_t kHeaderLimit = 8192;
// A pipelined request may follow the one being read; more than that is not
// buffered.
constexpr size_t kBufferLimit = size_t{2} * kHeaderLimit;

// What the server's connections share; touched only on the server's thread
// (and by the last sessions destroyed after it was joined).
struct Shared {
  MetricsServer::Options options;
  size_t active = 0;
};

// Splits "host:port" or "[v6]:port" and resolves it to one endpoint.
tcp::endpoint parse_bind(const std::string& bind, asio::io_context& ioc) {
  const auto bad = [&](const std::string& why) {
    return ConfigError("metrics server: bind address \"" + bind + "\" " + why +
                       " (use host:port, e.g. 127.0.0.1:9464, or [::1]:9464)");
  };
  std::string host, port;
  if (!bind.empty() && bind[0] == '[') {
    const size_t close = bind.find(']');
    if (close == std::string::npos || close + 1 >= bind.size() || bind[close + 1] != ':') {
      throw bad("has no port after the bracketed address");
    }
    host = bind.substr(1, close - 1);
    port = bind.substr(close + 2);
  } else {
    const size_t colon = bind.rfind(':');
    if (colon == std::string::npos) throw bad("has no port");
    host = bind.substr(0, colon);
    port = bind.substr(colon + 1);
    if (host.find(':') != std::string::npos) throw bad("is IPv6 without brackets");
  }
  if (host.empty()) throw bad("has no host (0.0.0.0 listens on every interface)");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535) {
    throw bad("has no valid port (0 to 65535)");
  }
  const auto port_number = static_cast<uint16_t>(std::stoul(port));
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return {address, port_number};
  tcp::resolver resolver(ioc);
  const auto results = resolver.resolve(host, port, ec);
  if (ec || results.empty()) throw bad("names a host that does not resolve: " + ec.message());
  return results.begin()->endpoint();
}

// One connection: read a request, answer it, and again while the client
// keeps it alive. Owned by its pending operation's handler.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<Shared> shared)
      : stream_(std::move(socket)), shared_(std::move(shared)) {
    ++shared_->active;
  }
  ~Session() { --shared_->active; }

  using Options = MetricsServer::Options;

  void read() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(0);
    stream_.expires_after(shared_->options.io_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::error::eof) {
      return close();  // gone, silent or idle: nothing to answer
    }
    if (ec) {
      const bool too_big = ec == http::error::header_limit || ec == http::error::buffer_overflow;
      const bool body = ec == http::error::body_limit || ec == http::error::unexpected_body;
      const auto status = too_big ? http::status::request_header_fields_too_large
                          : body  ? http::status::payload_too_large
                                  : http::status::bad_request;
      const auto reason = http::obsolete_reason(status);
      return respond(status, "text/plain", std::string(reason.data(), reason.size()) + "\n", false);
    }
    const auto& req = parser_->get();
    std::string_view path(req.target().data(), req.target().size());
    path = path.substr(0, path.find('?'));
    const Options& opt = shared_->options;
    const std::function<std::string()>* body = nullptr;
    const char* type = nullptr;
    if (path == "/metrics") {
      body = &opt.metrics;
      type = "text/plain; version=0.0.4; charset=utf-8";
    } else if (path == "/status" && opt.status) {
      body = &opt.status;
      type = "application/json";
    }
    if (!body) {
      return respond(http::status::not_found, "text/plain", "not found\n", req.keep_alive());
    }
    if (req.method() != http::verb::get) {
      return respond(http::status::method_not_allowed, "text/plain", "only GET\n",
                     req.keep_alive());
    }
    std::string text;
    try {
      text = (*body)();
    } catch (const std::exception& e) {
      log().warn("metrics server: {} failed: {}", std::string(path), e.what());
      return respond(http::status::internal_server_error, "text/plain", "internal error\n", false);
    } catch (...) {
      return respond(http::status::internal_server_error, "text/plain", "internal error\n", false);
    }
    respond(http::status::ok, type, std::move(text), req.keep_alive());
  }

  void respond(http::status status, const char* type, std::string body, bool keep_alive) {
    res_ = {};
    res_.result(status);
    res_.version(parser_->get().version() == 10 ? 10 : 11);
    res_.set(http::field::content_type, type);
    if (status == http::status::method_not_allowed) res_.set(http::field::allow, "GET");
    res_.keep_alive(keep_alive);
    res_.body() = std::move(body);
    res_.prepare_payload();
    stream_.expires_after(shared_->options.io_timeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_write(ec);
    });
  }

  void on_write(beast::error_code ec) {
    if (ec || !res_.keep_alive()) return close();
    read();
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kBufferLimit};
  std::optional<http::request_parser<http::empty_body>> parser_;
  http::response<http::string_body> res_;
  std::shared_ptr<Shared> shared_;
};

// The listener and its connections, alive from the constructor to stop().
struct Listener {
  explicit Listener(std::shared_ptr<Shared> s) : shared(std::move(s)) {}

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors, most likely: try again shortly, not in a spin.
        log().warn("metrics server: accept failed: {}", ec.message());
        retry.expires_after(std::chrono::milliseconds(200));
        retry.async_wait([this](beast::error_code e) {
          if (!e) accept();
        });
        return;
      }
      if (shared->active >= shared->options.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);  // over the limit: refused at once, not queued
      } else {
        std::make_shared<Session>(std::move(socket), shared)->read();
      }
      accept();
    });
  }

  void run() {
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (const std::exception& e) {
        log().error("metrics server: {}", e.what());
      }
    }
  }

  std::shared_ptr<Shared> shared;
  // Destroyed after the acceptor and timer: the handlers it still holds,
  // and the sessions they own, go with it, which closes their sockets.
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer retry{ioc};
};

}  // namespace

struct MetricsServer::Impl {
  std::mutex mutex;  // stop() against stop()
  std::unique_ptr<Listener> listener;
  std::thread thread;
  uint16_t port = 0;
};

MetricsServer::MetricsServer(Options options) : impl_(std::make_unique<Impl>()) {
  if (!options.metrics) throw ConfigError("metrics server: Options::metrics is not set");
  if (options.max_connections == 0) throw ConfigError("metrics server: max_connections is 0");
  auto shared = std::make_shared<Shared>();
  shared->options = std::move(options);
  const std::string& bind = shared->options.bind;
  auto listener = std::make_unique<Listener>(shared);
  const tcp::endpoint endpoint = parse_bind(bind, listener->ioc);
  auto& acceptor = listener->acceptor;
  beast::error_code ec;
  const auto fail = [&](const char* what) {
    return TransportError("metrics server: cannot " + std::string(what) + " " + bind + ": " +
                          ec.message() + " (is the port in use, or the address not local?)");
  };
  if (acceptor.open(endpoint.protocol(), ec)) throw fail("open a socket for");
  if (acceptor.set_option(asio::socket_base::reuse_address(true), ec)) throw fail("configure");
  if (acceptor.bind(endpoint, ec)) throw fail("bind");
  if (acceptor.listen(asio::socket_base::max_listen_connections, ec)) throw fail("listen on");
  impl_->port = acceptor.local_endpoint(ec).port();
  if (ec) throw fail("read the port of");
  listener->accept();
  impl_->thread = std::thread([l = listener.get()] { l->run(); });
  impl_->listener = std::move(listener);
}

MetricsServer::~MetricsServer() { stop(); }

uint16_t MetricsServer::port() const { return impl_->port; }

void MetricsServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->listener) return;
  impl_->listener->ioc.stop();  // run() returns after the handler in progress
  impl_->thread.join();
  impl_->listener.reset();  // closes the listener and every connection
}

}  // namespace fedwan::metrics

#include "metrics/metrics_server.hpp"

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "metrics/bearer_token.hpp"

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

class Session;

// What the server's connections share; touched only on the server's thread
// (and by the last sessions destroyed after it was joined).
struct Shared {
  MetricsServer::Options options;
  std::vector<Session*> open;  // connections not yet closed, oldest first
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

// One connection: wait for a request, read it, answer it, and again while
// the client keeps it alive and the limits allow. Owned by its pending
// operation's handler; listed in Shared::open until closed.
class Session : public std::enable_shared_from_this<Session> {
 public:
  using Clock = std::chrono::steady_clock;
  using Options = MetricsServer::Options;
  // Waiting: no byte of the next request yet (the first to be evicted).
  enum class State { kWaiting, kReading, kWriting, kClosed };

  Session(tcp::socket socket, std::shared_ptr<Shared> shared, asio::ip::address source)
      : stream_(std::move(socket)),
        shared_(std::move(shared)),
        source_(std::move(source)),
        opened_(Clock::now()) {
    shared_->open.push_back(this);
  }
  ~Session() { forget(); }

  void start() { wait_for_request(shared_->options.io_timeout); }

  // Closes the connection to make room for another; what it was doing ends
  // (its handler sees operation_aborted).
  void evict() { close(); }

  const asio::ip::address& source() const { return source_; }
  State state() const { return state_; }
  Clock::time_point since() const { return since_; }

 private:
  void enter(State s) {
    if (state_ == State::kClosed) return;  // evicted: stays closed
    state_ = s;
    since_ = Clock::now();
  }

  void wait_for_request(std::chrono::milliseconds timeout) {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(0);
    if (buffer_.size() > 0) return read_request();  // pipelined: already here
    enter(State::kWaiting);
    stream_.expires_after(timeout);
    stream_.async_read_some(buffer_.prepare(kHeaderLimit),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->close();  // gone, idle, or evicted
                              self->buffer_.commit(n);
                              self->read_request();
                            });
  }

  void read_request() {
    enter(State::kReading);
    stream_.expires_after(shared_->options.io_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (state_ == State::kClosed || ec == http::error::end_of_stream ||
        ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::error::eof) {
      return close();  // gone, silent or evicted: nothing to answer
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
    ++served_;
    const auto& req = parser_->get();
    const Options& opt = shared_->options;
    const bool keep_alive = req.keep_alive() && served_ < opt.max_requests_per_connection &&
                            Clock::now() - opened_ < opt.max_connection_age;
    if (!opt.bearer_token.empty()) {
      const auto auth = req.find(http::field::authorization);
      if (auth == req.end() ||
          !bearer_token_matches(std::string_view(auth->value().data(), auth->value().size()),
                                opt.bearer_token)) {
        return respond(http::status::unauthorized, "text/plain", "unauthorized\n", keep_alive);
      }
    }
    std::string_view path(req.target().data(), req.target().size());
    path = path.substr(0, path.find('?'));
    const std::function<std::string()>* body = nullptr;
    const char* type = nullptr;
    if (path == "/metrics") {
      body = &opt.metrics;
      type = "text/plain; version=0.0.4; charset=utf-8";
    } else if (path == "/status" && opt.status) {
      body = &opt.status;
      type = "application/json";
    }
    if (!body) return respond(http::status::not_found, "text/plain", "not found\n", keep_alive);
    if (req.method() != http::verb::get) {
      return respond(http::status::method_not_allowed, "text/plain", "only GET\n", keep_alive);
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
    respond(http::status::ok, type, std::move(text), keep_alive);
  }

  void respond(http::status status, const char* type, std::string body, bool keep_alive) {
    enter(State::kWriting);
    res_ = {};
    res_.result(status);
    res_.version(parser_->get().version() == 10 ? 10 : 11);
    res_.set(http::field::content_type, type);
    if (status == http::status::method_not_allowed) res_.set(http::field::allow, "GET");
    if (status == http::status::unauthorized) {
      res_.set(http::field::www_authenticate, "Bearer realm=\"fedwan metrics\"");
    }
    res_.keep_alive(keep_alive);
    res_.body() = std::move(body);
    res_.prepare_payload();
    stream_.expires_after(shared_->options.io_timeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_write(ec);
    });
  }

  void on_write(beast::error_code ec) {
    if (ec || !res_.keep_alive() || state_ == State::kClosed) return close();
    // Idle until the next request, and never past the connection's age.
    const Options& opt = shared_->options;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        opt.max_connection_age - (Clock::now() - opened_));
    wait_for_request(std::max(std::min(opt.idle_timeout, left), std::chrono::milliseconds(1)));
  }

  void close() {
    if (state_ == State::kClosed) return;
    enter(State::kClosed);
    forget();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  // Off the list of open connections: it no longer counts against a limit.
  void forget() {
    auto& open = shared_->open;
    open.erase(std::remove(open.begin(), open.end(), this), open.end());
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kBufferLimit};
  std::optional<http::request_parser<http::empty_body>> parser_;
  http::response<http::string_body> res_;
  std::shared_ptr<Shared> shared_;
  asio::ip::address source_;
  Clock::time_point opened_;
  Clock::time_point since_ = opened_;
  State state_ = State::kWaiting;
  size_t served_ = 0;
};

// The connection to close for a newcomer among those `from` accepts: the
// one waiting longest for its next request, else the one whose read or
// write has been under way longest. Null when none is open.
template <typename Filter>
Session* eviction_candidate(const Shared& shared, Filter from) {
  Session* best = nullptr;
  const auto better = [](const Session* a, const Session* b) {
    const bool a_waits = a->state() == Session::State::kWaiting;
    const bool b_waits = b->state() == Session::State::kWaiting;
    if (a_waits != b_waits) return a_waits;
    return a->since() < b->since();
  };
  for (Session* s : shared.open) {
    if (from(*s) && (!best || better(s, best))) best = s;
  }
  return best;
}

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
      admit(std::move(socket));
      accept();
    });
  }

  // Makes room under the limits (closing the idlest connections there) and
  // serves the newcomer.
  void admit(tcp::socket socket) {
    beast::error_code ec;
    const asio::ip::address source = socket.remote_endpoint(ec).address();
    if (ec) return;  // already gone
    const MetricsServer::Options& opt = shared->options;
    const auto same_source = [&](const Session& s) { return s.source() == source; };
    const auto count = std::count_if(shared->open.begin(), shared->open.end(),
                                     [&](const Session* s) { return same_source(*s); });
    if (static_cast<size_t>(count) >= opt.max_connections_per_source) {
      eviction_candidate(*shared, same_source)->evict();
    }
    if (shared->open.size() >= opt.max_connections) {
      eviction_candidate(*shared, [](const Session&) { return true; })->evict();
    }
    std::make_shared<Session>(std::move(socket), shared, source)->start();
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
  if (options.max_connections == 0 || options.max_connections_per_source == 0 ||
      options.max_requests_per_connection == 0) {
    throw ConfigError(
        "metrics server: a connection or request limit is 0 (nothing would be served)");
  }
  if (options.io_timeout.count() <= 0 || options.idle_timeout.count() <= 0 ||
      options.max_connection_age.count() <= 0) {
    throw ConfigError("metrics server: a timeout or the connection age is not positive");
  }
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

#include "transport/zmq_transport.hpp"

#include <cerrno>

#include <zmq.hpp>

#include "common/byte_pool.hpp"
#include "common/thread_sanitizer.hpp"
#include "fedwan/error.hpp"
#include "transport/congestion_monitor.hpp"
#include "transport/socket_buffers.hpp"

namespace fedwan::transport {

namespace {

void configure(zmq::socket_t& s, const SocketOptions& o) {
  s.set(zmq::sockopt::sndhwm, o.window);
  s.set(zmq::sockopt::rcvhwm, o.window);
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
  s.set(zmq::sockopt::linger, o.linger_ms);
  if (o.socket_buffer_bytes > 0) {
    // Set before connect/bind, so each connection's window scale fits it.
    s.set(zmq::sockopt::sndbuf, o.socket_buffer_bytes);
    s.set(zmq::sockopt::rcvbuf, o.socket_buffer_bytes);
    warn_if_capped(o.socket_buffer_bytes);
  }
}

// The peer's address ("tcp://1.2.3.4:5678" for TCP), or "local".
std::string source_of(zmq::message_t& msg) {
  const char* a = zmq_msg_gets(msg.handle(), "Peer-Address");
  return a != nullptr && *a != '\0' ? std::string(a) : std::string("local");
}

// A message that owns `bytes` without copying them: zmq frees the vector
// (from its I/O thread) once the bytes are on the wire, into the pool the
// next sealed frame is taken from.
zmq::message_t owning(std::vector<uint8_t>&& bytes) {
  if (bytes.empty()) return zmq::message_t();
  auto* held = new std::vector<uint8_t>(std::move(bytes));
  handed_over(held);  // to zmq's I/O thread, through queues no sanitizer sees
  try {
    return zmq::message_t(
        held->data(), held->size(),
        [](void* /*data*/, void* hint) {
          taken_over(hint);
          auto* sent = static_cast<std::vector<uint8_t>*>(hint);
          BytePool::shared().give(std::move(*sent));  // the next frame is sealed into it
          delete sent;
        },
        held);
  } catch (...) {
    delete held;
    throw;
  }
}

Message keep(zmq::message_t msg) {
  auto owner = std::make_shared<zmq::message_t>(std::move(msg));
  auto* data = static_cast<uint8_t*>(owner->data());
  const size_t size = owner->size();
  return Message(std::move(owner), data, size);
}

class ZmqSocket : public Socket {
 public:
  // Holds the context: a socket may outlive the transport that made it, and
  // a context's end waits for its sockets.
  ZmqSocket(std::shared_ptr<zmq::context_t> ctx, zmq::socket_type type, std::string name)
      : ctx_(std::move(ctx)), socket_(*ctx_, type), name_(std::move(name)) {}

  zmq::socket_t& socket() { return socket_; }
  // Readable when a new TCP connection awaits its congestion control; null
  // when none is set.
  void* congestion_handle() { return congestion_ ? congestion_->handle() : nullptr; }

  bool writable() override {
    watch_connections();
    try {
      return (socket_.get(zmq::sockopt::events) & ZMQ_POLLOUT) != 0;
    } catch (const zmq::error_t& e) {
      throw TransportError(name_ + ": " + e.what());
    }
  }

  void set_linger(Millis linger) override {
    try {
      socket_.set(zmq::sockopt::linger, static_cast<int>(linger.count()));
    } catch (const zmq::error_t&) {
      // Closing anyway.
    }
  }

  std::string congestion_control() const override {
    return congestion_ ? congestion_->applied() : std::string();
  }

  std::optional<TcpCounters> tcp_counters() override {
    if (!congestion_) return std::nullopt;
    return congestion_->counters();
  }

 protected:
  // Receives and drops the parts after `first` of its message; true when
  // there were any (a message of ours has one part).
  bool drain_further_parts(const zmq::message_t& first) {
    bool more = first.more();
    const bool any = more;
    while (more) {
      zmq::message_t skip;
      (void)socket_.recv(skip, zmq::recv_flags::none);
      more = skip.more();
    }
    return any;
  }
  // Call before connecting or binding: sets `o.tcp_congestion` on every TCP
  // connection the socket opens from then on (none when empty), and keeps
  // track of them (tcp_counters).
  void watch_congestion(const std::string& endpoint, const SocketOptions& o) {
    if (endpoint.rfind("tcp://", 0) != 0) return;
    congestion_ = std::make_unique<CongestionMonitor>(
        *ctx_, socket_, o.tcp_congestion, name_, o.long_link_notsent_lowat, o.long_link_rtt_us);
  }
  // Sets the congestion control of connections opened since the last use.
  void watch_connections() {
    if (congestion_) congestion_->poll();
  }

  std::shared_ptr<zmq::context_t> ctx_;
  zmq::socket_t socket_;
  std::string name_;  // for messages: "parent tcp://..." or "tcp://*:7000"
  // Declared after socket_ so that it is destroyed first: the monitor stops
  // and its socket closes before the monitored one does.
  std::unique_ptr<CongestionMonitor> congestion_;
};

class ClientSocket final : public ZmqSocket {
 public:
  ClientSocket(std::shared_ptr<zmq::context_t> ctx, const std::string& endpoint,
               const std::string& self_id, const SocketOptions& o)
      : ZmqSocket(std::move(ctx), zmq::socket_type::dealer, endpoint) {
    try {
      configure(socket_, o);
      socket_.set(zmq::sockopt::routing_id, self_id);
      watch_congestion(endpoint, o);
      socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      throw TransportError("cannot connect to " + endpoint + ": " + e.what());
    }
  }

  SendResult try_send(const std::string& /*peer*/, const uint8_t* data, size_t size) override {
    watch_connections();
    try {
      zmq::message_t msg(data, size);
      return socket_.send(msg, zmq::send_flags::dontwait) ? SendResult::kSent : SendResult::kFull;
    } catch (const zmq::error_t& e) {
      throw TransportError("send to " + name_ + " failed: " + e.what());
    }
  }

  SendResult try_send_owned(const std::string& /*peer*/, std::vector<uint8_t>& bytes) override {
    if (!writable()) return SendResult::kFull;
    zmq::message_t msg = owning(std::move(bytes));
    try {
      if (socket_.send(msg, zmq::send_flags::dontwait)) return SendResult::kSent;
    } catch (const zmq::error_t& e) {
      throw TransportError("send to " + name_ + " failed: " + e.what());
    }
    // POLLOUT promised room; should zmq refuse all the same, the bytes
    // come back for the retry.
    const auto* data = static_cast<const uint8_t*>(msg.data());
    bytes.assign(data, data + msg.size());
    return SendResult::kFull;
  }

  SendResult try_send_with(const std::string& /*peer*/, const Producer& produce) override {
    // POLLOUT guarantees room for one message.
    if (!writable()) return SendResult::kFull;
    zmq::message_t msg = owning(produce());
    try {
      return socket_.send(msg, zmq::send_flags::dontwait) ? SendResult::kSent : SendResult::kFull;
    } catch (const zmq::error_t& e) {
      throw TransportError("send to " + name_ + " failed: " + e.what());
    }
  }

  bool try_recv(Received* out) override {
    watch_connections();
    zmq::message_t msg;
    if (!socket_.recv(msg, zmq::recv_flags::dontwait)) return false;
    // A parent sends one part per message; one of several parts is not a
    // frame of ours, whatever its bytes.
    out->malformed = drain_further_parts(msg);
    out->peer = name_;
    out->source = "local";
    out->message = keep(std::move(msg));
    return true;
  }
};

class ServerSocket final : public ZmqSocket {
 public:
  ServerSocket(std::shared_ptr<zmq::context_t> ctx, const std::string& endpoint,
               const SocketOptions& o)
      : ZmqSocket(std::move(ctx), zmq::socket_type::router, endpoint) {
    try {
      configure(socket_, o);
      socket_.set(zmq::sockopt::router_mandatory, 1);
      socket_.set(zmq::sockopt::router_handover, 1);
      watch_congestion(endpoint, o);
      socket_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      throw TransportError("cannot bind " + endpoint + ": " + e.what() +
                           " (is another process using the port?)");
    }
  }

  SendResult try_send(const std::string& peer, const uint8_t* data, size_t size) override {
    return try_send_with(peer, [&] { return std::vector<uint8_t>(data, data + size); });
  }

  // The body is produced only once the routing frame is taken, and then
  // always goes: `bytes` are moved only when they are sent.
  SendResult try_send_owned(const std::string& peer, std::vector<uint8_t>& bytes) override {
    return try_send_with(peer, [&] { return std::move(bytes); });
  }

  SendResult try_send_with(const std::string& peer, const Producer& produce) override {
    watch_connections();
    try {
      zmq::message_t id(peer.data(), peer.size());
      // With ROUTER_MANDATORY a full window refuses the routing frame, and
      // once it is accepted the body always goes with it.
      if (!socket_.send(id, zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
        return SendResult::kFull;
      }
      std::vector<uint8_t> bytes;
      try {
        bytes = produce();
      } catch (...) {
        // The routing frame is queued: end its message with an empty body
        // (the child drops it), or the next message sent to any child would
        // become this one's body and go to this child (a handshake reply
        // meant for another child, for one).
        zmq::message_t empty;
        socket_.send(empty, zmq::send_flags::none);
        throw;
      }
      zmq::message_t body = owning(std::move(bytes));
      socket_.send(body, zmq::send_flags::none);
      return SendResult::kSent;
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return SendResult::kNoPeer;
      throw TransportError("send to '" + peer + "' on " + name_ + " failed: " + e.what());
    }
  }

  bool try_recv(Received* out) override {
    watch_connections();
    zmq::message_t id;
    if (!socket_.recv(id, zmq::recv_flags::dontwait)) return false;
    zmq::message_t msg;
    (void)socket_.recv(msg, zmq::recv_flags::none);
    // A well-behaved DEALER sends exactly one part per message.
    out->malformed = drain_further_parts(msg);
    out->peer = id.to_string();
    out->source = source_of(msg);
    out->long_link = congestion_ && congestion_->long_peer(out->source);
    out->message = keep(std::move(msg));
    return true;
  }
};

class ZmqTransport final : public Transport {
 public:
  std::unique_ptr<Socket> connect(const std::string& endpoint, const std::string& self_id,
                                  const SocketOptions& options) override {
    return std::make_unique<ClientSocket>(ctx_, endpoint, self_id, options);
  }

  std::unique_ptr<Socket> bind(const std::string& endpoint, const SocketOptions& options) override {
    return std::make_unique<ServerSocket>(ctx_, endpoint, options);
  }

  using Transport::wait;
  bool wait(const std::vector<Interest>& interests, Millis timeout) override {
    std::vector<zmq::pollitem_t> items;
    items.reserve(interests.size());
    for (const Interest& i : interests) {
      auto* z = dynamic_cast<ZmqSocket*>(i.socket);
      if (z == nullptr) throw TransportError("wait: a socket of another transport");
      const short events =
          static_cast<short>((i.readable ? ZMQ_POLLIN : 0) | (i.writable ? ZMQ_POLLOUT : 0));
      items.push_back({z->socket().handle(), 0, events, 0});
      // A new connection wakes the loop, whose next use of the socket sets
      // its congestion control.
      void* congestion = i.readable ? z->congestion_handle() : nullptr;
      if (congestion != nullptr) items.push_back({congestion, 0, ZMQ_POLLIN, 0});
    }
    try {
      return zmq::poll(items.data(), items.size(), timeout) > 0;
    } catch (const zmq::error_t& e) {
      // A signal (SIGTERM): the caller's loop looks at its stop flag.
      if (e.num() == EINTR) return false;
      throw TransportError(std::string("poll failed: ") + e.what());
    }
  }

 private:
  std::shared_ptr<zmq::context_t> ctx_ = std::make_shared<zmq::context_t>(1);
};

}  // namespace

std::unique_ptr<Transport> make_zmq_transport() { return std::make_unique<ZmqTransport>(); }

}  // namespace fedwan::transport

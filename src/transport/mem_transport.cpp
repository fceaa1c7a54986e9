#include "transport/mem_transport.hpp"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fedwan/error.hpp"

namespace fedwan::transport {
namespace {

using Clock = std::chrono::steady_clock;

// One client's connection to an endpoint.
struct Pipe {
  std::string id;
  std::deque<std::vector<uint8_t>> up;    // client -> server
  std::deque<std::vector<uint8_t>> down;  // server -> client
  size_t client_window = 8;
  int64_t client_max_bytes = 0;
  bool client_open = true;
};

struct Endpoint {
  bool bound = false;
  size_t server_window = 8;
  int64_t server_max_bytes = 0;
  // By routing id; a pipe closed by its client stays until the server has
  // read what it sent (a socket's linger).
  std::map<std::string, std::shared_ptr<Pipe>> pipes;
  std::string next;  // round robin: the routing id served first next time
};

// Every mem:// endpoint of the process. Never destroyed: sockets of
// detached threads may outlive static destruction.
struct Hub {
  std::mutex mu;
  std::condition_variable changed;  // any queue or binding changed
  std::map<std::string, Endpoint> endpoints;

  static Hub& get() {
    static Hub* hub = new Hub;
    return *hub;
  }
};

size_t window_of(int window) { return window > 0 ? static_cast<size_t>(window) : 1; }

class MemSocket : public Socket {
 public:
  // Whether a wait() on this socket is over; the hub's lock is held.
  virtual bool ready_locked(bool for_send) = 0;
};

class MemClient final : public MemSocket {
 public:
  MemClient(const std::string& endpoint, const std::string& self_id, const SocketOptions& o)
      : endpoint_(endpoint), pipe_(std::make_shared<Pipe>()) {
    pipe_->id = self_id;
    pipe_->client_window = window_of(o.window);
    pipe_->client_max_bytes = o.max_message_bytes;
    Hub& hub = Hub::get();
    std::lock_guard<std::mutex> lock(hub.mu);
    // A client connecting again under its id takes the id over.
    hub.endpoints[endpoint_].pipes[self_id] = pipe_;
    hub.changed.notify_all();
  }

  ~MemClient() override {
    Hub& hub = Hub::get();
    std::lock_guard<std::mutex> lock(hub.mu);
    pipe_->client_open = false;
    Endpoint& e = hub.endpoints[endpoint_];
    auto it = e.pipes.find(pipe_->id);
    if (it != e.pipes.end() && it->second == pipe_ && (linger_zero_ || pipe_->up.empty())) {
      e.pipes.erase(it);
    }
    hub.changed.notify_all();
  }

  SendResult try_send(const std::string& peer, const uint8_t* data, size_t size) override {
    return try_send_with(peer, [&] { return std::vector<uint8_t>(data, data + size); });
  }

  SendResult try_send_with(const std::string& /*peer*/, const Producer& produce) override {
    Hub& hub = Hub::get();
    if (!writable()) return SendResult::kFull;
    // Produced without the lock; only this socket's owner adds to the queue,
    // so the room seen above is still there.
    std::vector<uint8_t> bytes = produce();
    std::lock_guard<std::mutex> lock(hub.mu);
    pipe_->up.push_back(std::move(bytes));
    hub.changed.notify_all();
    return SendResult::kSent;
  }

  bool try_recv(Received* out) override {
    Hub& hub = Hub::get();
    std::lock_guard<std::mutex> lock(hub.mu);
    while (!pipe_->down.empty()) {
      std::vector<uint8_t> bytes = std::move(pipe_->down.front());
      pipe_->down.pop_front();
      hub.changed.notify_all();
      // A message over this socket's limit is dropped, as ZeroMQ does.
      if (static_cast<int64_t>(bytes.size()) > pipe_->client_max_bytes) continue;
      out->peer = endpoint_;
      out->source = "local";
      out->malformed = false;
      out->message = Message(std::move(bytes));
      return true;
    }
    return false;
  }

  bool writable() override {
    std::lock_guard<std::mutex> lock(Hub::get().mu);
    return ready_locked(true);
  }

  void set_linger(Millis linger) override { linger_zero_ = linger.count() <= 0; }

  bool ready_locked(bool for_send) override {
    if (!for_send) return !pipe_->down.empty();
    const Endpoint& e = Hub::get().endpoints[endpoint_];
    return pipe_->up.size() < (e.bound ? e.server_window : pipe_->client_window);
  }

 private:
  std::string endpoint_;
  std::shared_ptr<Pipe> pipe_;
  bool linger_zero_ = false;
};

class MemServer final : public MemSocket {
 public:
  MemServer(const std::string& endpoint, const SocketOptions& o) : endpoint_(endpoint) {
    Hub& hub = Hub::get();
    std::lock_guard<std::mutex> lock(hub.mu);
    Endpoint& e = hub.endpoints[endpoint_];
    if (e.bound) throw TransportError("cannot bind " + endpoint + ": address already in use");
    e.bound = true;
    e.server_window = window_of(o.window);
    e.server_max_bytes = o.max_message_bytes;
    hub.changed.notify_all();
  }

  ~MemServer() override {
    Hub& hub = Hub::get();
    std::lock_guard<std::mutex> lock(hub.mu);
    Endpoint& e = hub.endpoints[endpoint_];
    e.bound = false;
    // What was in flight to this server is lost with it; its clients stay
    // and reach the next server bound here.
    for (auto it = e.pipes.begin(); it != e.pipes.end();) {
      it->second->up.clear();
      it = it->second->client_open ? std::next(it) : e.pipes.erase(it);
    }
    hub.changed.notify_all();
  }

  SendResult try_send(const std::string& peer, const uint8_t* data, size_t size) override {
    return try_send_with(peer, [&] { return std::vector<uint8_t>(data, data + size); });
  }

  SendResult try_send_with(const std::string& peer, const Producer& produce) override {
    Hub& hub = Hub::get();
    std::shared_ptr<Pipe> pipe;
    {
      std::lock_guard<std::mutex> lock(hub.mu);
      Endpoint& e = hub.endpoints[endpoint_];
      auto it = e.pipes.find(peer);
      if (it == e.pipes.end() || !it->second->client_open) return SendResult::kNoPeer;
      pipe = it->second;
      if (pipe->down.size() >= std::min(e.server_window, pipe->client_window)) {
        return SendResult::kFull;
      }
    }
    // Produced without the lock (sealing a large frame takes a while); only
    // this server adds to the pipe's down queue.
    std::vector<uint8_t> bytes = produce();
    std::lock_guard<std::mutex> lock(hub.mu);
    pipe->down.push_back(std::move(bytes));
    hub.changed.notify_all();
    return SendResult::kSent;
  }

  bool try_recv(Received* out) override {
    Hub& hub = Hub::get();
    std::lock_guard<std::mutex> lock(hub.mu);
    Endpoint& e = hub.endpoints[endpoint_];
    // Round robin over the clients, from the one after the last served.
    for (int pass = 0; pass < 2; ++pass) {
      auto it = pass == 0 ? e.pipes.lower_bound(e.next) : e.pipes.begin();
      for (; it != e.pipes.end(); ++it) {
        Pipe& p = *it->second;
        if (p.up.empty()) continue;
        std::vector<uint8_t> bytes = std::move(p.up.front());
        p.up.pop_front();
        const std::string id = it->first;
        if (!p.client_open && p.up.empty()) e.pipes.erase(it);
        auto after = e.pipes.upper_bound(id);
        e.next = after == e.pipes.end() ? std::string() : after->first;
        hub.changed.notify_all();
        out->peer = id;
        out->source = "local";
        out->malformed = false;
        if (static_cast<int64_t>(bytes.size()) > e.server_max_bytes) {
          // Too big to take: counted and dropped by the link.
          out->malformed = true;
          bytes.clear();
        }
        out->message = Message(std::move(bytes));
        return true;
      }
    }
    return false;
  }

  bool writable() override {
    std::lock_guard<std::mutex> lock(Hub::get().mu);
    return ready_locked(true);
  }

  void set_linger(Millis /*linger*/) override {}

  bool ready_locked(bool for_send) override {
    const Endpoint& e = Hub::get().endpoints[endpoint_];
    for (const auto& [id, p] : e.pipes) {
      if (for_send
              ? (p->client_open && p->down.size() < std::min(e.server_window, p->client_window))
              : !p->up.empty()) {
        return true;
      }
    }
    return false;
  }

 private:
  std::string endpoint_;
};

class MemTransport final : public Transport {
 public:
  std::unique_ptr<Socket> connect(const std::string& endpoint, const std::string& self_id,
                                  const SocketOptions& options) override {
    check(endpoint);
    return std::make_unique<MemClient>(endpoint, self_id, options);
  }

  std::unique_ptr<Socket> bind(const std::string& endpoint, const SocketOptions& options) override {
    check(endpoint);
    return std::make_unique<MemServer>(endpoint, options);
  }

  using Transport::wait;
  bool wait(const std::vector<Interest>& interests, Millis timeout) override {
    for (const Interest& i : interests) {
      if (dynamic_cast<MemSocket*>(i.socket) == nullptr) {
        throw TransportError("wait: a socket of another transport");
      }
    }
    Hub& hub = Hub::get();
    std::unique_lock<std::mutex> lock(hub.mu);
    return hub.changed.wait_for(lock, timeout, [&] {
      for (const Interest& i : interests) {
        auto* s = static_cast<MemSocket*>(i.socket);
        if ((i.readable && s->ready_locked(false)) || (i.writable && s->ready_locked(true))) {
          return true;
        }
      }
      return false;
    });
  }

 private:
  static void check(const std::string& endpoint) {
    if (!is_mem_endpoint(endpoint) || endpoint.size() == 6) {
      throw TransportError("the in-process transport takes mem://NAME endpoints, not '" + endpoint +
                           "'");
    }
  }
};

}  // namespace

std::unique_ptr<Transport> make_mem_transport() { return std::make_unique<MemTransport>(); }

}  // namespace fedwan::transport

// The seam under the tree links: moving whole messages between a parent and
// its children, nothing more. A Transport makes sockets (gloo's Device makes
// pairs); ParentLink and ChildrenLink (links.hpp) put the security layer,
// windows and admission on top, the same for every transport.
//
//   client socket   connects to one endpoint under a routing id (a link's
//                   connection, routing_id.hpp); messages go to, and come
//                   from, whoever is bound there
//   server socket   binds an endpoint; every message it receives names the
//                   routing id it came from, and a send names the one it goes to
//
// Semantics every implementation keeps (ZeroMQ DEALER/ROUTER's): messages
// arrive whole and in order per peer, or not at all; a client may connect
// before the server binds, and its messages wait (up to the window) until it
// does; a client that connects again under the same routing id takes the id
// over; at most `window` messages wait per peer and direction, and a send
// beyond that is refused, not queued; a message over `max_message_bytes` is
// dropped on receipt.
//
// Implementations: ZeroMQ (tcp://, ipc://, inproc://; zmq_transport.hpp) and
// in-process (mem://, one process, no sockets; mem_transport.hpp).
//
// Thread safety: a Transport may be shared by threads; a Socket belongs to
// one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fedwan::transport {

using Millis = std::chrono::milliseconds;

struct SocketOptions {
  int window = 8;  // messages waiting per peer and direction
  int64_t max_message_bytes = (4 << 20) + 4096;
  int linger_ms = 5000;  // delivery time for queued messages at close
  // TCP congestion control of the socket's TCP connections (a kernel name
  // such as "bbr"); "" leaves the host's default. Transports without TCP
  // connections (mem://, ipc://, inproc://) ignore it.
  std::string tcp_congestion;
  // SO_SNDBUF and SO_RCVBUF of every TCP connection, in bytes; 0 leaves the
  // kernel's autotuning on (federation.socket_buffer_bytes).
  int socket_buffer_bytes = 0;
  // TCP_NOTSENT_LOWAT of every TCP connection whose handshake took 5 ms or
  // more there and back (0: none): what the kernel holds beyond what the
  // window lets go, so that a striped link's pieces go to the connections
  // that drain (links.hpp).
  int long_link_notsent_lowat = 32 << 10;
  // The round trip from which a connection is long: a parent's at the
  // handshake, a child's link (ParentLink, which sends its frames in
  // pieces over a long striped link) as the kernel measures it since.
  uint32_t long_link_rtt_us = 5000;
  // For the link layer above (links.hpp), not the transport: the connections
  // a child opens to its parent (federation.streams; with adaptive_streams,
  // `streams: auto`, the most it opens as they pay), and how long a link
  // striped over several waits for a frame that later ones overtook.
  int streams = 1;
  bool adaptive_streams = false;
  int reorder_wait_ms = 5000;
  // Threads a parent's link opens (decrypts and authenticates) its
  // children's frames on, and seals a turn's frames for several children
  // on, beside its owner's (transport/crypto_workers.hpp); 0: all on the
  // owner's thread; -1: FEDWAN_CRYPTO_THREADS, or else one fewer than the
  // cores the process may use, at most 3.
  int crypto_threads = -1;
};

// A TCP connection's counts from the kernel (TCP_INFO), or their sum over
// several: bytes the peer acknowledged, segments retransmitted, and the
// longest smoothed round-trip time among them.
struct TcpCounters {
  uint64_t acked = 0;
  uint64_t retransmits = 0;
  uint32_t rtt_us = 0;
  // What the congestion windows let be in flight now (cwnd x MSS, summed
  // over the connections): what the kernel sends, not what waits in queues.
  uint64_t window = 0;
};

// A received message. The bytes stay where the transport put them (no copy)
// and may be changed in place (the security layer decrypts there).
class Message {
 public:
  Message() = default;
  Message(std::shared_ptr<void> owner, uint8_t* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  explicit Message(std::vector<uint8_t> bytes);

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<void> owner_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

enum class SendResult {
  kSent,
  kFull,    // the window towards the peer is full: nothing was consumed
  kNoPeer,  // a server has no peer of that routing id
};

struct Received {
  std::string peer;    // the routing id it came from (servers), the endpoint (clients)
  std::string source;  // the sender's network address if the transport knows it, else "local"
  Message message;
  // Not one message as the protocol sends them (several parts): counted
  // and dropped by the link, never parsed.
  bool malformed = false;
  // Servers: the sender's host has a connection here whose handshake took
  // SocketOptions::long_link_rtt_us or more there and back (where the
  // transport knows: TCP).
  bool long_link = false;
};

class Socket {
 public:
  virtual ~Socket() = default;

  using Producer = std::function<std::vector<uint8_t>()>;

  // Never block. Client sockets ignore `peer`. Throw TransportError on a
  // hard failure of the socket.
  [[nodiscard]] virtual SendResult try_send(const std::string& peer, const uint8_t* data,
                                            size_t size) = 0;
  // Sends what `produce` returns if the window towards `peer` has room, and
  // runs `produce` only then: a frame is sealed (and takes its sequence
  // number) only when it goes out.
  [[nodiscard]] virtual SendResult try_send_with(const std::string& peer,
                                                 const Producer& produce) = 0;
  // try_send of `bytes` that may take them: on kSent they are the socket's
  // (left empty), otherwise untouched for a retry. A socket that can hand
  // the buffer to the wire without copying it does (zmq's).
  [[nodiscard]] virtual SendResult try_send_owned(const std::string& peer,
                                                  std::vector<uint8_t>& bytes) {
    const SendResult r = try_send(peer, bytes.data(), bytes.size());
    if (r == SendResult::kSent) bytes.clear();
    return r;
  }
  // Never blocks: false when nothing is waiting.
  [[nodiscard]] virtual bool try_recv(Received* out) = 0;
  // Whether a try_send could succeed now (for a server: to some peer).
  virtual bool writable() = 0;
  // How long close waits to deliver what is still queued (0: drop it).
  virtual void set_linger(Millis linger) = 0;
  // The TCP congestion control the kernel reported for the newest
  // connection after SocketOptions::tcp_congestion was applied (the host's
  // default when it could not be); "" when none was asked for, no
  // connection has been seen yet, or the socket has no TCP connections.
  virtual std::string congestion_control() const { return ""; }
  // What the kernel counts on its TCP connections open now, summed; nullopt
  // for a transport without TCP connections (mem://, ipc://, inproc://).
  virtual std::optional<TcpCounters> tcp_counters() { return std::nullopt; }
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Throw TransportError for an endpoint this transport cannot use (or,
  // binding, one in use).
  virtual std::unique_ptr<Socket> connect(const std::string& endpoint, const std::string& self_id,
                                          const SocketOptions& options) = 0;
  virtual std::unique_ptr<Socket> bind(const std::string& endpoint,
                                       const SocketOptions& options) = 0;

  // What a wait() watches on one socket.
  struct Interest {
    Socket* socket;
    bool readable = true;   // a message is waiting
    bool writable = false;  // a send could go out
  };

  // Blocks until one of the interests holds (sockets all made by this
  // transport), at most `timeout`. Returns false on timeout; a signal may end
  // the wait early (false too), so that the caller's loop sees its stop flag.
  virtual bool wait(const std::vector<Interest>& interests, Millis timeout) = 0;

  // The same for messages waiting on `sockets` (or room, when `for_send`).
  bool wait(const std::vector<Socket*>& sockets, Millis timeout, bool for_send = false) {
    std::vector<Interest> interests;
    interests.reserve(sockets.size());
    for (Socket* s : sockets) interests.push_back({s, !for_send, for_send});
    return wait(interests, timeout);
  }
};

// The transport for `endpoint`'s scheme: in-process for mem://, ZeroMQ for
// the rest. Every endpoint a node uses must have the same kind (the
// topology checks it).
std::unique_ptr<Transport> make_transport(const std::string& endpoint);
bool is_mem_endpoint(const std::string& endpoint);

// A test hook: wraps every transport make_transport() makes from now on
// (the inner one and the endpoint it was made for go in, what comes out is
// handed to the node), so that tests can inject faults into the nodes they
// run as threads without touching the nodes. An empty function removes it.
// Process-wide and thread safe; transports made before keep what they had.
// Production code never sets it.
using TransportDecorator = std::function<std::unique_ptr<Transport>(
    std::unique_ptr<Transport> inner, const std::string& endpoint)>;
void set_transport_decorator(TransportDecorator decorator);

}  // namespace fedwan::transport

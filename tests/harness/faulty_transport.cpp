#include "harness/faulty_transport.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <utility>

#include "fedwan/error.hpp"
#include "transport/routing_id.hpp"

namespace fedwan::testing {

using transport::Received;
using transport::SendResult;
using transport::Socket;

std::optional<wire::FrameHeader> frame_header(const uint8_t* data, size_t size) {
  // parse_frame decodes the raw fields before it judges them; a sealed
  // frame fails its checks (the sealed flag) with every field still read.
  const wire::ParsedFrame f = wire::parse_frame(data, size);
  if (f.reject == wire::RejectReason::kTooShort || f.reject == wire::RejectReason::kBadMagic) {
    return std::nullopt;
  }
  return f.header;
}

// ---- FaultRule ---------------------------------------------------------------

FaultRule FaultRule::delay_by(Millis d) {
  FaultRule r;
  r.action = Action::kDelay;
  r.delay = d;
  return r;
}

FaultRule FaultRule::delay_overtaken(Millis d) {
  FaultRule r = delay_by(d);
  r.keep_order = false;
  return r;
}

FaultRule FaultRule::corrupt(size_t offset, uint8_t mask) {
  FaultRule r;
  r.action = Action::kCorrupt;
  r.offset = offset;
  r.mask = mask;
  return r;
}

FaultRule FaultRule::duplicate() {
  FaultRule r;
  r.action = Action::kDuplicate;
  return r;
}

FaultRule FaultRule::observe() {
  FaultRule r;
  r.action = Action::kObserve;
  return r;
}

FaultRule FaultRule::rewrite_with(Rewrite rewrite) {
  FaultRule r;
  r.action = Action::kRewrite;
  r.rewrite = std::move(rewrite);
  return r;
}

FaultRule& FaultRule::on(std::string server_endpoint, std::string client_id) {
  endpoint = std::move(server_endpoint);
  client = std::move(client_id);
  return *this;
}

FaultRule& FaultRule::up() {
  way = Way::kUp;
  return *this;
}

FaultRule& FaultRule::down() {
  way = Way::kDown;
  return *this;
}

FaultRule& FaultRule::where(Predicate p) {
  if (match) {
    match = [before = std::move(match), p = std::move(p)](const uint8_t* d, size_t n) {
      return before(d, n) && p(d, n);
    };
  } else {
    match = std::move(p);
  }
  return *this;
}

FaultRule& FaultRule::of_type(wire::MsgType t) {
  return where([t](const uint8_t* d, size_t n) {
    const std::optional<wire::FrameHeader> h = frame_header(d, n);
    return h && h->type == t;
  });
}

FaultRule& FaultRule::first(uint64_t n) {
  limit = n;
  return *this;
}

bool FaultRule::covers(const Hop& hop) const {
  return (endpoint.empty() || endpoint == hop.endpoint) &&
         (client.empty() || client == hop.client) && (way == Way::kAny || way == hop.way);
}

// ---- FaultInjector -----------------------------------------------------------

FaultInjector::RuleId FaultInjector::add(FaultRule rule) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back({std::move(rule)});
  return rules_.size() - 1;
}

void FaultInjector::clear_rules() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : rules_) e.active = false;
}

uint64_t FaultInjector::hits(RuleId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return rules_.at(id).hits;
}

void FaultInjector::partition(const std::string& endpoint, const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  partitions_.emplace(endpoint, client);
}

void FaultInjector::heal(const std::string& endpoint, const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  partitions_.erase({endpoint, client});
}

void FaultInjector::heal_all() {
  std::lock_guard<std::mutex> lock(mu_);
  partitions_.clear();
}

bool FaultInjector::partitioned(const Hop& hop) const {
  std::lock_guard<std::mutex> lock(mu_);
  return partitioned_locked(hop);
}

bool FaultInjector::partitioned_locked(const Hop& hop) const {
  return partitions_.count({"", ""}) > 0 || partitions_.count({hop.endpoint, ""}) > 0 ||
         partitions_.count({hop.endpoint, hop.client}) > 0;
}

void FaultInjector::report_loss(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  report_loss_ = on;
}

bool FaultInjector::reporting_loss() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_loss_;
}

FaultStats FaultInjector::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

FaultInjector::Verdict FaultInjector::judge(const Hop& hop, uint8_t* data, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  Verdict v;
  stats_.received += 1;
  if (partitioned_locked(hop)) {
    stats_.partitioned += 1;
    v.drop = true;
    return v;
  }
  bool corrupted = false;
  for (Entry& e : rules_) {
    const FaultRule& r = e.rule;
    if (!e.active || e.hits >= r.limit || !r.covers(hop) || (r.match && !r.match(data, size))) {
      continue;
    }
    if (r.action == FaultRule::Action::kCorrupt && size == 0) continue;  // nothing to flip
    e.hits += 1;
    switch (r.action) {
      case FaultRule::Action::kDrop:
        stats_.dropped += 1;
        v.drop = true;
        return v;
      case FaultRule::Action::kDelay:
        v.delay = std::max(v.delay, r.delay);
        v.keep_order = v.keep_order && r.keep_order;
        break;
      case FaultRule::Action::kCorrupt:
        data[std::min(r.offset, size - 1)] ^= r.mask;
        corrupted = true;
        break;
      case FaultRule::Action::kDuplicate: v.duplicate = true; break;
      case FaultRule::Action::kObserve: break;
      case FaultRule::Action::kRewrite:
        if (r.rewrite) r.rewrite(data, size);
        stats_.rewritten += 1;
        break;
    }
  }
  if (v.delay.count() > 0) stats_.delayed += 1;
  if (corrupted) stats_.corrupted += 1;
  if (v.duplicate) stats_.duplicated += 1;
  return v;
}

// ---- FaultySocket ------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

// Sends go straight to the inner socket; what it receives is judged and, when
// delayed, held here until due. Owned by one thread, as every socket is.
class FaultySocket final : public Socket {
 public:
  // `client_id` is set for a client socket (the routing id it connected
  // under), empty for a server.
  FaultySocket(std::unique_ptr<Socket> inner, std::shared_ptr<FaultInjector> faults,
               std::string endpoint, std::optional<std::string> client_id)
      : inner_(std::move(inner)),
        faults_(std::move(faults)),
        endpoint_(std::move(endpoint)),
        client_id_(std::move(client_id)) {}

  SendResult try_send(const std::string& peer, const uint8_t* data, size_t size) override {
    return inner_->try_send(peer, data, size);
  }
  SendResult try_send_with(const std::string& peer, const Producer& produce) override {
    return inner_->try_send_with(peer, produce);
  }
  bool writable() override { return inner_->writable(); }
  void set_linger(Millis linger) override { inner_->set_linger(linger); }
  std::string congestion_control() const override { return inner_->congestion_control(); }
  std::optional<transport::TcpCounters> tcp_counters() override {
    std::optional<transport::TcpCounters> real = inner_->tcp_counters();
    if (client_id_ && faults_->reporting_loss()) injected_ += 1;
    if (!real) return real;
    real->retransmits += injected_;
    // A lossy path is a long one.
    if (faults_->reporting_loss()) real->rtt_us = std::max<uint32_t>(real->rtt_us, 50000);
    return real;
  }

  bool try_recv(Received* out) override {
    for (;;) {
      if (release_due(out)) return true;
      Received in;
      if (!inner_->try_recv(&in)) return false;
      admit(std::move(in));
    }
  }

  Socket* inner() { return inner_.get(); }

  // When the first held message comes due (time_point::max() when none is held).
  Clock::time_point next_due() const {
    Clock::time_point next = Clock::time_point::max();
    for (const Held& h : held_) next = std::min(next, h.due);
    return next;
  }

 private:
  struct Held {
    Received received;
    Clock::time_point due;
    bool keep_order = true;
  };

  void admit(Received in) {
    Hop hop;
    hop.endpoint = endpoint_;
    // As rules name a connection: the same for every link the client opens.
    hop.client = transport::untagged_routing_id(client_id_ ? *client_id_ : in.peer);
    hop.way = client_id_ ? Way::kDown : Way::kUp;
    const FaultInjector::Verdict v = faults_->judge(hop, in.message.data(), in.message.size());
    if (v.drop) return;
    Clock::time_point due = Clock::now() + v.delay;
    // Never before what the same peer sent earlier (unless that may be
    // overtaken).
    for (const Held& h : held_) {
      if (h.received.peer == in.peer && h.keep_order) due = std::max(due, h.due);
    }
    std::optional<Received> copy;
    if (v.duplicate) {
      // A copy taken now: the receiver may change the first in place
      // (the security layer decrypts there).
      copy = in;
      const uint8_t* d = in.message.data();
      copy->message = transport::Message(std::vector<uint8_t>(d, d + in.message.size()));
    }
    held_.push_back({std::move(in), due, v.keep_order});
    if (copy) held_.push_back({std::move(*copy), due, v.keep_order});
  }

  // The first held message that is due, in arrival order.
  bool release_due(Received* out) {
    if (held_.empty()) return false;
    const Clock::time_point now = Clock::now();
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->due > now) continue;
      *out = std::move(it->received);
      held_.erase(it);
      return true;
    }
    return false;
  }

  std::unique_ptr<Socket> inner_;
  std::shared_ptr<FaultInjector> faults_;
  std::string endpoint_;
  std::optional<std::string> client_id_;
  uint64_t injected_ = 0;  // retransmissions reported while the injector says lossy
  std::deque<Held> held_;
};

}  // namespace

// ---- FaultyTransport ---------------------------------------------------------

FaultyTransport::FaultyTransport(std::unique_ptr<transport::Transport> inner,
                                 std::shared_ptr<FaultInjector> faults)
    : inner_(std::move(inner)), faults_(std::move(faults)) {}

std::unique_ptr<Socket> FaultyTransport::connect(const std::string& endpoint,
                                                 const std::string& self_id,
                                                 const transport::SocketOptions& options) {
  return std::make_unique<FaultySocket>(inner_->connect(endpoint, self_id, options), faults_,
                                        endpoint, self_id);
}

std::unique_ptr<Socket> FaultyTransport::bind(const std::string& endpoint,
                                              const transport::SocketOptions& options) {
  return std::make_unique<FaultySocket>(inner_->bind(endpoint, options), faults_, endpoint,
                                        std::nullopt);
}

bool FaultyTransport::wait(const std::vector<Interest>& interests, Millis timeout) {
  std::vector<Interest> inner;
  std::vector<FaultySocket*> readers;
  for (const Interest& i : interests) {
    auto* s = dynamic_cast<FaultySocket*>(i.socket);
    if (s == nullptr) throw TransportError("wait: a socket of another transport");
    inner.push_back({s->inner(), i.readable, i.writable});
    if (i.readable) readers.push_back(s);
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    for (FaultySocket* s : readers) next = std::min(next, s->next_due());
    if (next <= now) return true;
    const Clock::time_point until = std::min(deadline, next);
    // Rounded up: waking before a message is due would only wait again.
    const Millis slice = until > now ? std::chrono::ceil<Millis>(until - now) : Millis(0);
    if (inner_->wait(inner, slice)) return true;
    // Timed out, or a signal ended the wait early (the caller sees its stop
    // flag); otherwise a held message came due.
    if (until == deadline || Clock::now() < next) return false;
  }
}

// ---- ScopedTransportFaults ---------------------------------------------------

ScopedTransportFaults::ScopedTransportFaults(std::shared_ptr<FaultInjector> faults)
    : faults_(std::move(faults)) {
  transport::set_transport_decorator(
      [faults = faults_](std::unique_ptr<transport::Transport> inner, const std::string&) {
        return std::make_unique<FaultyTransport>(std::move(inner), faults);
      });
}

ScopedTransportFaults::~ScopedTransportFaults() { transport::set_transport_decorator({}); }

}  // namespace fedwan::testing

// Aggregator: the root and region roles of the round protocol.
//
// One thread owns both sockets (children ROUTER, parent DEALER) and runs an
// event loop. Deltas are accumulated chunk by chunk as they stream in; a
// region forwards chunk i upward the moment every child's chunk i is in, the
// root steps the outer optimizer on chunk i and streams the new anchor's
// chunk i down. See docs/protocol.md for the message sequence.
#include "fedwan/aggregator.hpp"

#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "aggregation/round_accumulator.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "runtime/node_frames.hpp"
#include "runtime/node_security.hpp"
#include "runtime/traffic.hpp"
#include "transport/links.hpp"

namespace fedwan {
namespace {

using Clock = std::chrono::steady_clock;
constexpr Millis kPoll{100};

struct Child {
  uint32_t index = 0;
  std::string id;
  bool is_site = true;
  bool joined = false;
  bool welcomed = false;
  bool confirmed_end = false;  // said it holds the final model (kDone upward)
  wire::HelloPayload hello;
};

// A root's round awaiting its regions' traffic reports.
struct PendingReport {
  RoundReport report;
  bool complete = false;  // the global model of the round is final
};

// Telemetry received from region children for one round.
struct SubtreeTraffic {
  uint32_t reports = 0;
  Traffic traffic;
};

}  // namespace

class Aggregator::Impl {
 public:
  explicit Impl(AggregatorOptions options);
  AggregatorSummary run();
  std::atomic<bool> stop_requested{false};

 private:
  enum class Phase { kJoining, kAwaitWelcome, kTraining, kAwaitAnchor, kDraining, kDone };

  // Event handlers.
  void on_child_frame(Incoming& in);
  void on_parent_frame(Incoming& in);
  void on_hello(Child& c, const wire::ParsedFrame& f);
  void on_delta(Child& c, const wire::ParsedFrame& f);
  void on_telemetry(Child& c, const wire::ParsedFrame& f);
  void on_parent_welcome(const wire::ParsedFrame& f);
  void on_parent_anchor(const wire::ParsedFrame& f, const uint8_t* raw, size_t raw_size);

  // Steps of the protocol.
  void all_children_joined();
  void welcome_children(uint64_t round, bool no_change, const std::vector<uint8_t>& payload);
  void send_full_anchor(const Child& c);
  void open_round(uint64_t round);
  void complete_chunk(uint32_t chunk);
  void complete_round();
  void try_finish_round_report(uint64_t round);
  void try_send_telemetry(uint64_t round);
  void check_deadlines();
  // Ends run() once the last round is reported and every child confirmed it
  // holds the final model (or the wait for that ran out): closing a socket
  // earlier could lose the last frames still on their way.
  void maybe_finish();

  // Sending never blocks the event loop: frames wait in a per-peer outbox
  // and go out as the peer's window opens (see flush()). What can wait is
  // bounded by the protocol: one round's chunks per direction, and anchor
  // frames are shared by all children's outboxes.
  using Frame = std::shared_ptr<const std::vector<uint8_t>>;
  struct Outgoing {
    Frame frame;
    wire::FrameHeader header;
  };
  struct Outbox {
    std::deque<Outgoing> frames;
    Clock::time_point waiting_since;  // when the head frame started waiting
    uint64_t sent = 0;
  };
  void send_child(const Child& c, Frame frame, const wire::FrameHeader& h);
  void send_child(const Child& c, std::vector<uint8_t> frame, const wire::FrameHeader& h) {
    send_child(c, std::make_shared<const std::vector<uint8_t>>(std::move(frame)), h);
  }
  void send_parent(std::vector<uint8_t> frame);
  // Sends what the windows take; returns true when every outbox is empty.
  bool flush();
  bool outboxes_empty() const;
  void refuse(const std::string& peer, const std::string& reason, bool count = true);
  void send_done(uint64_t rounds);
  void init_model_state(uint64_t total_elements);

  AggregatorOptions opt_;
  const Topology& topo_;
  const NodeSpec& self_;
  const bool is_root_;
  const Codec* codec_;
  wire::FrameLimits limits_;
  Millis round_timeout_;
  uint32_t region_children_ = 0;

  // Declared before the links: their security layers report to it.
  std::unique_ptr<runtime::NodeSecurity> security_;
  zmq::context_t ctx_{1};
  std::unique_ptr<ChildrenLink> children_link_;
  std::unique_ptr<ParentLink> parent_link_;

  std::vector<Child> children_;
  std::unordered_map<std::string, size_t> child_slot_;

  Phase phase_ = Phase::kJoining;
  uint64_t round_ = 0;
  uint64_t total_elements_ = 0;
  std::optional<ChunkPlan> plan_;
  std::optional<RoundAccumulator> acc_;
  Clock::time_point phase_deadline_;
  Clock::time_point round_started_;

  // Root: the global model, the model every child holds (global minus what
  // the down-path encoding has not delivered yet), the outer optimizer.
  std::vector<float> global_, held_;
  std::array<uint8_t, 32> model_digest_{};
  std::unique_ptr<OuterOptimizer> outer_;
  std::map<uint64_t, PendingReport> pending_reports_;

  // Region: error-feedback residual of the forwarded means (lossy codecs),
  // anchor relay progress, the parent's welcome payload.
  std::vector<float> residual_;
  uint64_t relay_round_ = 0;
  uint32_t relayed_chunks_ = 0;
  uint64_t relayed_through_ = 0;  // anchors relayed for rounds < this
  bool done_from_parent_ = false;
  Clock::time_point finish_deadline_;
  uint64_t telemetry_sent_through_ = 0;  // telemetry sent for rounds < this

  std::vector<Outbox> child_out_;  // by child slot
  Outbox parent_out_;

  TrafficLedger ledger_;
  std::map<uint64_t, SubtreeTraffic> subtree_;
  AggregatorSummary summary_;
};

Aggregator::Impl::Impl(AggregatorOptions options)
    : opt_(std::move(options)),
      topo_(opt_.topology),
      self_(topo_.node(opt_.node_id)),
      is_root_(self_.role == Role::kRoot),
      codec_(&codec_by_name(topo_.federation().codec)) {
  if (self_.role == Role::kSite) {
    throw ConfigError("node '" + self_.id + "' is a site; run it with `fedwan site`");
  }
  round_timeout_ = opt_.round_timeout.value_or(
      Millis(static_cast<int64_t>(topo_.federation().round_timeout_s * 1000)));
  limits_.max_chunk_elements = static_cast<uint32_t>(topo_.federation().chunk_bytes / 4);
  if (is_root_) {
    if (opt_.initial_model.empty()) {
      throw ConfigError("root '" + self_.id + "' needs an initial model (flat fp32 parameters)");
    }
    global_ = std::move(opt_.initial_model);
    init_model_state(global_.size());
    held_ = global_;
    model_digest_ = sha256(global_.data(), global_.size() * sizeof(float));
    outer_ = make_outer_optimizer(topo_.federation().outer, global_.size());
  } else if (!opt_.initial_model.empty()) {
    throw ConfigError("only the root takes an initial model; '" + self_.id + "' is a region");
  }
  for (uint32_t idx : self_.children) {
    const NodeSpec& n = topo_.node(idx);
    Child c;
    c.index = idx;
    c.id = n.id;
    c.is_site = n.role == Role::kSite;
    if (!c.is_site) region_children_ += 1;
    child_slot_[c.id] = children_.size();
    children_.push_back(std::move(c));
  }
  child_out_.resize(children_.size());
  LinkOptions lo;
  lo.window = opt_.window;
  lo.max_message_bytes = static_cast<int64_t>(wire::kHeaderSize + topo_.federation().chunk_bytes +
                                              4096);
  const std::string bind = self_.bind.empty() ? self_.endpoint : self_.bind;
  security_ = std::make_unique<runtime::NodeSecurity>(opt_.security, topo_, self_);
  children_link_ = std::make_unique<ChildrenLink>(ctx_, bind, lo, security_->children_factory());
  if (!is_root_) {
    const NodeSpec& parent = topo_.node(self_.parent_index);
    parent_link_ = std::make_unique<ParentLink>(ctx_, parent.endpoint, self_.id, lo,
                                                security_->parent_factory());
  }
  log().info("[agg:{}] {} serving {} children on {}", self_.id, role_name(self_.role),
             children_.size(), bind);
}

void Aggregator::Impl::init_model_state(uint64_t total_elements) {
  total_elements_ = total_elements;
  limits_.max_total_elements = total_elements;
  plan_ = ChunkPlan::from_bytes(total_elements, topo_.federation().chunk_bytes);
  std::vector<uint32_t> ids;
  for (uint32_t idx : self_.children) ids.push_back(idx);
  acc_.emplace(*plan_, ids);
}

// ---- sending ------------------------------------------------------------------

void Aggregator::Impl::send_child(const Child& c, Frame frame, const wire::FrameHeader& h) {
  Outbox& box = child_out_[child_slot_.at(c.id)];
  if (box.frames.empty()) box.waiting_since = Clock::now();
  box.frames.push_back({std::move(frame), h});
  flush();
}

void Aggregator::Impl::send_parent(std::vector<uint8_t> frame) {
  if (parent_out_.frames.empty()) parent_out_.waiting_since = Clock::now();
  parent_out_.frames.push_back(
      {std::make_shared<const std::vector<uint8_t>>(std::move(frame)), wire::FrameHeader{}});
  flush();
}

bool Aggregator::Impl::flush() {
  for (size_t i = 0; i < children_.size(); ++i) {
    Outbox& box = child_out_[i];
    while (!box.frames.empty()) {
      const Outgoing& head = box.frames.front();
      std::optional<size_t> sent;
      try {
        sent = children_link_->try_send(children_[i].id, *head.frame);
      } catch (const TransportError&) {
        if (head.header.type != wire::MsgType::kDone) throw;
        // A site that already holds the final anchor may have left: fine.
        box.frames.pop_front();
        continue;
      }
      if (!sent) break;
      ledger_.charge_frame(head.header, *sent, round_);
      box.sent += 1;
      box.frames.pop_front();
      box.waiting_since = Clock::now();
    }
  }
  while (!parent_out_.frames.empty()) {
    if (!parent_link_->try_send(*parent_out_.frames.front().frame)) break;
    parent_out_.frames.pop_front();
    parent_out_.waiting_since = Clock::now();
  }
  return outboxes_empty();
}

bool Aggregator::Impl::outboxes_empty() const {
  if (!parent_out_.frames.empty()) return false;
  for (const Outbox& box : child_out_) {
    if (!box.frames.empty()) return false;
  }
  return true;
}

void Aggregator::Impl::refuse(const std::string& peer, const std::string& reason, bool count) {
  if (count) summary_.rejected_frames += 1;
  log().warn("[agg:{}] refused '{}': {}", self_.id, peer, reason);
  security_->audit("refusal", {{"peer", peer}, {"round", round_}, {"reason", reason}});
  try {
    // Best effort and never queued: a refused peer may not be reading.
    (void)children_link_->try_send(peer, reject_frame(topo_, self_.index, round_, reason));
  } catch (const Error& e) {
    // An unknown or vanished peer cannot be told; the refusal is logged.
    log().debug("[agg:{}] could not deliver refusal to '{}': {}", self_.id, peer, e.what());
  }
}

void Aggregator::Impl::send_done(uint64_t rounds) {
  for (const Child& c : children_) {
    wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kDone, rounds);
    send_child(c, make_frame(h, {}), h);
  }
}

// ---- event loop ---------------------------------------------------------------

AggregatorSummary Aggregator::Impl::run() {
  phase_deadline_ = Clock::now() + opt_.join_timeout;
  while (phase_ != Phase::kDone) {
    if (stop_requested.load()) throw Error("aggregator '" + self_.id + "' stopped");
    const bool pending = !flush();
    zmq::pollitem_t items[2] = {
        {children_link_->socket().handle(), 0, ZMQ_POLLIN, 0},
        {parent_link_ ? parent_link_->socket().handle() : nullptr, 0,
         static_cast<short>(ZMQ_POLLIN | (parent_out_.frames.empty() ? 0 : ZMQ_POLLOUT)), 0}};
    // A ROUTER cannot signal room for one particular child, so while frames
    // wait the loop polls briefly instead of sleeping.
    zmq::poll(items, parent_link_ ? 2 : 1, pending ? Millis(2) : kPoll);
    Incoming in;
    // Drain a bounded batch per socket so neither side starves the other.
    for (int i = 0; i < 64 && children_link_->recv(&in, Millis(0)); ++i) on_child_frame(in);
    if (parent_link_) {
      for (int i = 0; i < 64 && phase_ != Phase::kDone && parent_link_->recv(&in, Millis(0)); ++i) {
        on_parent_frame(in);
      }
    }
    maybe_finish();
    check_deadlines();
  }
  // Deliver what is still queued (the last anchors, done, telemetry).
  const auto deadline = Clock::now() + std::min<Millis>(round_timeout_, Millis(30000));
  while (!flush() && Clock::now() < deadline) {
    zmq::pollitem_t item{children_link_->socket().handle(), 0, ZMQ_POLLOUT, 0};
    zmq::poll(&item, 1, Millis(2));
  }
  for (size_t i = 0; i < children_.size(); ++i) {
    log().debug("[agg:{}] sent {} frames to '{}'", self_.id, child_out_[i].sent, children_[i].id);
  }
  if (!outboxes_empty()) {
    size_t left = parent_out_.frames.size();
    for (const Outbox& box : child_out_) left += box.frames.size();
    log().warn("[agg:{}] {} frames were not delivered before shutdown", self_.id, left);
  }
  summary_.rejected_frames += children_link_->counters().rejected;
  summary_.security_mode =
      security_->plaintext() ? "plaintext" : "mtls/" + opt_.security.cipher;
  summary_.handshake_ms = security_->handshake_ms();
  if (is_root_) summary_.global_model = global_;
  return summary_;
}

void Aggregator::Impl::maybe_finish() {
  if (phase_ != Phase::kDraining) return;
  const bool reported = is_root_ ? pending_reports_.empty()
                                 : telemetry_sent_through_ >= relayed_through_;
  if (!reported) return;
  std::string missing;
  for (const Child& c : children_) {
    if (!c.confirmed_end) missing += (missing.empty() ? "" : ", ") + c.id;
  }
  if (!missing.empty()) {
    if (Clock::now() < finish_deadline_) return;
    log().warn("[agg:{}] finishing although {} did not confirm the final model", self_.id,
               missing);
  }
  if (!is_root_) {
    send_parent(make_frame(
        node_header(topo_, self_.index, wire::MsgType::kDone, topo_.federation().rounds), {}));
  }
  phase_ = Phase::kDone;
}

void Aggregator::Impl::check_deadlines() {
  const auto now = Clock::now();
  for (size_t i = 0; i < children_.size(); ++i) {
    const Outbox& box = child_out_[i];
    if (!box.frames.empty() && now - box.waiting_since > round_timeout_) {
      throw TimeoutError("aggregator '" + self_.id + "': child '" + children_[i].id +
                         "' has not read for " + std::to_string(round_timeout_.count() / 1000) +
                         " s (" + std::to_string(box.frames.size()) + " frames waiting)");
    }
  }
  if (!parent_out_.frames.empty() && now - parent_out_.waiting_since > round_timeout_) {
    throw TimeoutError("aggregator '" + self_.id + "': parent '" +
                       topo_.node(self_.parent_index).id + "' has not read for " +
                       std::to_string(round_timeout_.count() / 1000) + " s");
  }
  if (now < phase_deadline_) return;
  std::string missing;
  auto add = [&](const std::string& id) { missing += (missing.empty() ? "" : ", ") + id; };
  switch (phase_) {
    case Phase::kJoining:
      for (const Child& c : children_) {
        if (!c.joined) add(c.id);
      }
      throw TimeoutError("aggregator '" + self_.id + "': children did not join within " +
                         std::to_string(opt_.join_timeout.count() / 1000) + " s: " + missing);
    case Phase::kTraining:
      for (uint32_t idx : acc_->missing_children()) add(topo_.node(idx).id);
      throw TimeoutError("aggregator '" + self_.id + "': round " + std::to_string(round_) +
                         " did not complete within " +
                         std::to_string(round_timeout_.count() / 1000) +
                         " s; still waiting for: " + missing);
    case Phase::kAwaitWelcome:
    case Phase::kAwaitAnchor:
      throw TimeoutError("aggregator '" + self_.id + "': no answer from parent '" +
                         topo_.node(self_.parent_index).id + "' at " +
                         parent_link_->endpoint() + " within " +
                         std::to_string(round_timeout_.count() / 1000) + " s");
    case Phase::kDraining:
      throw TimeoutError("aggregator '" + self_.id + "': regions did not report the traffic "
                         "of the last round");
    case Phase::kDone:
      return;
  }
}

void Aggregator::Impl::on_child_frame(Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, limits_);
  auto slot = child_slot_.find(in.peer);
  if (slot == child_slot_.end()) {
    refuse(in.peer, "node '" + in.peer + "' is not a child of '" + self_.id +
                        "' in topology " + topo_.digest_hex().substr(0, 12));
    return;
  }
  Child& c = children_[slot->second];
  if (!f.ok()) {
    ledger_.charge(round_, in.message.size(), in.message.size());
    summary_.rejected_frames += 1;
    log().warn("[agg:{}] dropped malformed frame from '{}': {} ({})", self_.id, c.id,
               wire::reject_reason_name(f.reject), f.detail);
    return;
  }
  ledger_.charge_frame(f.header, in.message.size(), round_);
  if (f.header.job_id != topo_.job_id()) {
    refuse(c.id, "frame for another federation (job id mismatch); check the topology's job");
    return;
  }
  if (f.header.sender != c.index) {
    refuse(c.id, "sender id " + std::to_string(f.header.sender) + " does not match node '" +
                     c.id + "' (id " + std::to_string(c.index) + ")");
    return;
  }
  switch (f.header.type) {
    case wire::MsgType::kHello: on_hello(c, f); break;
    case wire::MsgType::kDelta: on_delta(c, f); break;
    case wire::MsgType::kTelemetry: on_telemetry(c, f); break;
    case wire::MsgType::kDone:
      c.confirmed_end = true;
      maybe_finish();
      break;
    case wire::MsgType::kReject:
      log().warn("[agg:{}] child '{}' reports: {}", self_.id, c.id,
                 std::string(reinterpret_cast<const char*>(f.payload), f.payload_size));
      break;
    default:
      refuse(c.id, std::string("unexpected ") + wire::msg_type_name(f.header.type) +
                       " from a child");
  }
}

// ---- joining ------------------------------------------------------------------

void Aggregator::Impl::on_hello(Child& c, const wire::ParsedFrame& f) {
  wire::HelloPayload hello;
  if (!wire::decode_hello(f.payload, f.payload_size, &hello)) {
    refuse(c.id, "malformed hello");
    return;
  }
  if (hello.node_id != c.id) {
    refuse(c.id, "hello names node '" + hello.node_id + "' but the connection is '" + c.id + "'");
    return;
  }
  if (hello.topology_digest != topo_.digest()) {
    refuse(c.id, "topology mismatch: '" + c.id + "' has digest " +
                     to_hex(hello.topology_digest.data(), 32).substr(0, 12) + ", '" + self_.id +
                     "' has " + topo_.digest_hex().substr(0, 12) +
                     "; every node must load the same topology file");
    return;
  }
  const uint64_t n = f.header.total_elements;
  if (total_elements_ != 0 && n != total_elements_) {
    refuse(c.id, "model has " + std::to_string(n) + " parameters; this federation's has " +
                     std::to_string(total_elements_));
    return;
  }
  if (c.welcomed) {
    log().info("[agg:{}] '{}' said hello again; it is already in", self_.id, c.id);
    return;
  }
  if (phase_ != Phase::kJoining) {
    refuse(c.id, "joining after round " + std::to_string(round_) + " started is not supported "
                 "yet; restart the federation");
    return;
  }
  if (total_elements_ == 0) init_model_state(n);  // a region learns the size from its children
  c.joined = true;
  c.hello = hello;
  log().info("[agg:{}] '{}' joined ({} parameters)", self_.id, c.id, n);
  for (const Child& other : children_) {
    if (!other.joined) return;
  }
  all_children_joined();
}

void Aggregator::Impl::all_children_joined() {
  if (is_root_) {
    for (Child& c : children_) {
      const bool same = c.hello.model_digest == model_digest_;
      std::vector<uint8_t> payload(model_digest_.begin(), model_digest_.end());
      wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kWelcome, 0);
      h.total_elements = total_elements_;
      h.flags = same ? wire::kFlagNoChange : 0;
      send_child(c, make_frame(h, payload), h);
      c.welcomed = true;
      if (!same) send_full_anchor(c);
    }
    open_round(0);
    return;
  }
  // A region joins upward for its whole subtree. If all children start from
  // one model it reports that digest; otherwise none, so a full anchor flows.
  wire::HelloPayload up;
  up.node_id = self_.id;
  up.topology_digest = topo_.digest();
  up.model_digest = children_.front().hello.model_digest;
  for (const Child& c : children_) {
    if (c.hello.model_digest != up.model_digest) up.model_digest = {};
  }
  wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kHello, 0);
  h.total_elements = total_elements_;
  send_parent(make_frame(h, wire::encode_hello(up)));
  phase_ = Phase::kAwaitWelcome;
  phase_deadline_ = Clock::now() + round_timeout_;
}

void Aggregator::Impl::send_full_anchor(const Child& c) {
  const Codec& fp32 = *codec_by_id(CodecId::kFp32);
  for (uint32_t i = 0; i < plan_->count(); ++i) {
    const uint32_t n = plan_->size(i);
    std::vector<uint8_t> payload(fp32.encoded_size(n));
    fp32.encode(held_.data() + plan_->offset(i), n, nullptr, payload.data());
    wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kAnchor, round_);
    h.codec = static_cast<uint8_t>(CodecId::kFp32);
    h.flags = wire::kFlagFullAnchor;
    h.chunk_index = i;
    h.chunk_count = plan_->count();
    h.element_count = n;
    h.total_elements = total_elements_;
    send_child(c, make_frame(h, payload), h);
  }
}

void Aggregator::Impl::welcome_children(uint64_t round, bool no_change,
                                        const std::vector<uint8_t>& payload) {
  for (Child& c : children_) {
    wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kWelcome, round);
    h.total_elements = total_elements_;
    h.flags = no_change ? wire::kFlagNoChange : 0;
    send_child(c, make_frame(h, payload), h);
    c.welcomed = true;
  }
}

// ---- rounds -------------------------------------------------------------------

void Aggregator::Impl::open_round(uint64_t round) {
  round_ = round;
  acc_->open(round);
  if (is_root_) outer_->begin_round(round);
  phase_ = Phase::kTraining;
  round_started_ = Clock::now();
  phase_deadline_ = round_started_ + round_timeout_;
  log().info("[agg:{}] round {} open", self_.id, round);
}

void Aggregator::Impl::on_delta(Child& c, const wire::ParsedFrame& f) {
  const wire::FrameHeader& h = f.header;
  if (!acc_ || phase_ == Phase::kJoining || phase_ == Phase::kAwaitWelcome) {
    refuse(c.id, "delta before the federation started");
    return;
  }
  const Codec* codec = codec_by_wire_id(h.codec);
  RoundAccumulator::Result r{AddOutcome::kBadChunk};
  if (h.total_elements == total_elements_ && h.chunk_count == plan_->count()) {
    r = acc_->add(h.round, c.index, h.chunk_index, h.element_count, h.weight, *codec, f.payload,
                  f.payload_size);
  }
  if (security_->auditing()) {
    const Sha256Digest d = sha256(f.payload, f.payload_size);
    security_->audit("update", {{"sender", c.id},
                                {"round", h.round},
                                {"chunk", h.chunk_index},
                                {"chunks", h.chunk_count},
                                {"bytes", f.payload_size},
                                {"weight", h.weight},
                                {"sha256", to_hex(d.data(), d.size())},
                                {"decision", r.outcome == AddOutcome::kAccepted
                                                 ? "accepted"
                                                 : add_outcome_name(r.outcome)}});
  }
  switch (r.outcome) {
    case AddOutcome::kAccepted:
      if (r.chunk_complete) complete_chunk(h.chunk_index);
      if (acc_->round_complete()) complete_round();
      return;
    case AddOutcome::kDuplicate:
    case AddOutcome::kStale:
      summary_.rejected_frames += 1;
      log().info("[agg:{}] ignored {} delta from '{}' (round {}, chunk {})", self_.id,
                 add_outcome_name(r.outcome), c.id, h.round, h.chunk_index);
      return;
    case AddOutcome::kBadChunk:
      refuse(c.id, "delta chunk " + std::to_string(h.chunk_index) + "/" +
                       std::to_string(h.chunk_count) + " of round " + std::to_string(h.round) +
                       " has " + std::to_string(h.element_count) + " of " +
                       std::to_string(h.total_elements) + " elements; expected chunk " +
                       "size " + std::to_string(h.chunk_index < plan_->count()
                                                    ? plan_->size(h.chunk_index)
                                                    : 0) +
                       " of " + std::to_string(total_elements_) + " in " +
                       std::to_string(plan_->count()) + " chunks");
      return;
    case AddOutcome::kBadPayload:
      refuse(c.id, "delta chunk " + std::to_string(h.chunk_index) + " of round " +
                       std::to_string(h.round) + " has a malformed or non-finite payload");
      return;
    case AddOutcome::kFuture:
    case AddOutcome::kUnknownSender:
      refuse(c.id, std::string("delta refused: ") + add_outcome_name(r.outcome));
      return;
  }
}

void Aggregator::Impl::complete_chunk(uint32_t chunk) {
  if (!is_root_) {
    // Residency: an aggregate leaves the region only if it mixes at least
    // k_min sites (every child contributes to every chunk in this protocol;
    // the topology was checked at load, this guards the invariant at run
    // time before anything is sent upward).
    size_t sites = 0;
    for (const Child& c : children_) sites += topo_.sites_under(c.index).size();
    const uint32_t k_min = topo_.k_min_for(self_.index);
    if (sites < k_min) {
      const std::string why = "region '" + self_.id + "' would forward an aggregate of " +
                              std::to_string(sites) + " site(s); residency policy requires " +
                              std::to_string(k_min);
      security_->audit("policy_refusal", {{"round", round_}, {"chunk", chunk}, {"reason", why}});
      throw ProtocolError(why);
    }
  }
  ChunkSum cs = acc_->take(chunk);
  const uint64_t off = plan_->offset(chunk);
  const uint32_t n = plan_->size(chunk);
  std::vector<uint8_t> payload(codec_->encoded_size(n));
  if (is_root_) {
    outer_->step(global_.data() + off, cs.mean.data(), off, n);
    // Send what the children need to move from `held` to the new global
    // model; `held` then advances by exactly what they decode, so whatever
    // the encoding lost is carried into the next round's update.
    for (uint32_t k = 0; k < n; ++k) cs.mean[k] = global_[off + k] - held_[off + k];
    codec_->encode(cs.mean.data(), n, nullptr, payload.data());
    codec_->decode_accumulate(payload.data(), n, 1.0f, held_.data() + off);
    wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kAnchor, round_ + 1);
    h.codec = static_cast<uint8_t>(codec_->id());
    h.chunk_index = chunk;
    h.chunk_count = plan_->count();
    h.element_count = n;
    h.total_elements = total_elements_;
    const Frame frame = std::make_shared<const std::vector<uint8_t>>(make_frame(h, payload));
    for (const Child& c : children_) send_child(c, frame, h);
    pending_reports_[round_].report.weight = cs.weight;
    return;
  }
  float* residual = nullptr;
  if (codec_->id() != CodecId::kFp32) {
    if (residual_.empty()) residual_.assign(total_elements_, 0.0f);
    residual = residual_.data() + off;
  }
  codec_->encode(cs.mean.data(), n, residual, payload.data());
  wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kDelta, round_);
  h.codec = static_cast<uint8_t>(codec_->id());
  h.chunk_index = chunk;
  h.chunk_count = plan_->count();
  h.element_count = n;
  h.total_elements = total_elements_;
  h.weight = cs.weight;
  send_parent(make_frame(h, payload));
}

void Aggregator::Impl::complete_round() {
  // A round lasts from the end of the previous one to the end of this one,
  // so time spent in on_model (while the sites already train) is counted.
  const auto now = Clock::now();
  const double secs = std::chrono::duration<double>(now - round_started_).count();
  log().info("[agg:{}] round {} complete in {:.2f} s", self_.id, round_, secs);
  security_->audit("round_closed", {{"round", round_}, {"children", children_.size()}});
  security_->audit_sync();
  if (!is_root_) {
    phase_ = Phase::kAwaitAnchor;
    phase_deadline_ = Clock::now() + round_timeout_;
    return;
  }
  PendingReport& pending = pending_reports_[round_];
  pending.report.round = round_;
  pending.report.seconds = secs;
  pending.complete = true;
  if (opt_.on_model) opt_.on_model(round_, global_);
  const uint64_t finished = round_;
  if (round_ + 1 == topo_.federation().rounds) {
    send_done(round_ + 1);
    round_ += 1;
    phase_ = Phase::kDraining;
    phase_deadline_ = Clock::now() + round_timeout_;
    finish_deadline_ = Clock::now() + std::min<Millis>(round_timeout_, Millis(30000));
  } else {
    open_round(round_ + 1);
    round_started_ = now;
  }
  try_finish_round_report(finished);
}

// ---- traffic reports ------------------------------------------------------------

void Aggregator::Impl::on_telemetry(Child& c, const wire::ParsedFrame& f) {
  wire::TelemetryPayload t;
  if (c.is_site || !wire::decode_telemetry(f.payload, f.payload_size, &t)) {
    refuse(c.id, "unexpected or malformed telemetry");
    return;
  }
  SubtreeTraffic& s = subtree_[f.header.round];
  s.reports += 1;
  s.traffic += Traffic{t.wan_bytes, t.fp32_bytes, t.frames};
  if (is_root_) {
    try_finish_round_report(f.header.round);
  } else {
    try_send_telemetry(f.header.round);
  }
}

void Aggregator::Impl::try_finish_round_report(uint64_t round) {
  auto rep = pending_reports_.find(round);
  if (rep == pending_reports_.end() || !rep->second.complete) return;
  auto sub = subtree_.find(round);
  const uint32_t reports = sub == subtree_.end() ? 0 : sub->second.reports;
  if (reports < region_children_) return;
  Traffic t = ledger_.take(round);
  if (sub != subtree_.end()) {
    t += sub->second.traffic;
    subtree_.erase(sub);
  }
  RoundReport out = rep->second.report;
  pending_reports_.erase(rep);
  out.wan_bytes = t.wan_bytes;
  out.fp32_bytes = t.fp32_bytes;
  out.frames = t.frames;
  summary_.reports.push_back(out);
  summary_.rounds = round + 1;
  summary_.wan_bytes_total += out.wan_bytes;
  summary_.fp32_bytes_total += out.fp32_bytes;
  if (opt_.on_round) opt_.on_round(out);
  maybe_finish();
}

void Aggregator::Impl::try_send_telemetry(uint64_t round) {
  if (round >= relayed_through_ || round < telemetry_sent_through_) return;
  auto sub = subtree_.find(round);
  const uint32_t reports = sub == subtree_.end() ? 0 : sub->second.reports;
  if (reports < region_children_) return;
  Traffic t = ledger_.take(round);
  if (sub != subtree_.end()) {
    t += sub->second.traffic;
    subtree_.erase(sub);
  }
  wire::TelemetryPayload p{t.wan_bytes, t.fp32_bytes, t.frames};
  send_parent(make_frame(node_header(topo_, self_.index, wire::MsgType::kTelemetry, round),
                         wire::encode_telemetry(p)));
  telemetry_sent_through_ = round + 1;
  RoundReport rep;
  rep.round = round;
  rep.wan_bytes = t.wan_bytes;
  rep.fp32_bytes = t.fp32_bytes;
  rep.frames = t.frames;
  summary_.reports.push_back(rep);
  summary_.rounds = round + 1;
  summary_.wan_bytes_total += t.wan_bytes;
  summary_.fp32_bytes_total += t.fp32_bytes;
  if (opt_.on_round) opt_.on_round(rep);
  maybe_finish();
}

// ---- the parent side (regions) ----------------------------------------------------

void Aggregator::Impl::on_parent_frame(Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, limits_);
  if (!f.ok()) {
    summary_.rejected_frames += 1;
    log().warn("[agg:{}] dropped malformed frame from parent: {} ({})", self_.id,
               wire::reject_reason_name(f.reject), f.detail);
    return;
  }
  if (f.header.job_id != topo_.job_id() || f.header.sender != self_.parent_index) {
    summary_.rejected_frames += 1;
    log().warn("[agg:{}] dropped frame with wrong job or sender from parent", self_.id);
    return;
  }
  switch (f.header.type) {
    case wire::MsgType::kWelcome: on_parent_welcome(f); break;
    case wire::MsgType::kAnchor: on_parent_anchor(f, in.data(), in.frame_size); break;
    case wire::MsgType::kReject: {
      const std::string reason(reinterpret_cast<const char*>(f.payload), f.payload_size);
      for (const Child& c : children_) {
        refuse(c.id, "parent '" + topo_.node(self_.parent_index).id + "' refused '" + self_.id +
                         "': " + reason, false);
      }
      throw ProtocolError("parent '" + topo_.node(self_.parent_index).id + "' refused '" +
                          self_.id + "': " + reason);
    }
    case wire::MsgType::kDone:
      send_done(f.header.round);
      done_from_parent_ = true;
      phase_ = Phase::kDraining;
      phase_deadline_ = Clock::now() + round_timeout_;
      finish_deadline_ = Clock::now() + std::min<Millis>(round_timeout_, Millis(30000));
      maybe_finish();
      break;
    default:
      summary_.rejected_frames += 1;
      log().warn("[agg:{}] unexpected {} from parent", self_.id, wire::msg_type_name(f.header.type));
  }
}

void Aggregator::Impl::on_parent_welcome(const wire::ParsedFrame& f) {
  if (phase_ != Phase::kAwaitWelcome) {
    log().info("[agg:{}] ignored a repeated welcome", self_.id);
    return;
  }
  if (f.header.total_elements != total_elements_) {
    throw ProtocolError("parent welcomed '" + self_.id + "' with a model of " +
                        std::to_string(f.header.total_elements) + " parameters, children have " +
                        std::to_string(total_elements_));
  }
  std::vector<uint8_t> payload(f.payload, f.payload + f.payload_size);
  welcome_children(f.header.round, (f.header.flags & wire::kFlagNoChange) != 0, payload);
  relayed_through_ = f.header.round;
  telemetry_sent_through_ = f.header.round;
  open_round(f.header.round);
}

void Aggregator::Impl::on_parent_anchor(const wire::ParsedFrame& f, const uint8_t* raw,
                                        size_t raw_size) {
  const wire::FrameHeader& h = f.header;
  const bool full = (h.flags & wire::kFlagFullAnchor) != 0;
  // A full anchor belongs to the round being trained; an update opens the next.
  const uint64_t expected = full ? round_ : round_ + 1;
  if (h.round != expected || h.total_elements != total_elements_ ||
      h.chunk_count != plan_->count() || h.element_count != plan_->size(h.chunk_index)) {
    throw ProtocolError("parent sent an anchor chunk that does not fit (round " +
                        std::to_string(h.round) + ", chunk " + std::to_string(h.chunk_index) +
                        "), expected round " + std::to_string(expected));
  }
  if (relay_round_ != h.round || relayed_chunks_ == 0) {
    relay_round_ = h.round;
  }
  // Relay the chunk as it is, re-addressed from this node: no decode.
  wire::FrameHeader out = h;
  out.sender = self_.index;
  auto bytes = std::make_shared<std::vector<uint8_t>>(raw, raw + raw_size);
  wire::encode_header(out, bytes->data());
  const Frame frame = std::move(bytes);
  for (const Child& c : children_) send_child(c, frame, out);
  relayed_chunks_ += 1;
  if (relayed_chunks_ < plan_->count()) return;
  relayed_chunks_ = 0;
  if (full) return;
  relayed_through_ = h.round;
  if (h.round < topo_.federation().rounds) open_round(h.round);
  try_send_telemetry(h.round - 1);
}

// ---- public facade ----------------------------------------------------------------

Aggregator::Aggregator(AggregatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
Aggregator::~Aggregator() = default;
AggregatorSummary Aggregator::run() { return impl_->run(); }
void Aggregator::stop() { impl_->stop_requested.store(true); }

}  // namespace fedwan

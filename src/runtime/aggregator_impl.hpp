// The state and steps of one aggregator node (root or region), private to
// the two translation units that implement it:
//   aggregator.cpp         construction, the per-peer outboxes, the event
//                          loop, frame dispatch, deadlines, shutdown;
//   aggregator_rounds.cpp  the round protocol: joining, deltas, chunk and
//                          round completion, anchor relay, traffic reports.
// Thread safety: everything but stop_requested belongs to run()'s thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "runtime/node_security.hpp"
#include "runtime/traffic.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan {

class Aggregator::Impl {
 public:
  explicit Impl(AggregatorOptions options);
  AggregatorSummary run();
  std::atomic<bool> stop_requested{false};

 private:
  using Clock = std::chrono::steady_clock;

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

}  // namespace fedwan

// The state and steps of one aggregator node that every role shares
// (root, region, standby), private to the translation units that implement
// it; what differs between the roles is behind Role (aggregator/role.hpp):
//   aggregator.cpp          the per-peer outboxes, the event loop, the
//                           children's frame dispatch, deadlines, shutdown;
//   aggregator_setup.cpp    construction, and where the role is chosen;
//   aggregator_rounds.cpp   the round protocol: joining, deltas, chunk and
//                           round completion, traffic reports;
//   aggregator_recovery.cpp fault tolerance: rejoins, heartbeats and lost
//                           children, deadlines and quorum;
//   aggregator_checkpoints.cpp checkpoints and resuming from them;
//   aggregator_membership.cpp elastic membership: who counts in the quorum,
//                           leaves, pauses, newcomers;
//   aggregator_replicas.cpp checkpoint replication: children's replicas kept
//                           and served back, this node's checkpoint sent up;
//   aggregator_pacing.cpp   how far each site's upload may run ahead.
//   aggregator_topology.cpp, aggregator_metrics.cpp, aggregator_costs.cpp
//                           topology versions, metrics and status, cost
//                           records.
// The state: down_ (the children: the pure ChildTable and the downlink),
// the model's shape, the round in progress and its clocks, repl_
// (replication), the pure RoundBook, and role_.
// Thread safety: everything but stop_requested belongs to run()'s thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregation/round_accumulator.hpp"
#include "aggregator/child.hpp"
#include "aggregator/child_claims.hpp"
#include "aggregator/child_table.hpp"
#include "aggregator/delta_inspection.hpp"
#include "aggregator/downlink.hpp"
#include "aggregator/round_book.hpp"
#include "aggregator/round_wait.hpp"
#include "aggregator/uplink_pacer.hpp"
#include "checkpoint/checkpoint_upload.hpp"
#include "checkpoint/replica_store.hpp"
#include "common/byte_pool.hpp"
#include "common/keep_alive.hpp"
#include "common/stall_clock.hpp"
#include "costs/cost_recorder.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "node/event_timers.hpp"
#include "node/node_config.hpp"
#include "node/node_metrics.hpp"
#include "node/node_security.hpp"
#include "node/traffic.hpp"
#include "session/uplink.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan {

class Aggregator::Impl {
 public:
  using Millis = std::chrono::milliseconds;
  explicit Impl(AggregatorOptions options);
  ~Impl();
  AggregatorSummary run();
  std::atomic<bool> stop_requested{false};

  // What differs between the roles (aggregator/role.hpp); nested, so that
  // they share the node's state without it being public.
  class Role;
  class RootRole;
  class StandbyRole;
  class RegionRole;
  class RegionLink;

 private:
  using Clock = std::chrono::steady_clock;

  using Away = aggregator::Away;
  using Child = aggregator::Child;

  enum class Phase { kJoining, kAwaitWelcome, kTraining, kAwaitAnchor, kDraining, kDone };

  // Construction, in steps.
  void check_options() const;  // throws ConfigError
  void init_root_model();
  void init_children();
  void add_child(uint32_t idx, bool late);   // a child of the topology, not waited for if late
  void open_links(const std::string& bind);  // the children's
  std::unique_ptr<Role> make_role();         // the role this node's topology entry names

  // Event handlers.
  void on_child_frame(transport::Incoming& in);
  void on_hello(Child& c, const wire::ParsedFrame& f);
  // `facts`: worked out on the crypto thread that opened the frame, if it was.
  void on_delta(Child& c, const wire::ParsedFrame& f, const aggregator::DeltaFacts* facts);
  // The steps of on_delta: its audit entry (and recorded copy), and what the
  // accumulator's verdict leads to.
  static const char* delta_decision(const aggregation::RoundAccumulator::Result& r,
                                    const wire::ParsedFrame& f);
  void audit_delta(const Child& c, const wire::ParsedFrame& f, const aggregator::DeltaWeight& w,
                   const Codec& codec, const char* decision,
                   const aggregation::RoundAccumulator::Result& r, const Sha256Digest* sha);
  static void verdict_fields(const aggregation::CopyVerdict& v, nlohmann::json& fields);
  void on_delta_added(Child& c, const wire::FrameHeader& h,
                      const aggregation::RoundAccumulator::Result& r);
  void take_unclipped_report(const Child& c, uint64_t round, uint64_t sites,
                             aggregation::AddOutcome outcome);
  void judged_bad(Child& c, uint64_t round, uint32_t chunk, const aggregation::CopyVerdict& v);
  // The roles take a complete chunk through this (audits late verdicts).
  aggregation::ChunkSum take_chunk(uint32_t chunk);
  void on_telemetry(Child& c, const wire::ParsedFrame& f);

  // Steps of the protocol.
  void all_children_joined();
  bool settle_model_size();  // region: the model size, once every child said hello
  void welcome_children(uint64_t round);
  void send_full_anchor(const Child& c);
  // Chunk `next.chunk_index` of the next anchor as an update that changes
  // nothing (for a child sent an anchor that holds that chunk already).
  void send_unchanged_chunk(const Child& c, const wire::FrameHeader& next);
  void open_round(uint64_t round);
  void complete_chunk(uint32_t chunk);
  void complete_round();
  // The round's traffic: this node's links plus what its regions reported.
  node::Traffic take_traffic(uint64_t round);
  // Adds a finished round's report (with `t`) to the summary and on_round.
  void publish_report(RoundReport r, const node::Traffic& t);
  void check_deadlines();

  // Fault tolerance (aggregator_recovery.cpp).
  void on_rejoin(Child& c, const wire::ParsedFrame& f);
  void welcome_member_back(Child& c, uint64_t their_round);
  void welcome_one(Child& c, uint64_t round, bool full);
  void welcome_pending();  // at a round boundary: deferred rejoins
  void on_heartbeat_timer();
  void child_lost(Child& c);
  // The federation is over for `c`: it confirmed the final model, and its
  // silence from then on (it exits) is no loss while others are waited for.
  bool ended_with(const Child& c) const { return phase_ == Phase::kDraining && c.confirmed_end; }
  void close_ready_chunks();
  void on_deadline(uint64_t round);
  void arm_deadline();

  // Pacing the sites' uploads (aggregator_pacing.cpp).
  bool pacing_on() const;
  void pace_open();      // the round just opened: every site's first allowance
  void pace_children();  // after a delivery or a child lost: allowances that moved
  void pace_lift();      // the whole round to every site held back (a deadline)
  void pace_again();     // each allowance told again (the heartbeat timer)
  // A site about to be welcomed at `round`: its allowance (the window, or
  // what it was told this round), queued ahead of the welcome.
  void pace_welcomed(const Child& c, uint64_t round);
  void queue_paces(const std::vector<aggregator::UplinkPacer::Grant>& grants);
  void send_paces();  // what is pending, as far as the windows take it
  void save_checkpoint();
  bool resume_from_checkpoint();
  // At the start of run(): resumes from this node's checkpoint, or from the
  // replica its parent (the root: its standby) keeps. In run() rather than
  // the constructor, so stop() can cut the wait for a replica short.
  void recover();
  void record_update(const uint8_t* payload, size_t size, const std::string& sha_hex);

  // Membership (aggregator_membership.cpp).
  static const char* away_name(Away a);
  double member_weight() const;  // the quorum's base
  uint32_t member_sites() const;
  void refresh_quorum();      // the open round's quorum from the membership now
  void membership_changed();  // quorum, a region's report up, chunks now ready
  void on_membership(Child& c, const wire::ParsedFrame& f);  // a heartbeat with membership flags
  // A hello from a child that is not a member: it counts from the next
  // boundary (true), or it is a member coming back (false).
  bool admit_newcomer(Child& c);
  // Why `c` may not pause now (inside its declared participation windows),
  // or nullopt.
  std::optional<std::string> pause_refusal(const Child& c) const;
  void became_member(Child& c);  // welcomed: counts from now
  nlohmann::json membership_json() const;
  void restore_membership(const nlohmann::json& m);
  // What the open round waits for (aggregator/round_wait.hpp): the
  // children that owe chunks, or the absent members whose weight the
  // quorum needs; never nobody.
  aggregator::RoundWait round_wait() const;
  // After the round's expectations or weights changed and its ready chunks
  // closed: a round that can never close fails now; one that waits only
  // for absent members says so once.
  void check_round_wait();
  struct MembershipNotes {
    bool report_due = false;              // newcomers welcomed: report at the loop's turn
    uint64_t absent_logged = UINT64_MAX;  // the round that said it waits for absent members
  } membership_;

  // Topology versions (aggregator_topology.cpp).
  bool knows_topology(const std::array<uint8_t, 32>& digest) const {
    return topo_.knows_digest(digest);
  }
  void check_topology_file();  // every heartbeat: a later version to adopt?
  // The topology file's content when it changed since last seen (by its
  // SHA-256), else nullopt.
  std::optional<std::string> file_changed();
  void adopt_topology(Topology next);
  void remove_child(Child& c);
  struct TopologyWatch {
    std::array<uint8_t, 32> start_digest{};  // what a region's hello names
    std::array<uint8_t, 32> content{};       // SHA-256 of the file as last read
  } watch_;
  // A topology file is a few KiB; the parser refuses one past 4 MiB.
  static constexpr size_t kMaxWatchedTopologyBytes = size_t{4} << 20;

  // Metrics and status over HTTP (aggregator_metrics.cpp).
  void start_metrics();  // when the node has a metrics address
  void update_metrics();
  void round_metrics(double seconds);
  // The children's families, and their entries in the status.
  nlohmann::json children_metrics(Clock::time_point now);
  nlohmann::json privacy_metrics(metrics::MetricsRegistry& m);
  const char* phase_name() const;

  // Cost records (aggregator_costs.cpp).
  void collect_costs();                     // link bytes since the last record
  void costs_round_opened(uint64_t round);  // the previous round's record
  void costs_stopped();                     // the last round's record

  // Checkpoint replication (aggregator_replicas.cpp).
  void on_child_checkpoint(Child& c, const wire::ParsedFrame& f);
  checkpoint::ReplicaStore::Result refuse_replica_before_model(const std::string& child,
                                                               uint64_t round);
  void serve_replica(Child& c, const wire::ParsedFrame& f);
  void pump_serving();    // next pieces of replicas going back to children
  void start_upload();    // after save_checkpoint: send it up / to the standby
  void restart_upload();  // a new session: from the first piece
  void pump_upload();
  bool uploading() const { return repl_.upload && repl_.upload->active(); }
  std::vector<uint8_t> checkpoint_signal(uint64_t round, uint8_t flag) const;
  uint8_t welcome_flags() const {  // kFlagKeepsReplicas when children should send theirs
    return repl_.store && cfg_.replica_every > 0 ? wire::kFlagKeepsReplicas : 0;
  }
  uint32_t live_region_children() const { return down_.children.live_regions(); }
  // The model the children hold (role_): the open round's anchor until
  // the next anchor is whole (its chunks wait as frames until then).
  const std::vector<float>& anchor_values() const;
  std::array<uint8_t, 32> anchor_digest() const;
  // Ends run() once the last round is reported and every child confirmed it
  // holds the final model (or the wait for that ran out): closing a socket
  // earlier could lose the last frames still on their way.
  void maybe_finish();

  // Sending never blocks the event loop: frames wait in an outbox per peer
  // (aggregator/downlink.hpp) and go as its window opens (flush()).
  using Frame = aggregator::Frame;
  using Outbox = aggregator::Outbox;
  void send_child(const Child& c, aggregator::StoredFrame frame, const wire::FrameHeader& h);
  void send_child(const Child& c, std::vector<uint8_t> frame, const wire::FrameHeader& h) {
    send_child(c, std::make_shared<const std::vector<uint8_t>>(std::move(frame)), h);
  }
  // The same frame to every live child that is not rejoining, queued for
  // all before any is sent: the link seals a turn's frames for several
  // children at once (aggregator/downlink.hpp).
  void send_children(const aggregator::StoredFrame& frame, const wire::FrameHeader& h);
  // Sends what the windows take; returns true when every outbox is empty.
  bool flush();
  bool outboxes_empty() const;
  // The run loop's last step: what is still queued.
  void deliver_the_rest();
  void refuse(const std::string& peer, const std::string& reason, bool count = true);
  void clear_outbox(const Child& c);
  void send_done(uint64_t rounds);
  void init_model_state(uint64_t total_elements);
  // The model is large enough (AggregatorOptions::spill_from_bytes) that
  // the round's frames kept for sending again wait on disk.
  bool spills() const;
  // It did not read its sockets since `since` (a checkpoint written): its
  // children's and its parent's silence meanwhile does not count.
  void not_listening(Clock::time_point since);
  // While it works without reading (a checkpoint written, common/keep_alive.hpp):
  // a heartbeat marked busy to every child that can take one, and to the
  // peers above (the parent, the root's standby). Never queued, never blocks.
  void busy_beat();
  // A scope (common/keep_alive.hpp) whose beat is busy_beat(): open for each
  // turn of the loop (run), so the commit, a recorded update or a stored
  // replica beat as they go, and around a checkpoint, which is also
  // written before the loop runs.
  KeepAlive keep_alive();
  // Credits every child, its role's own peers (the root's standby, a
  // standby's root) and the parent when `parent_too`, with `d` of silence
  // until `now` (this node's own time away), none past `now`.
  void credit_silence(Clock::duration d, Clock::time_point now, bool parent_too);
  void clip_children_copies(uint32_t idx);
  // Adaptive clipping (central privacy with a target quantile): the root
  // moves the clip; it travels down with welcomes and anchor updates, and
  // regions count their unclipped sites up (docs/protocol.md).
  bool adaptive_clip() const {
    return cfg_.privacy.mode == node::NodeConfig::Privacy::Mode::kCentral &&
           cfg_.privacy.target_quantile > 0;
  }
  // A welcome or an anchor update with the round's clip, under adaptive
  // clipping (else as it is).
  Frame with_round_clip(Frame frame, wire::FrameHeader& h) const;

  AggregatorOptions opt_;
  const Topology& topo_;
  NodeSpec self_;  // its children grow when a topology version adds sites
  const node::NodeConfig cfg_;
  // Central privacy: the clip this round's site copies get (the topology's,
  // or where adaptive clipping moved it: RootRole; a region's parent sends
  // it down).
  double privacy_clip_ = cfg_.privacy.clip;

  // Declared before the links: their security layers report to it.
  std::unique_ptr<node::NodeSecurity> security_;
  // Makes every link of this node (one kind per topology).
  std::unique_ptr<transport::Transport> transport_;

  // The children's side: their table, and the downlink (their link and an
  // outbox each, by the table's slots).
  struct Down {
    aggregator::Downlink link;
    aggregator::ChildTable children;
    uint32_t regions = 0;  // region aggregators among the children
  } down_;

  // The model's shape, once known (init_model_state()): its size, how it
  // is cut into chunks, and the frame limits that follow from both.
  struct Model {
    uint64_t elements = 0;
    std::optional<tensor::ChunkPlan> plan;
    wire::FrameLimits limits;  // cfg_.limits until the size is known
  } model_;

  // The round in progress, its accumulator and its clocks.
  Phase phase_ = Phase::kJoining;
  uint64_t round_ = 0;
  std::optional<aggregation::RoundAccumulator> acc_;
  aggregator::UplinkPacer pacer_;
  std::vector<bool> pace_pending_;  // by child slot: its allowance waits to go
  bool pace_waiting_ = false;       // any of them
  // Lets the process's byte pool keep the buffers this aggregator's frames
  // go through (sealed copies, anchor frames, frames read back from disk),
  // so each is written into memory the last one faulted in, not zeroed.
  BytePool::Lease frames_pool_;
  // Declared before clock_: the deadline timer it makes must be destroyed
  // while its io_context still lives (members die in reverse order).
  node::EventTimers timers_;
  struct Clocks {
    Clock::time_point phase_deadline;
    Clock::time_point round_started;
    Clock::time_point finish_deadline;  // the wait for children's kDone ends
    // The open round passed its deadline: a chunk closes once it has the
    // quorum, whoever else still owes it.
    bool past_deadline = false;
    std::unique_ptr<node::EventTimers::Timer> deadline_timer;  // the round's deadline
    // The heartbeat timer's ticks: how long this node was away from its
    // loop, which its children's silence is not blamed for.
    StallClock ticks;
  } clock_;
  // The anchors a child welcomed mid-round may need.
  struct Anchors {
    // The next round's anchor chunks sent down so far (shared with the
    // outboxes; on disk for a large model, see node/frame_store.hpp).
    std::vector<std::pair<aggregator::StoredFrame, wire::FrameHeader>> next;
    aggregator::FrameStore store;
  } anchors_;

  // Checkpoint replication. Pieces are a chunk's frame each (NodeConfig::
  // upload_piece_bytes) and go out only when nothing of the round protocol
  // waits (they never delay a round).
  struct Serving {  // a child's replica on its way back to it
    std::unique_ptr<checkpoint::PieceReader> reader;
    uint64_t round = 0;
  };
  struct Replication {
    bool recovered = false;                                // recover() ran (at the first run())
    std::unique_ptr<checkpoint::ReplicaStore> store;       // with checkpoint_dir
    std::vector<Serving> serving;                          // by child slot
    std::unique_ptr<checkpoint::CheckpointUpload> upload;  // this node's checkpoint going out
    std::map<std::string, uint64_t> reported;  // bytes received by child, for the next report
  } repl_;

  node::TrafficLedger ledger_;
  // Metrics: the served families and status (node::NodeMetrics), and counts
  // the summary does not keep.
  struct Metrics {
    std::unique_ptr<node::NodeMetrics> served;  // with a metrics address
    uint64_t malformed = 0, refused = 0;
    std::optional<Clock::time_point> last_checkpoint;
  } metrics_;
  // Cost records: the round being counted, and the children's link counters
  // as of the last record (the parent's: session::Uplink).
  struct Costs {
    costs::CostRecorder recorder;
    bool open = false;
    uint64_t round = 0;
    std::map<std::string, uint64_t> sent_seen;  // by child id
  } costs_;
  // Reports waiting for the subtree's traffic (root), telemetry owed (region).
  aggregator::RoundBook book_;
  AggregatorSummary summary_;
  // What the node does as root, region or standby (make_role()).
  std::unique_ptr<Role> role_;
};

}  // namespace fedwan

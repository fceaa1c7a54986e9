// The state and steps of one aggregator node (root or region), private to
// the translation units that implement it:
//   aggregator.cpp          construction, the per-peer outboxes, the event
//                           loop, the children's frame dispatch, deadlines,
//                           shutdown;
//   aggregator_rounds.cpp   the round protocol both roles share: joining,
//                           deltas, chunk and round completion, traffic
//                           reports;
//   aggregator_root.cpp     the root's steps: the outer optimizer on each
//                           complete chunk, the round's commit;
//   aggregator_region.cpp   a region's steps: forwarding aggregates up, its
//                           parent side (session, hello/welcome, the parent's
//                           frames, the anchor relayed down);
//   aggregator_recovery.cpp fault tolerance: rejoins, heartbeats and lost
//                           children, deadlines and quorum, checkpoints and
//                           resuming;
//   aggregator_membership.cpp elastic membership: who counts in the quorum,
//                           leaves, pauses, newcomers;
//   aggregator_replicas.cpp checkpoint replication: children's replicas kept
//                           and served back, this node's checkpoint sent up,
//                           the root's standby and its takeover.
// The state is grouped by role: down_ (children), up_ (a region's parent
// side), root_, region_, standby_, repl_ (replication), the round in
// progress, and the pure RoundBook.
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
#include "aggregator/downlink.hpp"
#include "aggregator/round_book.hpp"
#include "aggregator/round_wait.hpp"
#include "checkpoint/checkpoint_upload.hpp"
#include "checkpoint/replica_store.hpp"
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
  explicit Impl(AggregatorOptions options);
  AggregatorSummary run();
  std::atomic<bool> stop_requested{false};

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
  void open_links(const std::string& bind);  // the children's, and a region's parent session

  // Event handlers.
  void on_child_frame(Incoming& in);
  void on_parent_frame(Incoming& in);
  void on_hello(Child& c, const wire::ParsedFrame& f);
  void on_delta(Child& c, const wire::ParsedFrame& f);
  // The steps of on_delta: its audit entry (and recorded copy), and what the
  // accumulator's verdict leads to.
  void audit_delta(const Child& c, const wire::ParsedFrame& f, const aggregator::DeltaWeight& w,
                   const Codec& codec, const char* decision, bool accepted);
  void on_delta_added(const Child& c, const wire::FrameHeader& h,
                      const RoundAccumulator::Result& r);
  void on_telemetry(Child& c, const wire::ParsedFrame& f);
  void on_parent_welcome(const wire::ParsedFrame& f);
  void on_parent_anchor(const wire::ParsedFrame& f, const uint8_t* raw, size_t raw_size);

  // Steps of the protocol.
  void all_children_joined();
  bool settle_model_size();  // region: the model size, once every child said hello
  void welcome_children(uint64_t round);
  void finish_parent_welcome();
  void send_full_anchor(const Child& c);
  void open_round(uint64_t round);
  void complete_chunk(uint32_t chunk);
  void complete_round();
  // The root's steps (aggregator_root.cpp).
  void root_step_chunk(uint32_t chunk, ChunkSum& cs);  // outer step, anchor chunk down
  void root_commit_round(Clock::time_point now, double secs);
  // A region's steps (aggregator_region.cpp).
  void check_residency(uint32_t chunk) const;  // throws before too few sites go up
  void region_forward_chunk(uint32_t chunk, ChunkSum& cs);
  void region_heartbeat(Clock::time_point now);  // hello again, heartbeat, reconnect
  void resend_up(const wire::ParsedFrame& f);    // a need-update heartbeat from the parent
  void try_finish_round_report(uint64_t round);
  void try_send_telemetry(uint64_t round);
  // The round's traffic: this node's links plus what its regions reported.
  Traffic take_traffic(uint64_t round);
  // Adds a finished round's report (with `t`) to the summary and on_round.
  void publish_report(RoundReport r, const Traffic& t);
  void check_deadlines();

  // Fault tolerance (aggregator_recovery.cpp).
  void on_rejoin(Child& c, const wire::ParsedFrame& f);
  void welcome_one(Child& c, uint64_t round, bool full);
  void welcome_pending();  // at a round boundary: deferred rejoins
  void on_heartbeat_timer();
  void child_lost(Child& c);
  void close_ready_chunks();
  void on_deadline(uint64_t round);
  void arm_deadline();
  void save_checkpoint();
  bool resume_from_checkpoint();
  // At the start of run(): resumes from this node's checkpoint, or from the
  // replica its parent (the root: its standby) keeps. In run() rather than
  // the constructor, so stop() can cut the wait for a replica short.
  void recover();
  void reconnect_parent(const std::string& why);
  void hello_parent();
  void on_parent_done(uint64_t final_round);  // kDone from the parent
  void record_update(const uint8_t* payload, size_t size, const std::string& sha_hex);

  // Membership (aggregator_membership.cpp).
  static const char* away_name(Away a);
  double member_weight() const;  // the quorum's base
  uint32_t member_sites() const;
  void refresh_quorum();                // the open round's quorum from the membership now
  void membership_changed();            // quorum, a region's report up, chunks now ready
  void report_membership();             // region: its membership on a heartbeat up
  bool membership_settled() const;      // region: its children welcomed, a report is true
  bool membership_report_due_ = false;  // newcomers welcomed: report at the loop's turn
  void on_membership(Child& c, const wire::ParsedFrame& f);  // a heartbeat with membership flags
  // A hello from a child that is not a member: it counts from the next
  // boundary (true), or it is a member coming back (false).
  bool admit_newcomer(Child& c);
  // Why `c` may not pause now (inside its declared participation windows),
  // or nullopt.
  std::optional<std::string> pause_refusal(const Child& c) const;
  static constexpr std::chrono::seconds kPauseClockSlack{300};
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
  uint64_t absent_wait_logged_ = UINT64_MAX;  // the round that said so

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
  const char* phase_name() const;

  // Cost records (aggregator_costs.cpp).
  void collect_costs();                     // link bytes since the last record
  void costs_round_opened(uint64_t round);  // the previous round's record
  void costs_stopped();                     // the last round's record

  // Checkpoint replication (aggregator_replicas.cpp).
  void on_child_checkpoint(Child& c, const wire::ParsedFrame& f);
  void serve_replica(Child& c, const wire::ParsedFrame& f);
  void pump_serving();  // next pieces of replicas going back to children
  void start_upload();  // after save_checkpoint: send it up / to the standby
  void pump_upload();
  bool uploading() const { return repl_.upload && repl_.upload->active(); }
  void on_standby_frame(Incoming& in);      // root: from its standby
  void on_root_frame(Incoming& in);         // standby: from the active root
  bool may_serve(const std::string& peer);  // standby: false while passive
  void take_over(const std::string& asker);
  void serve_root_replica();  // standby: the root lost its own checkpoints
  void release_held_back();   // root: the last anchor chunk, once committed
  // Root: a round committed without its standby holding it (logged and
  // audited as standby_lost once, until the standby is back).
  void standby_missing(const std::string& why);
  aggregator::StandbyLink standby_view() const {
    return {standby_.link != nullptr, standby_.seen, standby_.warned, standby_.heard,
            standby_.link_opened};
  }
  bool standby_live() const {
    return aggregator::standby_live(standby_view(), Clock::now(), cfg_.heartbeat_timeout);
  }
  // What a round's last anchor chunk waits for (aggregator/round_wait.hpp).
  bool standby_awaited() const {
    return aggregator::standby_awaited(standby_view(), Clock::now(), cfg_.heartbeat_timeout);
  }
  std::vector<uint8_t> checkpoint_signal(uint64_t round, uint8_t flag) const;
  uint8_t welcome_flags() const {  // kFlagKeepsReplicas when children should send theirs
    return repl_.store && cfg_.replica_every > 0 ? wire::kFlagKeepsReplicas : 0;
  }
  void open_standby_link();
  uint32_t live_region_children() const {
    uint32_t n = 0;
    for (const Child& c : down_.children) n += (!c.is_site && c.live) ? 1 : 0;
    return n;
  }
  const std::vector<float>& anchor_values() const { return is_root_ ? root_.held : region_.anchor; }
  std::array<uint8_t, 32> anchor_digest() const;
  // Called before chunk `chunk` of root_.held/region_.anchor changes mid-round.
  void keep_round_anchor(uint32_t chunk);
  // Whether the open round's anchor differs from root_.held/region_.anchor now.
  bool anchor_replaced() const;
  // The open round's anchor (root_.held/region_.anchor with the replaced
  // chunks put back).
  std::vector<float> round_anchor() const;
  // Ends run() once the last round is reported and every child confirmed it
  // holds the final model (or the wait for that ran out): closing a socket
  // earlier could lose the last frames still on their way.
  void maybe_finish();

  // Sending never blocks the event loop: frames wait in an outbox per peer
  // (aggregator/downlink.hpp) and go as its window opens (flush()).
  using Frame = aggregator::Frame;
  using Outbox = aggregator::Outbox;
  void send_child(const Child& c, Frame frame, const wire::FrameHeader& h);
  void send_child(const Child& c, std::vector<uint8_t> frame, const wire::FrameHeader& h) {
    send_child(c, std::make_shared<const std::vector<uint8_t>>(std::move(frame)), h);
  }
  void send_parent(std::vector<uint8_t> frame);
  // Sends what the windows take; returns true when every outbox is empty.
  bool flush();
  bool outboxes_empty() const;
  // The run loop's steps: a batch from the parent and from the standby;
  // at the end, what is still queued.
  void recv_parent(Incoming& in);
  void recv_standby(Incoming& in);
  void deliver_the_rest();
  void refuse(const std::string& peer, const std::string& reason, bool count = true);
  void clear_outbox(const Child& c);
  void send_done(uint64_t rounds);
  void init_model_state(uint64_t total_elements);

  AggregatorOptions opt_;
  const Topology& topo_;
  NodeSpec self_;  // its children grow when a topology version adds sites
  const bool is_root_;
  const node::NodeConfig cfg_;
  wire::FrameLimits limits_;  // cfg_.limits, then for the model once its size is known
  bool recovered_ = false;    // recover() ran (once, at the first run())

  // Declared before the links: their security layers report to it.
  std::unique_ptr<node::NodeSecurity> security_;
  // Makes every link of this node (one kind per topology).
  std::unique_ptr<transport::Transport> transport_;

  // The children's side: their table, and the downlink (their link and an
  // outbox each, by the table's slots).
  struct Down {
    aggregator::Downlink link;
    std::vector<Child> children;
    uint32_t regions = 0;  // region aggregators among the children
  } down_;

  // A region's parent side: the child's end of the protocol (session::Uplink:
  // the session, the welcome's progress, resends, replicas kept, link bytes),
  // the outbox towards the parent, and where this session's welcome stands.
  struct Up {
    std::unique_ptr<session::Uplink> uplink;  // null at the root
    Outbox out;
    bool welcomed = false;  // the parent welcomed this session
    uint64_t welcome_round = 0;
    bool full_pending = false;  // a full anchor from the parent is arriving
    uint32_t full_chunks = 0;
  } up_;

  // The round in progress.
  Phase phase_ = Phase::kJoining;
  uint64_t round_ = 0;
  uint64_t total_elements_ = 0;
  std::optional<ChunkPlan> plan_;
  std::optional<RoundAccumulator> acc_;
  Clock::time_point phase_deadline_;
  Clock::time_point round_started_;
  Clock::time_point finish_deadline_;  // the wait for children's kDone ends
  node::EventTimers timers_;
  std::unique_ptr<node::EventTimers::Timer> deadline_timer_;
  // The open round's anchor values of the chunks the next anchor already
  // replaced in root_.held/region_.anchor (it is computed or arrives chunk
  // by chunk), so that a child rejoining mid-round is welcomed with the
  // round's own anchor, not a mix of two rounds. At most one model; cleared
  // when a round opens.
  std::map<uint32_t, std::vector<float>> replaced_anchor_;
  // The next round's anchor chunks sent down so far (shared with the
  // outboxes), for a child welcomed back mid-round.
  std::vector<std::pair<Frame, wire::FrameHeader>> next_anchor_;

  // Root: the global model, the model every child holds (global minus what
  // the down-path encoding has not delivered yet), the outer optimizer.
  struct RootState {
    std::vector<float> global, held;
    std::array<uint8_t, 32> model_digest{};
    std::unique_ptr<OuterOptimizer> outer;
    // The last anchor chunk of a round waits until the round's checkpoint
    // is durable, so no child ever holds a round the root could forget in
    // a crash.
    std::optional<std::pair<Frame, wire::FrameHeader>> held_back;
    Clock::time_point held_since;
    bool done_pending = false;  // kDone waits for the held-back chunk
    bool corrupt = false;       // only corrupt checkpoints; ask the standby
  } root_;

  // Region: what it relays between its children and its parent.
  struct RegionState {
    std::vector<float> anchor;                      // the anchor its children hold
    std::array<uint8_t, 32> round_anchor_digest{};  // of anchor when the round opened
    // Joining with the model the federation starts from (options'
    // initial_model): its digest goes up in the first hello.
    bool holds_initial = false;
    // Error-feedback residual of the forwarded means (lossy codecs).
    std::vector<float> residual;
    // Anchor relay progress: which chunks of the next anchor (round
    // relay_round) are applied and relayed. A chunk the parent sends again
    // (after welcoming this region back) is neither applied twice nor
    // counted twice.
    uint64_t relay_round = 0;
    std::vector<bool> relayed;
    uint32_t relayed_chunks = 0;
    Clock::time_point anchor_progress_at;  // the round's anchor last advanced
    // The aggregate chunks sent up this round, by chunk, kept until the next
    // anchor completes so they can be sent again: those the parent lacks
    // once its progress stalls (resend), or all after it restarts.
    std::map<uint32_t, Frame> sent_up;
    bool done_from_parent = false;
    bool force_reports = false;  // finishing: report without lost children's traffic
  } region_;

  // The root's standby, seen from either side. Root with a standby: the
  // link its checkpoints go over, and what the standby acknowledged (a live
  // standby must hold a round's checkpoint before the round's last anchor
  // chunk leaves, so a takeover loses nothing). Standby: passive (keeping
  // the root's replicas) until it takes over.
  struct StandbyState {
    std::unique_ptr<ParentLink> link;
    Clock::time_point link_opened;
    bool seen = false;
    bool warned = false;
    Clock::time_point heard;
    std::optional<uint64_t> acked;
    bool passive = false;
    Clock::time_point root_heard;  // standby: the active root last heard
    bool root_seen = false;        // standby: heard the active root at least once
  } standby_;

  // Checkpoint replication. Pieces are chunk_bytes each and go out only
  // when nothing of the round protocol waits (they never delay a round).
  struct Serving {  // a child's replica on its way back to it
    std::unique_ptr<checkpoint::PieceReader> reader;
    uint64_t round = 0;
  };
  struct Replication {
    std::unique_ptr<checkpoint::ReplicaStore> store;       // with checkpoint_dir
    std::vector<Serving> serving;                          // by child slot
    std::unique_ptr<checkpoint::CheckpointUpload> upload;  // this node's checkpoint going out
  } repl_;

  TrafficLedger ledger_;
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
  aggregator::RoundBook book_{is_root_};
  AggregatorSummary summary_;
};

}  // namespace fedwan

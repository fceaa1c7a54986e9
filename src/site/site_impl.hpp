// SiteCore's state, private to the site's sources: site_core.cpp (the round
// protocol's receiving side), site_sync.cpp (the steps of sync(), sending),
// site_link.cpp (link upkeep), site_checkpoint.cpp (saving),
// site_restore.cpp (resuming), site_membership.cpp, site_overlap.cpp and
// site_metrics.cpp. Thread
// safety: one thread drives a SiteCore.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/node_checkpoint.hpp"
#include "checkpoint/replica_store.hpp"
#include "common/byte_pool.hpp"
#include "common/keep_alive.hpp"
#include "common/mapped_floats.hpp"
#include "common/sha256.hpp"
#include "costs/cost_recorder.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/site_core.hpp"
#include "node/frame_store.hpp"
#include "node/node_config.hpp"
#include "node/node_metrics.hpp"
#include "node/node_security.hpp"
#include "security/sealing_pipeline.hpp"
#include "session/uplink.hpp"
#include "site/anchor_assembly.hpp"
#include "site/local_privacy.hpp"
#include "tensor/chunk_plan.hpp"
#include "topology/participation_window.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan {

namespace site {
// The residual as a host-encoding site keeps it (bf16 bits); "residual" is
// fp32 (earlier checkpoints, and a site with an UpdateEncoder).
inline constexpr const char* kResidualBf16 = "residual.bf16";

// The sections a site writes itself; any other is one of the caller's
// blobs (SiteOptions::save_state).
inline bool reserved_section(const std::string& name) {
  return name == "params" || name == "anchor" || name == "residual" || name == kResidualBf16 ||
         name == "meta";
}

// Where a restore reads a site's arrays from (site_restore.cpp): a
// checkpoint's sections, in memory or left in its file, or a replica
// image's, each decoded on its own as it is read. names: its sections but
// the meta; size: the bytes of section `name`, nullopt when there is none;
// read: exactly those bytes into `out`; stream: the same in pieces of
// whole values. Valid while what it reads lives.
struct RestoreSource {
  std::function<std::vector<std::string>()> names;
  std::function<std::optional<uint64_t>(const std::string& name)> size;
  std::function<void(const std::string& name, uint8_t* out)> read;
  std::function<void(const std::string& name, const CheckpointSection::Sink& sink)> stream;
};
}  // namespace site

class SiteCore::Impl {
 public:
  using Clock = std::chrono::steady_clock;
  using Millis = std::chrono::milliseconds;

  Impl(SiteOptions options, float* params, size_t n);
  ~Impl();  // stops and joins an overlapped sync's worker
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  SyncResult join();
  SyncResult sync();
  SyncResult service();
  // With a replica image (replica_due) for the parent beside it.
  // `on_anchor`: the caller knows the parameters are the anchor (it just
  // copied one to the other), else they are compared.
  void save_checkpoint(bool with_replica = false, bool on_anchor = false);
  // Around work that reads nothing for long (a checkpoint written): a
  // heartbeat marked busy to the parent each period (common/keep_alive.hpp).
  KeepAlive keep_alive();
  void busy_beat();
  // Membership (site_membership.cpp): a graceful leave, and the pause
  // outside the participation windows at a round boundary.
  bool leave(Millis timeout);
  void pause_outside_window(SyncResult* res);
  // Overlap (site_overlap.cpp).
  void begin_sync();
  SyncResult finish_sync();
  bool sync_ready() const { return overlap.pending && overlap.done.load(); }

  SiteOptions opt;
  const Topology& topo;
  const NodeSpec& self;
  const node::NodeConfig cfg;
  float* params;
  // What a sync reads its update from and writes the next anchor into:
  // params, or while an overlapped sync is pending, the copy it works on.
  float* work;
  tensor::ChunkPlan plan;
  wire::FrameLimits limits;  // what frames from the parent may be
  std::array<uint8_t, 32> initial_digest{};
  // The model the federation agreed on for `round`: in memory, or for a
  // large model in a file the kernel may page (SiteOptions::page_out_from_bytes).
  MappedFloats anchor;
  // Sizes the anchor to the model and copies `from` into it; logs once
  // when it should have gone to a file and could not.
  void set_anchor(const float* from);
  // The warning set_anchor gives when the anchor could not go to its file.
  void warn_anchor_in_memory();
  // A welcome "no change" at this round: false (and a hello offering no
  // digest is due) when the parent's anchor digest is not the one this
  // site offered for its whole anchor.
  bool anchor_matches(const wire::ParsedFrame& f);
  bool anchor_file_warned = false;
  // Error feedback of the deltas sent (lossy codecs), in bf16 as a
  // region's (codec/compact_feedback.hpp): the bits of each value. Empty
  // with an UpdateEncoder, which keeps its own (read at checkpoints).
  std::vector<uint16_t> residual;
  std::vector<float> residual_scratch;  // a chunk, for encoding with it
  // The residual set to zeros (a new round's model came in full).
  void clear_residual();
  // The residual of `c` (a checkpoint, or a replica image expanded): bf16
  // ("residual.bf16") or fp32 ("residual", as written before, and by a site
  // with an UpdateEncoder). Whether it had one.
  bool restore_residual(const site::RestoreSource& src, const std::string& what);
  void check_restorable(const site::RestoreSource& src, bool own_params, bool with_anchor,
                        const std::string& what) const;
  // Restored from the parent's replica image: the image until the parent's
  // model of its round is in (site_restore.cpp), its sections left in
  // the file.
  std::optional<Checkpoint> replica_image;
  // Whole checkpoints' cadence (site_checkpoint.cpp): the last one's time
  // and cost. Between them each round boundary writes the replica image.
  static constexpr uint64_t kWholeAlways = uint64_t{64} << 20;  // bytes: every round below this
  struct {
    std::optional<Clock::time_point> whole_at;
    double whole_seconds = 0;
  } cadence;
  std::unique_ptr<site::LocalPrivacy> local_privacy;  // federation.privacy mode local
  uint64_t round = 0;
  bool joined = false;
  bool finished = false;
  bool resumed = false;
  bool left = false;  // leave() told the parent: no more rounds
  topology::ParticipationWindows windows;
  // Cost records: training is the caller's time between a sync's return
  // and the next sync (or begin_sync .. finish_sync, overlapped).
  costs::CostRecorder costs;
  std::optional<Clock::time_point> trained_since;
  // What crossed the link to the parent since the last call (updates,
  // heartbeats, checkpoint pieces, the models that came down), into the
  // cost record. The driving thread only: not while an overlapped sync's
  // worker owns the link.
  void cost_link_bytes() { uplink->record_link_bytes(costs); }
  void cost_training_ends() {
    if (trained_since) {
      const double s = std::chrono::duration<double>(Clock::now() - *trained_since).count();
      costs.trained(s);
      site_metrics.train_seconds += s;
    }
    trained_since.reset();
  }
  // Metrics and status over HTTP (site_metrics.cpp).
  struct SiteMetrics {
    std::unique_ptr<node::NodeMetrics> served;  // with a metrics address
    double train_seconds = 0;
    uint64_t checkpoints = 0;
    bool paused = false;
    std::optional<Clock::time_point> last_checkpoint;
    Clock::time_point updated;
  } site_metrics;
  void start_metrics();
  // `sync_seconds` >= 0: a sync ended. The driving thread only.
  void update_metrics(bool force = false, double sync_seconds = -1);
  uint64_t data_position = 0;
  // Set by stop() from any thread (or a signal handler); join() and sync()
  // throw StoppedError when they see it.
  std::atomic<bool> stop_requested{false};
  // stop(grace): a sync() in progress may still finish until this time
  // (steady clock, ns); join() and a later sync() stop at once.
  std::atomic<int64_t> stop_deadline_ns{0};
  std::atomic<bool> in_sync{false};
  // A sync() began and did not end: params and the residual may hold part
  // of the next round, so checkpoint() keeps the round boundary's instead.
  bool sync_unfinished = false;
  // Chunks of the next anchor are in the anchor already (each added in
  // place once its delta went): until take_anchor it is neither round's.
  bool anchor_mixed = false;
  // A sync() threw with the anchor mixed: the round it began from is gone,
  // so the core cannot go on (its join() resumes from the last checkpoint).
  bool sync_failed = false;
  // Throws StoppedError after stop(); inside a sync, only once its grace
  // has run out.
  void throw_if_stopped(const char* where) const;
  // Throws Error once a sync failed in a way the core cannot go on from.
  void throw_if_failed() const;

  // Declared before the link: its security layer reports to it.
  std::unique_ptr<node::NodeSecurity> security;
  // Makes the link to the parent (its kind from the parent's endpoint).
  std::unique_ptr<transport::Transport> transport;
  // The child's end of the parent protocol: the session (link, reconnects,
  // liveness), the welcome's progress, resends, the checkpoint upload.
  std::unique_ptr<session::Uplink> uplink;
  session::ParentSession& parent() { return uplink->session(); }
  transport::ParentLink& link() { return uplink->link(); }

  // An overlapped sync (begin_sync .. finish_sync). The worker thread owns
  // everything but params, `overlap` and the caller's data position.
  struct Overlap {
    // params at begin_sync; chunk by chunk, as the next anchor comes in,
    // (new anchor - params at begin_sync): what finish_sync adds to params.
    std::vector<float> sent;
    std::thread worker;
    std::atomic<bool> done{false};
    // The worker says it is done under `m`, so a PendingSync can wait on it.
    std::mutex m;
    std::condition_variable cv;
    uint64_t generation = 0;  // of the sync begun last (a PendingSync names it)
    void set_done() {
      {
        std::lock_guard<std::mutex> lock(m);
        done.store(true);
      }
      cv.notify_all();
    }
    bool wait_done(std::chrono::milliseconds timeout) {
      std::unique_lock<std::mutex> lock(m);
      return cv.wait_for(lock, timeout, [this] { return done.load(); });
    }
    std::exception_ptr error;
    SyncResult result;
    bool pending = false;
    bool failed = false;                          // a sync threw: the core cannot go on
    uint64_t round = 0;                           // the round that ended at begin_sync
    std::chrono::steady_clock::time_point began;  // begin_sync's call
    double seconds() const {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    }
    bool checkpoint_due = false, upload_due = false;  // deferred from the worker
    // The alarms as last read, answered while the worker owns the security
    // layer (mutable: alarms() is const).
    mutable std::vector<std::string> alarms;
  } overlap;
  bool overlapping() const { return work != params; }

 private:
  void reset_link_state();  // a new link: nothing sent on it failed yet
  bool resume();            // true when a local checkpoint was loaded
  bool resume_from_image(checkpoint::LoadedCheckpoint loaded);
  std::optional<checkpoint::LoadedCheckpoint> local_image();  // newer than `round`, intact
  Checkpoint state_checkpoint(bool on_anchor = false);
  // `anchor_sha256`: the anchor section's digest when the whole checkpoint of
  // `c` was just written (it hashed the section), else null.
  void save_image(const Checkpoint& c, const checkpoint::CheckpointTrust& trust,
                  const std::array<uint8_t, 32>* anchor_sha256 = nullptr);
  bool whole_checkpoint_due() const;
  void boundary_checkpoint(bool upload, bool on_anchor = false);
  // Replica bytes sent since it was last asked (SyncResult::replica_bytes).
  uint64_t replica_bytes_since_last();
  uint64_t replica_bytes_reported = 0;
  // The data position (c's meta) and the caller's blobs (read from src).
  void restore_progress(const Checkpoint& c, const site::RestoreSource& src);
  void take_replica_image(uint64_t full_round);
  bool replica_due() const;  // this round's checkpoint goes to the parent
  void start_upload();       // after a checkpoint: send its image to the parent
  void pump_upload();
  std::optional<wire::ParsedFrame> poll_frame(transport::Incoming* in, Millis timeout);
  void pump(Millis wait, SyncResult* res);
  void upkeep();
  bool back_from_away(Clock::time_point now);  // the parent credited; true: reconnected
  void reconnect(const std::string& why, bool grow_backoff = true);
  // Sends a membership heartbeat (kFlagLeaving, kFlagPausing) within
  // `timeout`, pumping the link meanwhile; whether it went.
  bool announce(uint8_t flag, Millis timeout, SyncResult* res);
  // Waits for the welcome (and the model in full) a hello asked for.
  void await_welcome(Millis timeout, const char* why, SyncResult* res);
  // A hello; records the anchor digest it offers (welcome.offered).
  std::vector<uint8_t> hello_frame();
  // Whether the anchor is this round's whole: not one with chunks of the
  // next one already added in place.
  bool anchor_whole() const {
    return !anchor_mixed && !(overlapping() && incoming.next_received() > 0);
  }
  void on_frame(const wire::ParsedFrame& f, SyncResult* res);
  void on_done(const wire::FrameHeader& h);
  void on_welcome(const wire::ParsedFrame& f, SyncResult* res);
  void on_anchor(const wire::ParsedFrame& f, SyncResult* res);
  void model_in_full(SyncResult* res);  // the last piece of a model in full came
  void on_heartbeat(const wire::ParsedFrame& f, SyncResult* res);
  void apply_update_chunk(uint32_t chunk, const Codec& c, const uint8_t* payload);
  void apply_early();
  bool send_now(std::vector<uint8_t> frame, SyncResult* res);
  void resend_update();  // every chunk (a welcome back asked for the update)
  void resend_chunks(const std::vector<uint32_t>& chunks, SyncResult* res);
  void confirm_end(SyncResult* res);
  // The steps of sync().
  void begin_update();
  void send_update(uint64_t start_round, SyncResult* res);
  void begin_private_update();
  // Sends what the pipeline has sealed until at most `keep` frames are left in it.
  void send_sealed(security::SealingPipeline& sealing, size_t keep, SyncResult* res);
  // The parent paces the update (docs/protocol.md, "Pacing"): chunk `chunk`
  // waits until it is allowed, the pipeline drained and closed meanwhile (the
  // link's upkeep seals heartbeats and may replace the link) and opened again.
  void await_pace(uint64_t start_round, uint32_t chunk,
                  std::optional<security::SealingPipeline>& sealing, SyncResult* res);
  bool held_back(uint64_t start_round, uint32_t chunk) const {
    if (pace.heard == 0 || pace.unpaced_round == start_round) return false;
    if (pace.round == start_round) return chunk >= pace.allowed;
    // A round not told yet, from a parent that paced: its window.
    return pace.round < start_round && pace.window > 0 && chunk >= pace.window;
  }
  void update_sent();  // the whole update went out: audited
  void await_anchor(uint64_t start_round, SyncResult* res);
  void take_anchor();              // the next anchor is in: it becomes the new round
  void run_sync(SyncResult* res);  // sync()'s steps, on `work`
  // At the end of a round (take_anchor, a resync): now, or after the merge.
  // `on_anchor`: not overlapped, the caller just copied the parameters to
  // the anchor (else they are compared).
  void round_checkpoint(bool upload, bool on_anchor = false);

  // The round's update going up: unsealed, kept until the next anchor is
  // in, so it can be sent again after a reconnect.
  struct Update {
    // In memory, or for a large model on disk (SiteOptions::page_out_from_bytes).
    std::vector<node::StoredFrame> frames;
    node::FrameStore store;
    bool sent = false;  // the whole update of `round` is in frames
    uint32_t encoded_upto = 0;
    Sha256 digest;  // of the encoded chunks, for the audit entry
    uint64_t bytes = 0;
    Clock::time_point began;  // the update's first chunk was due
    Clock::time_point sent_at;
  } outgoing;
  // Lets the process's pool keep this update's frames between rounds
  // (SiteCore's constructor), for as long as this site lives.
  BytePool::Lease frames_pool;
  // The anchors coming down, chunk by chunk: the next round's (into params),
  // a model in full after a welcome (into anchor), chunks that came before
  // their delta chunk was computed. After `plan` (its chunk count).
  site::AnchorAssembly incoming{plan.count()};
  // The end, come before the final anchor was whole: its round and when.
  struct EndWaiting {
    uint64_t round = 0;
    Clock::time_point since;
  } end_waiting;
  // Where the hello/welcome exchange with the parent stands, on this
  // session (the session itself: `parent`).
  struct Welcome {
    bool link_ok = true;       // nothing sent on this link failed yet
    bool joined_once = false;  // holds a federation anchor
    bool awaiting = false;     // a hello went (or is due) and no welcome came yet
    bool hello_pending = false;
    // The digest of the anchor the last hello offered, while it names that
    // round's anchor whole (an overlapped sync's mixed anchor offers one the
    // parent cannot check): a welcome "no change" names the parent's, and
    // the two must agree.
    std::optional<std::array<uint8_t, 32>> offered;
    uint64_t offered_round = 0;
    // The anchor differed from the parent's: hellos offer none until the
    // model comes in full.
    bool offer_none = false;
    std::string last_link_error;
    Clock::time_point last_heartbeat, hello_sent_at;
  } welcome;
  // The parent's allowance for an update (kHeartbeat with kFlagPace).
  struct Pace {
    uint64_t round = 0;    // the round it is for
    uint32_t allowed = 0;  // chunks of that round's update that may have gone
    uint32_t window = 0;   // a later round's until told (0: the parent never paced)
    uint64_t heard = 0;    // allowances heard, repeats too
    // A round sent unpaced: its parent said nothing for a heartbeat timeout.
    uint64_t unpaced_round = UINT64_MAX;
  } pace;
  Clock::time_point next_tick;  // the node security's upkeep (CRL, audit, noise)
  bool sealing_active = false;  // the sealing pipeline's worker owns the sealer
};

}  // namespace fedwan

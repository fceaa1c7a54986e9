// A region or root aggregator: one process-level object serving one node of
// the topology. Construct from AggregatorOptions, then run() blocks until the
// federation is done. Thread safety: run() on one thread; stop() from any.
#pragma once

#include "fedwan/export.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/node_options.hpp"

namespace fedwan {

// Traffic and timing of one round, over every link of the tree (the root
// sums its own links and its regions' reports).
struct FEDWAN_API RoundReport {
  uint64_t round = 0;
  double seconds = 0;       // root: round opened -> global model updated
  uint64_t wan_bytes = 0;   // bytes on the wire, frame headers included
  uint64_t fp32_bytes = 0;  // the same frames had they carried fp32
  uint64_t frames = 0;
  double weight = 0;  // total site weight aggregated
  // Checkpoint replica bytes this aggregator received from each child (by
  // id) since its previous report. Not in wan_bytes: replicas go when
  // nothing of a round waits, but they share the links.
  std::map<std::string, uint64_t> replica_bytes;
};

// Topology, node id (a root or region of the topology), join timeout,
// window, security, checkpoints, costs and metrics: see NodeOptions.
struct FEDWAN_API AggregatorOptions : NodeOptions {
  // The starting global model (flat fp32): required at the root. Sites whose
  // initial model has the same SHA-256 start from their own copy; others are
  // sent it. A region may be given it too: it then joins without being sent
  // the model in full (its hello carries the digest; a model that differs
  // from the root's is simply sent).
  std::vector<float> initial_model;
  // Root only, on run()'s thread: the global model after round `round`.
  std::function<void(uint64_t round, const std::vector<float>& global)> on_model;
  // On run()'s thread, once a round's traffic over the whole subtree is known.
  std::function<void(const RoundReport&)> on_round;
  // Per round; defaults to the topology's federation.round_timeout_s.
  std::optional<std::chrono::milliseconds> round_timeout;
  // Keeps every delta payload received, named by its SHA-256 as the audit
  // log records it, so that the aggregation can be replayed from the audit
  // log (forensics, recovery tests). Empty: not kept.
  std::string record_updates_dir;
  // A model of at least this many fp32 bytes keeps what the aggregator
  // holds only for a round in unnamed files (in checkpoint_dir, else the
  // temporary directory) rather than in memory: the anchor frames it sends
  // down (read back as each child's window takes them, and by a child that
  // rejoins mid-round), and, beyond 12 MiB of them at the root (4 MiB at a
  // region), the chunks of the
  // children's mean waiting for their last copies (read back when they
  // come). 0: always (and every such chunk waits on disk); SIZE_MAX: never. A node that cannot make
  // or write the file keeps them in memory that round (logged).
  size_t spill_from_bytes = size_t{64} << 20;
  // Where that holds, each site child is told how far its update may run
  // ahead of the slowest child still owing chunks (docs/protocol.md,
  // "Pacing"), so that few chunks wait on disk for their last copies.
  // false: sites send as fast as their links take it.
  bool pace_uploads = true;
  // The most bytes one child's checkpoint replica may have (with
  // checkpoint_dir). 0: what the wire allows a checkpoint, 16 fp32 models
  // plus 64 MiB, once the model's size is known (a site's whole checkpoint
  // is its parameters, anchor, bf16 residual and the caller's blobs: 4.5
  // models with Adam's two moments); set it lower to bound the disk.
  // A replica that announces more is refused (`replica_refused`) before a
  // byte of it is written, and so is one sent before this node knows the
  // model's size: a child's replicas take at most three times this on
  // this node's disk (two kept, one arriving).
  uint64_t replica_max_bytes = 0;
  // The file `topology` was loaded from. The node checks it every heartbeat
  // and adopts a later version signed by the federation's admin identity:
  // sites it adds join (counted from the round boundary after they come),
  // sites it marks removed are refused from then on (docs/operations.md,
  // "Topology versions"). A version it cannot adopt is refused, audited
  // (topology_refused) and raised as an alarm; the node runs on. Empty: the
  // topology never changes while the node runs.
  std::string topology_file;
  // Run as the root's standby (a root with `standby_endpoint` in the
  // topology; node_id is the root's, and so are the credentials): bind the
  // standby endpoint, keep the checkpoints the active root streams to it,
  // and take over as root from the newest one when the root has been
  // silent for heartbeat_timeout_s and one of its children comes to it.
  // Needs checkpoint_dir. A standby whose checkpoint_dir holds its own root
  // checkpoint (it took over before) starts as the active root.
  bool standby = false;
};

struct FEDWAN_API AggregatorSummary {
  uint64_t rounds = 0;
  std::vector<RoundReport> reports;  // root: whole tree; region: its subtree
  uint64_t wan_bytes_total = 0;
  uint64_t fp32_bytes_total = 0;
  uint64_t rejected_frames = 0;  // malformed, unauthorised, stale, duplicate
  // A region: aggregate chunks its parent lacked after its progress stalled,
  // sent again, and their bytes (also in the round reports' traffic).
  uint64_t resent_chunks = 0;
  uint64_t resent_bytes = 0;
  std::string security_mode;         // "mtls/<cipher>" or "plaintext"
  std::vector<double> handshake_ms;  // children's secure links, as each came up
  std::vector<float> global_model;   // root: the final global model
  uint64_t resumed_from_round = 0;   // > 0: resumed from a checkpoint at this round
  uint64_t children_lost = 0;        // heartbeat timeouts of children
  uint64_t rejoins = 0;              // children that said hello again mid-federation
  uint64_t membership_changes = 0;   // children that joined late, left, paused or came back
  uint64_t stale_updates = 0;        // delta chunks for a closed round or chunk
  // Chunks of the children's mean that waited on disk for their last copies
  // (AggregatorOptions::spill_from_bytes), and the bytes written for them.
  uint64_t chunks_parked = 0;
  uint64_t parked_bytes = 0;
  // Children's copies of a chunk this node refused (a NaN, a value or norm
  // over its bound, a malformed payload; docs/security.md, "Robust
  // aggregation") or clipped to the norm bound.
  uint64_t refused_copies = 0;
  uint64_t clipped_copies = 0;
  // Differential privacy (docs/security.md, "Differential privacy"): the
  // epsilon spent by the rounds run (at the topology's delta; 0 when off),
  // and the sites' copies this node clipped to the privacy bound.
  double privacy_epsilon = 0;
  uint64_t privacy_clipped = 0;
  uint64_t checkpoints_written = 0;
  uint64_t replicas_stored = 0;   // children's checkpoints kept (and, standby, the root's)
  uint64_t replica_bytes = 0;     // their bytes (not in the round reports' traffic)
  bool took_over = false;         // standby: became the root
  uint64_t topology_version = 1;  // the topology version it ran last
  // Conditions an operator must act on that the node rode out (the audit log
  // could not be written, the CRL is expiring, expired or unusable, ...),
  // "kind: message", the latest per kind (docs/operations.md, "Alarms").
  std::vector<std::string> alarms;
};

class FEDWAN_API Aggregator {
 public:
  // Validates the options and binds the node's endpoint. Throws ConfigError
  // (bad options) or TransportError (cannot bind).
  explicit Aggregator(AggregatorOptions options);
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // Serves until the last round is done. Throws TimeoutError when children
  // do not join or a round does not complete in time (naming who is missing),
  // ProtocolError when the parent refuses this node, StoppedError when
  // stopped. A node without an intact checkpoint of its own first asks its
  // parent (the root: its standby) for the replica it keeps, up to the join
  // timeout.
  AggregatorSummary run();

  // Makes run() return (by throwing fedwan::StoppedError) within ~100 ms,
  // also while it waits for a replica. Callable from any thread and from a
  // signal handler.
  void stop();

 private:
  class FEDWAN_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedwan

// The site leader's side of the federation over a flat fp32 parameter buffer
// that the caller owns (a LibTorch flat view, a NumPy array, ...). No torch
// here: fedwan::Site wraps this for torch::nn::Module, the Python module for
// tensors. Thread safety: one thread drives a SiteCore; the buffer must not
// be written by others while join() or sync() runs.
#pragma once

#include "fedwan/export.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/node_options.hpp"

namespace fedwan {

// A named piece of caller state saved with the site's checkpoints (the inner
// optimizer's state, say): name 1..64 of [a-z0-9_.-], not "params",
// "anchor", "residual" or "meta".
struct FEDWAN_API StateBlob {
  std::string name;
  std::vector<uint8_t> bytes;
};

// Encodes a site's update where its model lives instead of on the host:
// fedwan::Site sets one for a model on a CUDA device, which computes
// (anchor - params) on the GPU and encodes it there (fedwan::cuda::
// DeviceEncoder), so only encoded bytes cross to the host. It keeps the
// error-feedback residual itself; SiteCore's checkpoints still hold it.
// Called only from the thread that drives the SiteCore.
class FEDWAN_API UpdateEncoder {
 public:
  virtual ~UpdateEncoder() = default;
  // Writes codec.encoded_size(n) bytes to `out`: elements [offset, offset+n)
  // of (anchor - params), encoded by `codec`, with error feedback when
  // `error_feedback` (lossy codecs). Bytes and residual must be what
  // codec.encode gives on the host. sync() calls it chunk by chunk, in
  // order, once per chunk per round. Throws like Codec::encode, leaving the
  // residual untouched.
  virtual void encode(const Codec& codec, uint64_t offset, uint32_t n, bool error_feedback,
                      uint8_t* out) = 0;
  // The residual (n floats, the whole model): read before every
  // checkpoint, written after a resume (and zeroed on a resync).
  virtual void read_residual(float* out, size_t n) = 0;
  virtual void write_residual(const float* in, size_t n) = 0;
};

// Topology, node id (a site of the topology), join timeout, window,
// security, checkpoints, costs and metrics: see NodeOptions.
struct FEDWAN_API SiteOptions : NodeOptions {
  // How long sync() waits for the next anchor; defaults to the topology's
  // federation.round_timeout_s.
  std::chrono::milliseconds round_timeout{0};
  // Caller state saved with each checkpoint in checkpoint_dir and given
  // back on resume.
  std::function<std::vector<StateBlob>()> save_state;             // called at each checkpoint
  std::function<void(const std::vector<StateBlob>&)> load_state;  // called on resume
  // The share of the site's time its whole checkpoints may take. A whole
  // checkpoint (parameters, anchor, residual, state) of more than 64 MiB is
  // written at a round boundary once the time since the last one is its
  // cost over this; at the boundaries between, the site writes its replica
  // image instead (a fraction of the size; resume() takes the newer). At
  // 1 every boundary is whole; smaller checkpoints always are.
  double checkpoint_budget = 0.05;
  // A model of at least this many bytes (fp32) keeps two things out of the
  // site's anonymous memory, in files in checkpoint_dir (else the temporary
  // directory) that have no name: the anchor (the federation's model of the
  // round, an fp32 copy beside the parameters, read once a round for the
  // update and written once by the next anchor) in a shared mapping whose
  // blocks are allocated up front, which the kernel keeps in memory while
  // memory is plentiful and writes out and drops when it is short; and the
  // update's encoded frames, kept until the next anchor in case the parent
  // asks for them again. 0: always; SIZE_MAX: never. Where a file cannot be
  // made, memory (logged).
  size_t page_out_from_bytes = size_t{1} << 30;
  // Null: the update is encoded on the host from the params buffer.
  std::shared_ptr<UpdateEncoder> update_encoder;
  // What the cost records (costs_path) count the training time in: this
  // many devices of this kind, "cpu" or "gpu".
  uint32_t devices = 1;
  std::string device_kind = "cpu";
};

struct FEDWAN_API SyncResult {
  uint64_t round = 0;       // the round the site now trains in
  bool finished = false;    // the federation is done; params hold the final model
  bool resynced = false;    // params were replaced by the parent's anchor (rejoin)
  uint64_t bytes_sent = 0;  // this sync, on the wire
  // Of bytes_sent: chunks of the update sent again because the parent lacked
  // them after its progress stalled.
  uint64_t bytes_resent = 0;
  uint64_t bytes_received = 0;
  // Bytes of this site's checkpoint replica sent to its parent since the
  // previous sync returned (not in bytes_sent: replicas go when nothing of
  // the round waits, but they share the link).
  uint64_t replica_bytes = 0;
  // Seconds this call spent paused outside the site's participation windows
  // (NodeSpec::windows); after a pause the site resyncs (resynced is true).
  double paused_seconds = 0;
};

class SiteCore;

// A sync running in the background (SiteCore::begin_sync), like a c10d
// Work: ask whether it is in, or wait for it with a timeout. wait() merges
// it as SiteCore::finish_sync() does and returns its result; the handle is
// then spent. It refers to the core without owning it (the core must
// outlive it) and is not thread safe: use it from the thread that trains.
// Move-only; a default-built or moved-from handle refers to nothing.
class FEDWAN_API PendingSync {
 public:
  PendingSync() = default;
  PendingSync(PendingSync&& other) noexcept;
  PendingSync& operator=(PendingSync&& other) noexcept;
  PendingSync(const PendingSync&) = delete;
  PendingSync& operator=(const PendingSync&) = delete;

  // It refers to a sync not merged yet (by wait() or finish_sync()).
  bool valid() const;
  // The sync is in: wait() would not block.
  bool ready() const;
  // Waits up to `timeout` for the sync to come in; then merges it and
  // returns its result. std::nullopt when the timeout passed first (it is
  // still pending: train on and wait again). Throws Error when the handle
  // refers to nothing or its sync was merged already, and what
  // finish_sync() throws.
  std::optional<SyncResult> wait(std::chrono::milliseconds timeout);

 private:
  friend class SiteCore;
  PendingSync(SiteCore* core, uint64_t generation) : core_(core), generation_(generation) {}
  SiteCore* core_ = nullptr;
  uint64_t generation_ = 0;
};

class FEDWAN_API SiteCore {
 public:
  // `params` (n floats) is the live model; it must outlive the SiteCore.
  // Throws ConfigError if the node is not a site of the topology.
  SiteCore(SiteOptions options, float* params, size_t n);
  ~SiteCore();
  SiteCore(const SiteCore&) = delete;
  SiteCore& operator=(const SiteCore&) = delete;

  // Connects and joins. Afterwards params hold the federation's anchor for
  // the current round (unchanged when they already matched it). Throws
  // TimeoutError, or ProtocolError with the parent's reason when refused,
  // StoppedError after stop().
  SyncResult join();

  // Ends the round: sends (anchor - params), compressed with error feedback,
  // waits for the next anchor and loads it into params. Throws TimeoutError,
  // ProtocolError (refused, or a malformed anchor), TransportError,
  // StoppedError after stop(). One that throws after part of the next
  // anchor came in (each chunk goes into the anchor and params as it comes)
  // leaves the core unusable: later calls throw Error; build a new one,
  // whose join() resumes from the last checkpoint.
  SyncResult sync();

  // Overlap (federation.overlap_steps = tau > 0, docs/architecture.md):
  // the round's sync runs on a worker thread while the caller keeps
  // training. begin_sync() ends the round as sync() does - the update is
  // (anchor - params) at that moment - but returns at once: it copies
  // params, and the update streams up and the next anchor comes down in the
  // background. Keep training on params; tau inner steps later call
  // finish_sync(), which waits for the anchor if it is not in yet and
  // merges it: params += (new anchor - params at begin_sync), so the local
  // progress since begin_sync is kept on top of the new anchor and counts in
  // the next round's update. On a resync params become the parent's model
  // (the progress is dropped, as in sync()); when the federation finishes
  // they become its final model. finish_sync() checkpoints at the merge.
  // begin_sync() returns a handle on the pending sync (PendingSync, whose
  // wait(timeout) merges it like finish_sync(); ignoring it is fine).
  // Between the two calls use only sync_pending(), sync_ready(),
  // finish_sync(), the handle, stop(), set_data_position(), service() (which keeps the
  // link once the sync is done and reports nothing of it: finish_sync() reports a resync
  // or the end; keep calling it between inner steps), round() and finished() (both still
  // describe the round that ended), inner_steps(), overlap_steps(), rounds(),
  // data_position(), checkpoint() (which then keeps the last merge's) and
  // alarms() (as last read before begin_sync). A begin_sync() or
  // finish_sync() that throws leaves the core unusable: build a new one,
  // whose join() resumes from the last checkpoint. Works on the host copy:
  // refused (ConfigError) with an UpdateEncoder. Memory: one more copy of
  // the model while a sync is pending.
  PendingSync begin_sync();
  bool sync_pending() const;
  bool sync_ready() const;  // finish_sync() would not wait
  SyncResult finish_sync();

  // Keeps the link alive while the caller trains: sends a heartbeat when one
  // is due, reads what the parent sent (a resync included: then params hold
  // a new anchor and round() changed; the result says so) and reconnects a
  // lost link. Cheap; call it between inner steps (fedwan::Site does).
  SyncResult service();

  // Writes a checkpoint of the current state now (SIGTERM handling); a no-op
  // without a checkpoint directory, and after a sync() that did not finish
  // (it threw): part of the next round may be in params then, and a restart
  // resumes from the checkpoint taken when the round began.
  void checkpoint();

  // Makes a join() in progress, and any later join() or sync(), throw
  // StoppedError within ~100 ms. A sync() in progress may still finish its
  // round for up to `grace` (SIGTERM handling: the round's local work is
  // kept when the parent answers in time), then throws StoppedError too.
  // Callable from any thread and from a signal handler (it reads the clock
  // and stores atomics). service() is not affected: a caller that stops
  // between inner steps checkpoints there and exits.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  // Leaves the federation gracefully (docs/operations.md, "Membership"):
  // tells the parent, which stops waiting for this site and counts it out
  // of the quorum from the current round on. Call it between syncs, not
  // while one is pending. Returns whether the parent was told within
  // `timeout` (if not, the parent finds the site gone by its heartbeat
  // timeout). Afterwards join() and sync() throw Error. A new SiteCore of
  // this site (it may resume from its checkpoint) joins again and counts
  // from the next round.
  bool leave(std::chrono::milliseconds timeout = std::chrono::seconds(5));

  // Where the caller's data stream is, saved with each checkpoint.
  void set_data_position(uint64_t position);
  uint64_t data_position() const;
  bool resumed() const;  // join() resumed from a checkpoint
  // Conditions an operator must act on that the site rode out (its audit
  // log could not be written, the CRL is expiring or expired, ...), "kind:
  // message" (docs/operations.md, "Alarms").
  std::vector<std::string> alarms() const;

  // The anchor of the current round (n floats, host memory): what the
  // update is measured against. Valid until the next call that can change
  // the round (join, sync, service).
  const float* anchor() const;
  uint64_t round() const;
  bool finished() const;
  uint64_t inner_steps() const;    // H, from the topology
  uint64_t overlap_steps() const;  // tau, from the topology (0: blocking rounds)
  uint64_t rounds() const;         // of the whole federation, from the topology
  const std::array<uint8_t, 32>& initial_digest() const;

 private:
  friend class PendingSync;
  class FEDWAN_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedwan

// SiteCore's state, private to site_core.cpp (the round protocol),
// site_link.cpp (link upkeep) and site_checkpoint.cpp (saving and resuming). Thread safety: one
// thread drives a SiteCore.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/site_core.hpp"
#include "node/node_config.hpp"
#include "node/node_security.hpp"
#include "checkpoint/checkpoint_upload.hpp"
#include "checkpoint/replica_store.hpp"
#include "session/parent_session.hpp"
#include "tensor/chunk_plan.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan {

class SiteCore::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(SiteOptions options, float* params, size_t n);
  SyncResult join();
  SyncResult sync();
  SyncResult service();
  void save_checkpoint();

  SiteOptions opt;
  const Topology& topo;
  const NodeSpec& self;
  const node::NodeConfig cfg;
  float* params;
  ChunkPlan plan;
  wire::FrameLimits limits;  // what frames from the parent may be
  std::array<uint8_t, 32> initial_digest{};
  std::vector<float> anchor;    // the model the federation agreed on for `round`
  std::vector<float> residual;  // error feedback of the deltas sent (lossy codecs)
  uint64_t round = 0;
  bool joined = false;
  bool finished = false;
  bool resumed = false;
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
  // Throws StoppedError after stop(); inside a sync, only once its grace
  // has run out.
  void throw_if_stopped(const char* where) const;

  // Declared before the link: its security layer reports to it.
  std::unique_ptr<node::NodeSecurity> security;
  // Makes the link to the parent (its kind from the parent's endpoint).
  std::unique_ptr<transport::Transport> transport;
  // The link to the parent, its reconnects and liveness.
  std::unique_ptr<session::ParentSession> parent;
  ParentLink& link() { return parent->link(); }

 private:
  // The update anchor of round+1 while sync() waits for it (into params).
  struct Assembly {
    uint64_t round = 0;
    std::vector<bool> got;
    uint32_t received = 0;
    bool done_signalled = false;  // the federation finished instead
  };
  // A model sent in full after a welcome (join or resync; into anchor).
  struct FullAssembly {
    uint64_t round = 0;
    std::vector<bool> got;
    uint32_t received = 0;
  };
  struct EarlyChunk {
    uint32_t chunk;
    uint8_t codec;
    std::vector<uint8_t> payload;
  };

  void reset_link_state();  // a new link: nothing sent on it failed yet
  bool resume();  // true when a local checkpoint was loaded
  void start_upload();  // after a checkpoint: send it to the parent
  void pump_upload();
  std::optional<wire::ParsedFrame> poll_frame(Incoming* in, Millis timeout);
  void pump(Millis wait, SyncResult* res);
  void upkeep();
  void reconnect(const std::string& why, bool grow_backoff = true);
  std::vector<uint8_t> hello_frame() const;
  void on_frame(const wire::ParsedFrame& f, SyncResult* res);
  void on_welcome(const wire::ParsedFrame& f, SyncResult* res);
  void on_anchor(const wire::ParsedFrame& f, SyncResult* res);
  void on_heartbeat(const wire::ParsedFrame& f);
  void apply_update_chunk(uint32_t chunk, const Codec& c, const uint8_t* payload);
  void apply_early();
  bool send_now(std::vector<uint8_t> frame, SyncResult* res);
  void resend_update();
  void confirm_end(SyncResult* res);

  // The round's update, unsealed, kept until the next anchor is in.
  std::vector<std::vector<uint8_t>> update_frames;
  bool sent = false;  // the whole update of `round` is in update_frames
  uint32_t encoded_upto = 0;
  std::vector<EarlyChunk> early;
  std::optional<Assembly> next;
  std::optional<FullAssembly> full;

  bool link_ok = true;
  bool joined_once = false;      // holds a federation anchor
  bool welcomed_once = false;
  bool awaiting_welcome = false;
  bool hello_pending = false;
  int behind_beats = 0;
  std::string last_link_error;
  Clock::time_point last_heartbeat, last_resend;
  Clock::time_point hello_sent_at, progress_at, sent_at, anchor_progress_at;
  Clock::time_point next_tick;  // the node security's upkeep (CRL, audit, noise)
  bool sealing_active = false;  // the sealing pipeline's worker owns the sealer
  // Checkpoint replication: the parent keeps replicas (its welcome said so);
  // this site's latest checkpoint on its way up, a piece at a time.
  bool parent_keeps_replicas = false;
  std::unique_ptr<checkpoint::CheckpointUpload> upload;
};

}  // namespace fedwan

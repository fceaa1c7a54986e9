#include "checkpoint/replica_fetch.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/node_checkpoint.hpp"
#include "checkpoint/replica_store.hpp"
#include "common/atomic_file.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "node/node_security.hpp"

namespace fedwan::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

// One fetch_replica call: the session in use, the answer being assembled, and
// the pacing of requests and of new sessions. Blocks like fetch_replica.
class ReplicaFetch {
 public:
  ReplicaFetch(transport::ParentLink& first_link,
               const std::function<transport::ParentLink&(const std::string&)>& reconnect,
               const Topology& topo, const NodeSpec& self, const node::NodeConfig& config,
               const std::filesystem::path& dir, uint64_t model_elements, Millis timeout,
               NodeSecurity& security, const std::atomic<bool>* stop)
      : link_(&first_link),
        reconnect_(reconnect),
        topo_(topo),
        self_(self),
        config_(config),
        dir_(dir),
        timeout_(timeout),
        security_(security),
        stop_(stop) {
    // The root's copy lives on its standby, which answers as the root.
    const bool from_standby = self.role == Role::kRoot;
    parent_id_ = from_standby ? "standby" : topo.node(self.parent_index).id;
    parent_sender_ = from_standby ? self.index : self.parent_index;
    deadline_ = Clock::now() + timeout;
    ask_every_ = config.heartbeat_timeout;
    log().info("[{}] no intact local checkpoint; asking '{}' for its replica", self.id, parent_id_);
    wire::HelloPayload hello;
    hello.node_id = self.id;
    hello.topology_digest = topo.digest();
    wire::FrameHeader hh = node::node_header(topo, self.index, wire::MsgType::kHello, 0);
    hh.total_elements = model_elements;
    hh.flags = wire::kFlagNeedReplica;
    ask_ = node::make_frame(hh, wire::encode_hello(hello));
    make_private_directory(dir);
    // Asked at once when the link is up; again when nothing came for a while.
    progress_at_ = Clock::now() - ask_every_;
    reconnected_at_ = Clock::now();
  }

  bool run() {
    for (;;) {
      const auto now = Clock::now();
      throw_if_stopped_or_late(now);
      if (given_up(now)) continue;
      transport::Incoming in;
      if (!ask_and_receive(now, &in)) continue;
      const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, config_.limits);
      if (!f.ok() || f.header.job_id != topo_.job_id() || f.header.sender != parent_sender_) {
        security_.log_noise("replica-fetch-frame:" + self_.id,
                            "[" + self_.id + "] ignored a frame while fetching its replica: " +
                                (f.ok() ? std::string("wrong job or sender") : f.detail));
        continue;
      }
      heard_at_ = Clock::now();
      silent_sessions_ = 0;
      if (const std::optional<bool> done = on_frame(f)) return *done;
    }
  }

 private:
  void throw_if_stopped_or_late(Clock::time_point now) const {
    if (stop_ != nullptr && stop_->load()) {
      throw StoppedError("'" + self_.id + "' stopped while fetching its replica from '" +
                         parent_id_ + "'");
    }
    if (now >= deadline_) {
      throw TimeoutError("'" + self_.id + "': no replica (or answer that it has none) from '" +
                         parent_id_ + "' at " + link_->endpoint() + " within " +
                         std::to_string(timeout_.count() / 1000) + " s" +
                         (last_error_.empty() ? "" : "; last error: " + last_error_));
    }
  }

  // Whether the session in use was given up (a new one is started): true
  // when it did not come up in time, or came up and brought nothing.
  bool given_up(Clock::time_point now) {
    if (!link_->established()) {
      // A handshake message lost on the way, or a parent too busy to answer
      // in time: nothing fails and nothing more comes, so a session that is
      // not up in time is given up (the parent's own handshake state expires
      // likewise). The limit doubles, up to 4 heartbeat timeouts, with each
      // session in a row that brought nothing: a parent whose handshake takes
      // longer than one heartbeat timeout under load is still reached.
      const Millis limit = config_.heartbeat_timeout * (1 << std::min(silent_sessions_, 2));
      if (now - reconnected_at_ <= limit) return false;
      ++silent_sessions_;
      start_over("its secure session did not come up within " + std::to_string(limit.count()) +
                 " ms");
      return true;
    }
    if (!up_) {
      up_ = true;
      heard_at_ = now;
    }
    // Up, and asked (twice, by now) with nothing at all coming back: a
    // root's standby, which completes TLS but serves nobody while the root
    // lives, or a parent that lost this node. Staying would wait out the
    // whole timeout; a new session goes to the root again when the parent
    // has a standby (session::ParentSession alternates them).
    if (now - heard_at_ <= 2 * ask_every_) return false;
    ++silent_sessions_;
    start_over("its session came up but '" + parent_id_ + "' answered nothing within " +
               std::to_string((2 * ask_every_).count()) + " ms");
    return true;
  }

  // Anyone on the path can refuse, break or stall a session that is not
  // up yet: try a new one (at a steady pace) until the timeout.
  void start_over(std::string why) {
    last_error_ = std::move(why);
    security_.log_noise("replica-fetch-link:" + self_.id,
                        "[" + self_.id + "] " + last_error_ + "; trying a new session");
    const auto wait = ask_every_ / 4 - (Clock::now() - reconnected_at_);
    // In slices, so a stop is seen within ~100 ms.
    const auto wake = Clock::now() + std::min<Clock::duration>(wait, deadline_ - Clock::now());
    while (Clock::now() < wake && !(stop_ != nullptr && stop_->load())) {
      std::this_thread::sleep_for(std::min<Clock::duration>(Millis(100), wake - Clock::now()));
    }
    link_ = &reconnect_(last_error_);
    reconnected_at_ = Clock::now();
    up_ = false;
    asked_at_ = {};
    assembly_.reset();
  }

  // Sends the request when it is due, then waits up to 100 ms for a frame.
  // False when none came, or the session failed and a new one was started.
  bool ask_and_receive(Clock::time_point now, transport::Incoming* in) {
    try {
      // The request, or a piece, may be lost on a bad link: ask again.
      if (link_->established() && now - asked_at_ > ask_every_ &&
          now - progress_at_ > ask_every_ / 2) {
        if (link_->try_send(ask_)) {
          asked_at_ = progress_at_ = now;
          assembly_.reset();
        }
      }
      return link_->recv(in, Millis(100));
    } catch (const CryptoError& e) {
      // A parent that proved who it is and is the wrong one ends it.
      if (link_->security().failure_is_final()) throw;
      start_over(e.what());
      return false;
    }
  }

  // A frame from the parent: the fetch's result once the answer is complete
  // (or refused), nullopt while it goes on.
  std::optional<bool> on_frame(const wire::ParsedFrame& f) {
    const wire::FrameHeader& h = f.header;
    if (h.type == wire::MsgType::kReject) {
      throw ProtocolError("'" + self_.id + "' refused by '" + parent_id_ + "': " +
                          std::string(reinterpret_cast<const char*>(f.payload), f.payload_size));
    }
    if (h.type != wire::MsgType::kCheckpoint) return std::nullopt;  // heartbeats and the like
    if (h.flags == wire::kFlagNoReplica) {
      log().warn("[{}] '{}' keeps no replica of it; starting from the federation's model", self_.id,
                 parent_id_);
      security_.audit("replica_missing", {{"parent", parent_id_}});
      return false;
    }
    if (h.flags != 0) return std::nullopt;
    progress_at_ = Clock::now();
    if (h.chunk_index == 0) {
      assembly_.emplace(checkpoint_path(dir_, self_.id), self_.id, topo_.lineage_digest(), h.round,
                        h.chunk_count, h.total_elements,
                        checkpoint_trust(security_, topo_, self_).check);
    }
    if (!assembly_) return std::nullopt;  // a piece of an answer whose start was lost
    std::string why;
    switch (assembly_->add(h.chunk_index, h.chunk_count, h.round, h.total_elements, f.payload,
                           f.payload_size, &why)) {
      case CheckpointAssembly::Status::kMore: break;
      case CheckpointAssembly::Status::kFailed: {
        // Nothing was installed. A replica that is not this node's own,
        // intact and signed is refused like a corrupt local checkpoint: the
        // node goes on as one without any (it joins and gets the
        // federation's model), and the operator hears of it.
        security_.audit("replica_refused",
                        {{"peer", parent_id_}, {"round", h.round}, {"reason", why}});
        std::string alarm =
            "the replica '" + parent_id_ + "' sent for round " + std::to_string(h.round);
        alarm += " was refused: " + why + "; starting from the federation's model instead";
        security_.alarm("replica_refused", alarm);
        return false;
      }
      case CheckpointAssembly::Status::kDone:
        log().info("[{}] restored its checkpoint of round {} from '{}' ({} bytes)", self_.id,
                   h.round, parent_id_, h.total_elements);
        security_.audit("replica_restored", {{"parent", parent_id_},
                                             {"round", h.round},
                                             {"bytes", h.total_elements},
                                             {"digest", assembly_->digest_hex()}});
        return true;
    }
    return std::nullopt;
  }

  transport::ParentLink* link_;
  const std::function<transport::ParentLink&(const std::string&)>& reconnect_;
  const Topology& topo_;
  const NodeSpec& self_;
  const node::NodeConfig& config_;
  const std::filesystem::path& dir_;
  const Millis timeout_;
  NodeSecurity& security_;
  const std::atomic<bool>* stop_;
  std::string parent_id_;
  uint32_t parent_sender_ = 0;
  Clock::time_point deadline_;
  Millis ask_every_{};
  std::vector<uint8_t> ask_;
  std::optional<CheckpointAssembly> assembly_;
  std::string last_error_;
  Clock::time_point asked_at_{};
  Clock::time_point progress_at_;
  Clock::time_point reconnected_at_;
  bool up_ = false;             // the session in use came up
  Clock::time_point heard_at_;  // it came up, or the parent's last frame on it
  int silent_sessions_ = 0;     // sessions in a row that brought no frame
};

}  // namespace

bool fetch_replica(transport::ParentLink& first_link,
                   const std::function<transport::ParentLink&(const std::string&)>& reconnect,
                   const Topology& topo, const NodeSpec& self, const node::NodeConfig& config,
                   const std::filesystem::path& dir, uint64_t model_elements, Millis timeout,
                   NodeSecurity& security, const std::atomic<bool>* stop) {
  return ReplicaFetch(first_link, reconnect, topo, self, config, dir, model_elements, timeout,
                      security, stop)
      .run();
}

}  // namespace fedwan::checkpoint

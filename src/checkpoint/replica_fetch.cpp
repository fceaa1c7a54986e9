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

bool fetch_replica(ParentLink& first_link,
                   const std::function<ParentLink&(const std::string&)>& reconnect,
                   const Topology& topo, const NodeSpec& self, const node::NodeConfig& config,
                   const std::filesystem::path& dir, uint64_t model_elements, Millis timeout,
                   NodeSecurity& security, const std::atomic<bool>* stop) {
  using Clock = std::chrono::steady_clock;
  // The root's copy lives on its standby, which answers as the root.
  const bool from_standby = self.role == Role::kRoot;
  const std::string parent_id = from_standby ? "standby" : topo.node(self.parent_index).id;
  const uint32_t parent_sender = from_standby ? self.index : self.parent_index;
  const auto deadline = Clock::now() + timeout;
  const Millis ask_every = config.heartbeat_timeout;
  log().info("[{}] no intact local checkpoint; asking '{}' for its replica", self.id, parent_id);
  wire::HelloPayload hello;
  hello.node_id = self.id;
  hello.topology_digest = topo.digest();
  wire::FrameHeader hh = node_header(topo, self.index, wire::MsgType::kHello, 0);
  hh.total_elements = model_elements;
  hh.flags = wire::kFlagNeedReplica;
  const std::vector<uint8_t> ask = make_frame(hh, wire::encode_hello(hello));
  make_private_directory(dir);

  std::optional<CheckpointAssembly> assembly;
  ParentLink* link = &first_link;
  std::string last_error;
  auto asked_at = Clock::time_point{};
  // Asked at once when the link is up; again when nothing came for a while.
  auto progress_at = Clock::now() - ask_every;
  auto reconnected_at = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    if (stop != nullptr && stop->load()) {
      throw StoppedError("'" + self.id + "' stopped while fetching its replica from '" + parent_id +
                         "'");
    }
    if (now >= deadline) {
      throw TimeoutError("'" + self.id + "': no replica (or answer that it has none) from '" +
                         parent_id + "' at " + link->endpoint() + " within " +
                         std::to_string(timeout.count() / 1000) + " s" +
                         (last_error.empty() ? "" : "; last error: " + last_error));
    }
    // Anyone on the path can refuse, break or stall a session that is not
    // up yet: try a new one (at a steady pace) until the timeout.
    const auto start_over = [&](std::string why) {
      last_error = std::move(why);
      security.log_noise("replica-fetch-link:" + self.id,
                         "[" + self.id + "] " + last_error + "; trying a new session");
      const auto wait = ask_every / 4 - (Clock::now() - reconnected_at);
      // In slices, so a stop is seen within ~100 ms.
      const auto wake = Clock::now() + std::min<Clock::duration>(wait, deadline - Clock::now());
      while (Clock::now() < wake && !(stop != nullptr && stop->load())) {
        std::this_thread::sleep_for(std::min<Clock::duration>(Millis(100), wake - Clock::now()));
      }
      link = &reconnect(last_error);
      reconnected_at = Clock::now();
      asked_at = {};
      assembly.reset();
    };
    // A handshake message lost on the way: nothing fails and nothing more
    // comes, so a session that is not up within a heartbeat timeout is
    // given up (the parent's own handshake state expires likewise).
    if (!link->established() && now - reconnected_at > config.heartbeat_timeout) {
      start_over("its secure session did not come up within " +
                 std::to_string(config.heartbeat_timeout.count()) + " ms");
      continue;
    }
    Incoming in;
    try {
      // The request, or a piece, may be lost on a bad link: ask again.
      if (link->established() && now - asked_at > ask_every && now - progress_at > ask_every / 2) {
        if (link->try_send(ask)) {
          asked_at = progress_at = now;
          assembly.reset();
        }
      }
      if (!link->recv(&in, Millis(100))) continue;
    } catch (const CryptoError& e) {
      // A parent that proved who it is and is the wrong one ends it.
      if (link->security().failure_is_final()) throw;
      start_over(e.what());
      continue;
    }
    const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, config.limits);
    if (!f.ok() || f.header.job_id != topo.job_id() || f.header.sender != parent_sender) {
      security.log_noise("replica-fetch-frame:" + self.id,
                         "[" + self.id + "] ignored a frame while fetching its replica: " +
                             (f.ok() ? std::string("wrong job or sender") : f.detail));
      continue;
    }
    const wire::FrameHeader& h = f.header;
    if (h.type == wire::MsgType::kReject) {
      throw ProtocolError("'" + self.id + "' refused by '" + parent_id + "': " +
                          std::string(reinterpret_cast<const char*>(f.payload), f.payload_size));
    }
    if (h.type != wire::MsgType::kCheckpoint) continue;  // heartbeats and the like
    if (h.flags == wire::kFlagNoReplica) {
      log().warn("[{}] '{}' keeps no replica of it; starting from the federation's model", self.id,
                 parent_id);
      security.audit("replica_missing", {{"parent", parent_id}});
      return false;
    }
    if (h.flags != 0) continue;
    progress_at = Clock::now();
    if (h.chunk_index == 0) {
      assembly.emplace(checkpoint_path(dir, self.id), self.id, topo.lineage_digest(), h.round,
                       h.chunk_count, h.total_elements,
                       checkpoint_trust(security, topo, self).check);
    }
    if (!assembly) continue;  // a piece of an answer whose start was lost
    std::string why;
    switch (assembly->add(h.chunk_index, h.chunk_count, h.round, h.total_elements, f.payload,
                          f.payload_size, &why)) {
      case CheckpointAssembly::Status::kMore: break;
      case CheckpointAssembly::Status::kFailed: {
        // Nothing was installed. A replica that is not this node's own,
        // intact and signed is refused like a corrupt local checkpoint: the
        // node goes on as one without any (it joins and gets the
        // federation's model), and the operator hears of it.
        security.audit("replica_refused",
                       {{"peer", parent_id}, {"round", h.round}, {"reason", why}});
        std::string alarm =
            "the replica '" + parent_id + "' sent for round " + std::to_string(h.round);
        alarm += " was refused: " + why + "; starting from the federation's model instead";
        security.alarm("replica_refused", alarm);
        return false;
      }
      case CheckpointAssembly::Status::kDone:
        log().info("[{}] restored its checkpoint of round {} from '{}' ({} bytes)", self.id,
                   h.round, parent_id, h.total_elements);
        security.audit("replica_restored", {{"parent", parent_id},
                                            {"round", h.round},
                                            {"bytes", h.total_elements},
                                            {"sha256", assembly->sha256_hex()}});
        return true;
    }
  }
}

}  // namespace fedwan::checkpoint

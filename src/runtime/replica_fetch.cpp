#include "runtime/replica_fetch.hpp"

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "runtime/node_checkpoint.hpp"
#include "runtime/node_frames.hpp"
#include "runtime/node_security.hpp"
#include "runtime/replica_store.hpp"

namespace fedwan::runtime {

bool fetch_replica(ParentLink& link, const Topology& topo, const NodeSpec& self,
                   const std::filesystem::path& dir, uint64_t model_elements, Millis timeout,
                   NodeSecurity& security) {
  using Clock = std::chrono::steady_clock;
  // The root's copy lives on its standby, which answers as the root.
  const bool from_standby = self.role == Role::kRoot;
  const std::string parent_id = from_standby ? "standby" : topo.node(self.parent_index).id;
  const uint32_t parent_sender = from_standby ? self.index : self.parent_index;
  const auto deadline = Clock::now() + timeout;
  const Millis ask_every(
      static_cast<int64_t>(topo.federation().heartbeat_timeout_s * 1000));
  log().info("[{}] no intact local checkpoint; asking '{}' for its replica", self.id, parent_id);
  link.wait_established(timeout);
  wire::HelloPayload hello;
  hello.node_id = self.id;
  hello.topology_digest = topo.digest();
  wire::FrameHeader hh = node_header(topo, self.index, wire::MsgType::kHello, 0);
  hh.total_elements = model_elements;
  hh.flags = wire::kFlagNeedReplica;
  const std::vector<uint8_t> ask = make_frame(hh, wire::encode_hello(hello));
  make_private_directory(dir);

  wire::FrameLimits limits;
  limits.max_piece_bytes = static_cast<uint32_t>(topo.federation().chunk_bytes);
  std::optional<CheckpointAssembly> assembly;
  auto asked_at = Clock::time_point{};
  auto progress_at = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError("'" + self.id + "': no replica (or answer that it has none) from '" +
                         parent_id + "' at " + link.endpoint() + " within " +
                         std::to_string(timeout.count() / 1000) + " s");
    }
    // The request, or a piece, may be lost on a bad link: ask again.
    if (now - asked_at > ask_every && now - progress_at > ask_every / 2) {
      (void)link.send(ask, ask_every);
      asked_at = progress_at = now;
      assembly.reset();
    }
    Incoming in;
    if (!link.recv(&in, Millis(100))) continue;
    const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, limits);
    if (!f.ok() || f.header.job_id != topo.job_id() || f.header.sender != parent_sender) {
      log().warn("[{}] ignored a frame while fetching its replica: {}", self.id,
                 f.ok() ? "wrong job or sender" : f.detail);
      continue;
    }
    const wire::FrameHeader& h = f.header;
    if (h.type == wire::MsgType::kReject) {
      throw ProtocolError("'" + self.id + "' refused by '" + parent_id + "': " +
                          std::string(reinterpret_cast<const char*>(f.payload), f.payload_size));
    }
    if (h.type != wire::MsgType::kCheckpoint) continue;  // heartbeats and the like
    if (h.flags == wire::kFlagNoReplica) {
      log().warn("[{}] '{}' keeps no replica of it; starting from the federation's model",
                 self.id, parent_id);
      security.audit("replica_missing", {{"parent", parent_id}});
      return false;
    }
    if (h.flags != 0) continue;
    progress_at = Clock::now();
    if (h.chunk_index == 0) {
      assembly.emplace(checkpoint_path(dir, self.id), self.id, topo.digest(), h.round,
                       h.chunk_count, h.total_elements);
    }
    if (!assembly) continue;  // a piece of an answer whose start was lost
    std::string why;
    switch (assembly->add(h.chunk_index, h.chunk_count, h.round, h.total_elements, f.payload,
                          f.payload_size, &why)) {
      case CheckpointAssembly::Status::kMore:
        break;
      case CheckpointAssembly::Status::kFailed:
        throw CryptoError("'" + self.id + "': the replica '" + parent_id +
                          "' sent does not verify: " + why);
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

}  // namespace fedwan::runtime

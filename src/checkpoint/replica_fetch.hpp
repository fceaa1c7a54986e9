// Restoring a node from its parent's replica: a node (site or region) whose
// local checkpoints are all missing or corrupt asks its parent for the copy
// of its latest checkpoint the parent keeps, and a root whose checkpoints are
// all corrupt asks its standby (docs/operations.md#recovery)
// and installs it as its local checkpoint, then resumes from it as usual.
// Blocks the calling thread; used once, before the node joins.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "fedwan/topology.hpp"
#include "node/node_config.hpp"
#include "transport/links.hpp"

namespace fedwan::node {
class NodeSecurity;
}  // namespace fedwan::node

namespace fedwan::checkpoint {

using transport::Millis;

using node::NodeSecurity;

// Sends a hello with kFlagNeedReplica over `link` (to the parent, or for the
// root to its standby) and receives the answer:
// the replica in pieces (written atomically as <dir>/<node>.fwck and checked
// to be this node's, under this topology) or the parent's "none". Returns
// true when a replica was installed, false when the parent keeps none.
// `model_elements` is the node's model size (0 when not known yet). The
// request goes again after config.heartbeat_timeout without an answer.
// A session that fails in a way an unauthenticated party could have caused
// (a plain refusal, a TLS alert), that does not come up within a heartbeat
// timeout (doubling, up to four, while sessions in a row bring nothing), or
// that comes up but brings no frame for two heartbeat timeouts (a root's
// standby serves nobody while the root lives) is replaced through
// `reconnect(why)`, which returns the new link, and the request goes again,
// until `timeout`.
// A replica that does not verify (its signature included: a parent cannot
// forge a child's checkpoint) is refused, audited and alarmed, and the
// result is false, as when there is none. Throws TimeoutError when no
// answer comes within `timeout`, ProtocolError when the parent refuses the
// node, CryptoError when the session fails for good, StoppedError within
// ~100 ms of *stop turning true (stop may be null).
bool fetch_replica(transport::ParentLink& link,
                   const std::function<transport::ParentLink&(const std::string&)>& reconnect,
                   const Topology& topo, const NodeSpec& self, const node::NodeConfig& config,
                   const std::filesystem::path& dir, uint64_t model_elements, Millis timeout,
                   NodeSecurity& security, const std::atomic<bool>* stop = nullptr);

}  // namespace fedwan::checkpoint

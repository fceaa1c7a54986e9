// A node's /status answer, as `fedwan status` reads it: untrusted input from
// the network, read type-safely into what the tree shows. A field absent or
// null is unknown; a field of the wrong type, an answer that is not a JSON
// object, or one that names another node makes the whole answer malformed
// (with a short reason), never an exception. Strings are kept as the node
// sent them: print them through terminal_text (common/terminal_text.hpp).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fedwan::cli {

// A parent's view of one child (an entry of its "children").
struct ChildSeen {
  std::string id;
  std::optional<bool> healthy;
  std::optional<double> last_seen_s;
  std::optional<std::string> membership;
  std::optional<uint64_t> round;
  // The parent's verdicts on its copies (robust aggregation).
  std::optional<uint64_t> refused;
  std::optional<uint64_t> clipped;
  bool flagged = false;
};

struct NodeStatus {
  std::optional<uint64_t> round;  // 0-based, as the node counts
  std::optional<uint64_t> rounds;
  std::optional<uint64_t> members;  // an aggregator's member sites
  std::optional<uint64_t> bytes_sent;
  std::optional<uint64_t> bytes_received;
  bool paused = false;
  std::vector<ChildSeen> children;
  // Differential privacy (an aggregator's "privacy" object): the epsilon
  // its rounds spent, at `privacy_delta`, and the budget (0: none).
  std::optional<double> privacy_epsilon;
  std::optional<double> privacy_delta;
  std::optional<double> privacy_budget;
  std::optional<std::string> privacy_mode;
  std::optional<double> privacy_clip;  // this round's clip (adaptive clipping moves it)
};

struct StatusReading {
  std::optional<NodeStatus> status;  // set when the answer is well formed
  std::string malformed;             // otherwise why not (may quote the node: escape it)
};

// `body` is the answer of the node the topology calls `node_id`.
StatusReading read_node_status(const std::string& body, const std::string& node_id);

}  // namespace fedwan::cli

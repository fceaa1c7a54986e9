// What a node derives from the topology and its own options, once, so that
// no role re-reads the federation's settings or re-derives one of them: the
// codec and chunk size of its streams, the frame limits it parses with, the
// options of its links, its timeouts. Pure (no sockets); a role builds one
// in its constructor and keeps it const, so it is safe to read from any
// thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "aggregation/aggregation_rule.hpp"
#include "aggregation/update_screen.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "fedwan/topology.hpp"
#include "tensor/chunk_plan.hpp"
#include "transport/transport.hpp"
#include "wire/frame.hpp"

namespace fedwan::node {

using Millis = std::chrono::milliseconds;

// What a role's public options (AggregatorOptions, SiteOptions: a layer
// above this one) set over the topology's settings.
struct NodeOverrides {
  int window = 8;                       // frames queued per peer and direction
  std::optional<Millis> round_timeout;  // nullopt: federation.round_timeout_s
};

// The most bytes a link accepts in one message for chunks of `chunk_bytes`.
// The screen a topology's federation.aggregation asks for; throws
// ConfigError when its settings are not usable.
aggregation::ScreenConfig screen_config(const AggregationSpec& a);

int64_t max_message_bytes(uint64_t chunk_bytes);

struct NodeConfig {
  // Throws ConfigError when the federation names an unknown codec.
  NodeConfig(const Topology& topology, const NodeSpec& self, const NodeOverrides& overrides);

  const Codec* codec;    // of every delta and anchor update; never null
  uint64_t chunk_bytes;  // fp32 bytes per model chunk, and per checkpoint piece
  uint64_t rounds;
  uint64_t inner_steps;
  double quorum;             // share of the total weight a chunk closes with
  uint64_t replica_every;    // checkpoints sent up every this many rounds; 0: never
  OuterOptimizerSpec outer;  // the root's
  // How an aggregator combines its children's chunks; never null.
  std::shared_ptr<const aggregation::AggregationRule> rule;
  aggregation::ScreenConfig screen;  // what every copy is checked for first
  // Differential privacy (federation.privacy, topology/privacy_settings.hpp):
  // the same on every node. `rounds` above is already what the budget allows.
  struct Privacy {
    enum class Mode : uint8_t { kOff, kCentral, kLocal } mode = Mode::kOff;
    double clip = 0;              // L2 bound on a site's whole update per round
    double noise_multiplier = 0;  // z of every round, what the accountant composes
    // Adaptive clipping (federation.privacy.target_quantile > 0): the
    // update's share of z and the clipped count's (topology::
    // update_noise_multiplier); with a fixed clip z and 0.
    double update_noise_multiplier = 0;
    double count_noise_multiplier = 0;
    double target_quantile = 0;  // 0: the clip is fixed
    double clip_learning_rate = 0;
    double delta = 0;
    double epsilon_budget = 0;     // 0: none
    uint64_t topology_rounds = 0;  // federation.rounds (the budget may end it sooner)
    bool on() const { return mode != Mode::kOff; }
  } privacy;

  // Before the model's size is known; see limits_for_model.
  wire::FrameLimits limits;
  // Window, message size, TCP congestion control (the node's
  // tcp_congestion, else the federation's; "" for "system") and socket
  // buffers (likewise; 0: autotuning) of every link the node opens (linger
  // is the link's own business).
  transport::SocketOptions link;

  Millis round_timeout{};
  Millis heartbeat{};          // period of heartbeats on every link
  Millis heartbeat_timeout{};  // silence after which a peer is lost
  // How long after a round opens the node closes it with the chunks that
  // have quorum; nullopt: it waits for every live child. A region's comes a
  // fifth earlier than the root's, so its partial aggregate still arrives.
  std::optional<Millis> round_deadline;
  // How long a finished node waits for its children to confirm the final
  // model, and for its last frames to leave.
  Millis finish_wait{};

  // How long one piece of a node's own work may say it is busy (KeepAlive's
  // limit): half a round timeout, so that hung work (an fsync on a dead
  // disk) reads as silence early enough for its peers to go on without it
  // (a child to the root's standby) before their own waits give up.
  Millis busy_limit() const { return round_timeout / 2; }

  tensor::ChunkPlan plan(uint64_t total_elements) const {
    return tensor::ChunkPlan::from_bytes(total_elements, chunk_bytes);
  }
  // The largest checkpoint piece a peer may send (the frame limit).
  uint32_t piece_bytes() const { return static_cast<uint32_t>(chunk_bytes); }
  // The pieces this node sends: a chunk's frame in the federation's codec
  // (half a chunk in fp16), at most piece_bytes(), so a link's window of
  // queued frames holds no more bytes of a replica than of an update.
  uint32_t upload_piece_bytes() const {
    const uint64_t frame = codec->encoded_size(chunk_bytes / sizeof(float));
    return static_cast<uint32_t>(std::min<uint64_t>(std::max<uint64_t>(frame, 4096), chunk_bytes));
  }
  // `limits` once the model's size is known. A checkpoint holds a few
  // model-sized sections (parameters, anchor, residual, optimizer state):
  // one announcing far more is refused before any of it reaches the disk.
  wire::FrameLimits limits_for_model(uint64_t total_elements) const;
};

// The most bytes a checkpoint of a model of `total_elements` may have on the
// wire: kCheckpointModels fp32 models plus kCheckpointSlackBytes (a site's
// whole checkpoint with Adam's two moments is 4.5 models and its meta).
// Saturates instead of wrapping.
inline constexpr uint64_t kCheckpointModels = 16;
inline constexpr uint64_t kCheckpointSlackBytes = uint64_t{64} << 20;
uint64_t checkpoint_max_bytes(uint64_t total_elements);

}  // namespace fedwan::node

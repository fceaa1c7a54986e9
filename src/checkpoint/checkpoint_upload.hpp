// This node's latest checkpoint on its way to whoever keeps its replica (a
// site's or region's parent, the root's standby): read from disk a piece at
// a time, each piece a kCheckpoint frame, sent only when the link's window
// has room. The caller decides when nothing of the round protocol waits
// (pieces never delay a round) and starts the upload again, from the latest
// checkpoint's first piece, on a new session. Not thread safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/replica_store.hpp"
#include "fedwan/topology.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan::checkpoint {

// The next piece of `reader`'s file as a kCheckpoint frame of `round`, and
// its header.
std::pair<std::vector<uint8_t>, wire::FrameHeader> piece_frame(const Topology& topo, uint32_t self,
                                                               uint64_t round, PieceReader& reader);

class CheckpointUpload {
 public:
  CheckpointUpload(const Topology& topo, uint32_t self_index) : topo_(topo), self_(self_index) {}

  // Starts sending the checkpoint at `path`, taken at `round`, in pieces of
  // `piece_bytes` (replacing an upload in progress). Throws Error when the
  // file cannot be read; nothing is then in progress.
  void start(const std::filesystem::path& path, uint64_t round, uint32_t piece_bytes);
  // Sends up to four pieces while `link`'s session is up and its window has
  // room; ends the upload after the last.
  void pump(transport::ParentLink& link);
  bool active() const { return reader_ != nullptr; }
  uint64_t round() const { return round_; }
  void cancel();

 private:
  const Topology& topo_;
  uint32_t self_;
  std::unique_ptr<PieceReader> reader_;
  uint64_t round_ = 0;
  std::optional<std::vector<uint8_t>> piece_;  // built, not yet taken by the window
};

}  // namespace fedwan::checkpoint

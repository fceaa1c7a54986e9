// This node's latest checkpoint on its way to whoever keeps its replica (a
// site's or region's parent, the root's standby): read from disk a piece at
// a time, each piece a kCheckpoint frame, sent only when the link's window
// has room. The caller decides when nothing of the round protocol waits
// (pieces never delay a round) and restarts the upload from its first piece
// on a new session. A file replaced on disk while it is being sent is sent
// as it was when the upload began (the upload holds it open). Not thread
// safe.
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
  // Like start, but an upload in progress finishes first: the newest file
  // offered meanwhile follows it (read when it begins), so a checkpoint
  // larger than a round's time still reaches the parent whole, rather than
  // being cut short by every newer one. Throws like start when it begins at
  // once.
  void offer(const std::filesystem::path& path, uint64_t round, uint32_t piece_bytes);
  // From the first piece again (a new session: the parent dropped what it
  // had of it); a queued offer, when there is one, goes instead.
  void restart();
  // Sends pieces while `link`'s session is up and its window has room, up
  // to kPiecesPerPump; ends the upload after the last and begins a queued
  // offer.
  void pump(transport::ParentLink& link);
  bool active() const { return reader_ != nullptr || next_.has_value(); }
  // Bytes of the pieces the link took, over the upload's life (frames, with
  // their headers; pieces sent again after a restart count again).
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t round() const { return round_; }
  void cancel();

  static constexpr int kPiecesPerPump = 16;

 private:
  const Topology& topo_;
  uint32_t self_;
  std::unique_ptr<PieceReader> reader_;
  uint64_t round_ = 0;
  std::optional<std::vector<uint8_t>> piece_;  // built, not yet taken by the window
  struct Offer {
    std::filesystem::path path;
    uint64_t round;
    uint32_t piece_bytes;
  };
  std::optional<Offer> next_;  // offered while another was on its way
  uint64_t bytes_sent_ = 0;
  bool begin_next();  // false (and nothing queued) when it cannot be read
};

}  // namespace fedwan::checkpoint

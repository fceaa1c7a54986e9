#include "checkpoint/checkpoint_upload.hpp"

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan::checkpoint {

std::pair<std::vector<uint8_t>, wire::FrameHeader> piece_frame(const Topology& topo, uint32_t self,
                                                               uint64_t round,
                                                               PieceReader& reader) {
  wire::FrameHeader h = node::node_header(topo, self, wire::MsgType::kCheckpoint, round);
  h.chunk_index = reader.next_index();
  h.chunk_count = reader.count();
  h.total_elements = reader.size();
  const std::vector<uint8_t> bytes = reader.next();
  h.element_count = static_cast<uint32_t>(bytes.size());
  return {node::make_frame(h, bytes), h};
}

void CheckpointUpload::start(const std::filesystem::path& path, uint64_t round,
                             uint32_t piece_bytes) {
  cancel();
  reader_ = std::make_unique<PieceReader>(path, piece_bytes);
  round_ = round;
}

void CheckpointUpload::offer(const std::filesystem::path& path, uint64_t round,
                             uint32_t piece_bytes) {
  if (reader_ == nullptr) {
    start(path, round, piece_bytes);
    return;
  }
  next_ = Offer{path, round, piece_bytes};
}

bool CheckpointUpload::begin_next() {
  const Offer o = *next_;
  next_.reset();
  piece_.reset();
  try {
    reader_ = std::make_unique<PieceReader>(o.path, o.piece_bytes);
    round_ = o.round;
    return true;
  } catch (const Error& e) {
    reader_.reset();
    log().warn("cannot send checkpoint {} of round {}: {}", o.path.string(), o.round, e.what());
    return false;
  }
}

void CheckpointUpload::restart() {
  if (next_) {
    begin_next();
    return;
  }
  if (reader_) reader_->rewind();
  piece_.reset();
}

void CheckpointUpload::cancel() {
  reader_.reset();
  piece_.reset();
  next_.reset();
}

void CheckpointUpload::pump(transport::ParentLink& link) {
  if (!link.established()) return;
  for (int i = 0; i < kPiecesPerPump; ++i) {
    if (!piece_) {
      if (reader_ && reader_->done()) reader_.reset();
      if (!reader_ && !(next_ && begin_next())) return;
      piece_ = piece_frame(topo_, self_, round_, *reader_).first;
    }
    if (!link.try_send(*piece_)) return;
    bytes_sent_ += piece_->size();
    piece_.reset();
  }
}

}  // namespace fedwan::checkpoint

#include "checkpoint/checkpoint_upload.hpp"

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

void CheckpointUpload::cancel() {
  reader_.reset();
  piece_.reset();
}

void CheckpointUpload::pump(transport::ParentLink& link) {
  if (!reader_ || !link.established()) return;
  for (int i = 0; i < 4; ++i) {
    if (!piece_) {
      if (reader_->done()) {
        reader_.reset();
        return;
      }
      piece_ = piece_frame(topo_, self_, round_, *reader_).first;
    }
    if (!link.try_send(*piece_)) return;
    piece_.reset();
  }
}

}  // namespace fedwan::checkpoint

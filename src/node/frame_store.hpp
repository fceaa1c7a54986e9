// Where an aggregator keeps the frames of a round it may send again: the
// anchor frames it sends down (every child's outbox, a child that rejoins
// mid-round and the round's commit need them) and a region's aggregate
// frames sent up (its parent may lack some and ask again). They live for
// the round: half a model in fp16, a whole one in fp32. A FrameStore over a large model writes them
// to an unnamed file (common/spill_file.hpp) and hands out StoredFrames that read them back when
// they are needed, one frame at a time. The newest frames stay in memory too, within a small
// budget (kHotBytes): a frame sent while it is young (the common case: a child's window takes
// the anchor as it is produced) is never read back. A store that cannot make or write its file
// keeps that round's frames in memory (logged once). Not thread safe: the event loop owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/spill_file.hpp"

namespace fedwan::node {

using Frame = std::shared_ptr<const std::vector<uint8_t>>;

// A frame in memory, or where it lies in a store's file (the file lives as
// long as a StoredFrame refers to it).
class StoredFrame {
 public:
  StoredFrame() = default;
  StoredFrame(Frame frame) : frame_(std::move(frame)) {}  // NOLINT: a Frame is one
  // In a file, and while the store keeps it young, in memory as `hot`.
  StoredFrame(std::shared_ptr<const SpillFile> file, uint64_t offset, uint32_t size,
              const Frame& hot = nullptr)
      : hot_(hot), file_(std::move(file)), offset_(offset), size_(size) {}

  // Its bytes: the frame, or a copy read from the file (TransportError
  // when the read fails).
  Frame load() const;
  // The same into `scratch` when it has to be read (no allocation once
  // scratch is large enough): the bytes, valid while scratch and this are.
  const uint8_t* bytes(std::vector<uint8_t>& scratch) const;
  size_t size() const;
  bool in_memory() const { return frame_ != nullptr; }
  explicit operator bool() const { return frame_ != nullptr || file_ != nullptr; }

 private:
  Frame frame_;
  std::weak_ptr<const std::vector<uint8_t>> hot_;  // a stored frame while it is young
  std::shared_ptr<const SpillFile> file_;
  uint64_t offset_ = 0;
  uint32_t size_ = 0;
};

class FrameStore {
 public:
  // What the newest stored frames may hold in memory besides their copy on
  // disk: 4 frames of a 1 MiB fp32 chunk in fp16, enough for children whose
  // windows take frames as they come, little beside a large model.
  static constexpr size_t kHotBytes = size_t{2} << 20;

  FrameStore() = default;
  // Spills when on(); frames go to an unnamed file in `dir` (the temporary
  // directory when empty). `log_name` tags its log line, `what` names the
  // frames in it ("anchor").
  FrameStore(bool on, std::filesystem::path dir, std::string log_name, std::string what = "anchor");

  bool on() const { return on_; }
  // Keeps `frame`: on disk when spilling (and the write succeeds), in
  // memory otherwise.
  StoredFrame keep(Frame frame);
  // The same for bytes the caller goes on using (a frame it sends next):
  // copied only when they stay in memory.
  StoredFrame keep(const std::vector<uint8_t>& frame);
  // The next frames go to a new file (a store that failed tries again);
  // the old one stays until no StoredFrame refers to it.
  void rotate() {
    files_.retire(std::move(file_));
    file_.reset();
    failed_ = false;
    hot_.clear();
    hot_bytes_ = 0;
  }
  // The same, spilling from now on when `on` (the model's size is known).
  void rotate(bool on) {
    on_ = on;
    rotate();
  }

 private:
  // On disk when spilling and the write succeeds; empty otherwise. `hot`
  // (the frame itself when the caller shares it) stays young in memory.
  StoredFrame append(const std::vector<uint8_t>& frame, const Frame& hot);

  bool on_ = false;
  bool failed_ = false;  // the file could not be made or written: memory this round
  bool warned_ = false;  // logged once
  std::filesystem::path dir_;
  std::string log_name_;
  std::string what_;
  std::shared_ptr<SpillFile> file_;
  SpillFiles files_;       // the last round's file, used again once it is free
  std::deque<Frame> hot_;  // the newest stored frames, within kHotBytes
  size_t hot_bytes_ = 0;
};

}  // namespace fedwan::node

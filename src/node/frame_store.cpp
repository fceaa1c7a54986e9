#include "node/frame_store.hpp"

#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "common/byte_pool.hpp"
#include "common/errno_text.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"

namespace fedwan::node {

Frame StoredFrame::load() const {
  if (frame_ || !file_) return frame_;
  if (Frame hot = hot_.lock()) return hot;
  auto bytes = BytePool::shared().take_shared(size_);  // every byte read into
  file_->read(offset_, bytes->data(), size_);
  return bytes;
}

const uint8_t* StoredFrame::bytes(std::vector<uint8_t>& scratch) const {
  if (frame_) return frame_->data();
  if (!file_) return nullptr;
  if (Frame hot = hot_.lock()) {
    // Young: the store holds it until at least the next keep(); the copy
    // is of one frame, and keeps the bytes valid whatever the store does.
    scratch.assign(hot->begin(), hot->end());
    return scratch.data();
  }
  if (scratch.size() < size_) scratch.resize(size_);
  file_->read(offset_, scratch.data(), size_);
  return scratch.data();
}

size_t StoredFrame::size() const { return frame_ ? frame_->size() : size_; }

FrameStore::FrameStore(bool on, std::filesystem::path dir, std::string log_name, std::string what)
    : on_(on), dir_(std::move(dir)), log_name_(std::move(log_name)), what_(std::move(what)) {}

StoredFrame FrameStore::keep(Frame frame) {
  StoredFrame on_disk = append(*frame, frame);
  return on_disk ? on_disk : StoredFrame(std::move(frame));
}

StoredFrame FrameStore::keep(const std::vector<uint8_t>& frame) {
  StoredFrame on_disk = append(frame, nullptr);
  return on_disk ? on_disk : StoredFrame(std::make_shared<const std::vector<uint8_t>>(frame));
}

StoredFrame FrameStore::append(const std::vector<uint8_t>& frame, const Frame& hot) {
  if (!on_ || failed_) return {};
  std::string why;
  if (!file_) file_ = files_.next(dir_, &why);
  uint64_t offset = 0;
  if (file_ && file_->append(frame.data(), frame.size(), &offset)) {
    if (hot) {
      hot_.push_back(hot);
      hot_bytes_ += hot->size();
      while (hot_bytes_ > kHotBytes && hot_.size() > 1) {
        hot_bytes_ -= hot_.front()->size();
        hot_.pop_front();
      }
    }
    return StoredFrame(file_, offset, static_cast<uint32_t>(frame.size()), hot);
  }
  if (file_) why = errno_text(errno);
  failed_ = true;
  file_.reset();
  if (!warned_) {
    log().warn("[{}] cannot keep the {} frames on disk ({}); they stay in memory this round",
               log_name_, what_, why);
  }
  warned_ = true;
  return {};
}

}  // namespace fedwan::node

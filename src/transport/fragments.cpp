#include "transport/fragments.hpp"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

namespace fedwan::transport {

namespace {

constexpr uint8_t kMagic[4] = {'F', 'W', 'F', 'G'};
constexpr uint8_t kVersion = 1;

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

bool is_fragment(const uint8_t* data, size_t size) {
  return size >= 4 && std::memcmp(data, kMagic, 4) == 0;
}

uint64_t fragment_id_base() {
  std::random_device rd;
  return uint64_t{rd()} << 32;
}

Fragmenter::Fragmenter(std::vector<uint8_t> sealed, uint64_t frame_id, size_t piece)
    : sealed_(std::move(sealed)), id_(frame_id), piece_(std::max(piece, kMinFragmentBytes)) {}

std::vector<uint8_t> Fragmenter::next() const {
  const size_t n = std::min(piece_, sealed_.size() - next_);
  std::vector<uint8_t> out(kFragmentHeaderBytes + n);
  uint8_t* h = out.data();
  std::memcpy(h, kMagic, 4);
  h[4] = kVersion;
  put_u64(h + 8, id_);
  put_u32(h + 16, static_cast<uint32_t>(sealed_.size()));
  put_u32(h + 20, static_cast<uint32_t>(piece_));
  put_u32(h + 24, static_cast<uint32_t>(next_));
  std::memcpy(h + kFragmentHeaderBytes, sealed_.data() + next_, n);
  return out;
}

size_t Fragmenter::next_size() const {
  return kFragmentHeaderBytes + std::min(piece_, sealed_.size() - next_);
}

void Fragmenter::advance() { next_ = std::min(sealed_.size(), next_ + piece_); }

void Reassembler::expire(Clock::time_point now) {
  for (auto it = partial_.begin(); it != partial_.end();) {
    if (now - it->second.since > options_.max_wait) {
      bytes_ -= it->second.bytes.size();
      stats_.dropped += 1;
      it = partial_.erase(it);
    } else {
      ++it;
    }
  }
}

void Reassembler::evict_oldest() {
  auto oldest = partial_.begin();
  for (auto it = partial_.begin(); it != partial_.end(); ++it) {
    if (it->second.since < oldest->second.since) oldest = it;
  }
  bytes_ -= oldest->second.bytes.size();
  stats_.dropped += 1;
  partial_.erase(oldest);
}

Reassembler::Result Reassembler::add(const uint8_t* data, size_t size, Clock::time_point now,
                                     std::vector<uint8_t>* frame, std::string* why) {
  const auto refuse = [&](const std::string& reason) {
    stats_.refused += 1;
    *why = "fragment refused: " + reason;
    return Result::kRefused;
  };
  if (size < kFragmentHeaderBytes || !is_fragment(data, size)) return refuse("too short");
  if (data[4] != kVersion || data[5] != 0 || data[6] != 0 || data[7] != 0) {
    return refuse("unknown version " + std::to_string(data[4]));
  }
  const uint64_t id = get_u64(data + 8);
  const uint32_t total = get_u32(data + 16);
  const uint32_t piece = get_u32(data + 20);
  const uint32_t offset = get_u32(data + 24);
  const size_t n = size - kFragmentHeaderBytes;
  if (total == 0 || total > options_.max_frame_bytes) {
    return refuse("frame size " + std::to_string(total) + " out of bounds");
  }
  if (piece < kMinFragmentBytes || piece >= total || offset % piece != 0 || offset >= total ||
      n != std::min<size_t>(piece, total - offset)) {
    return refuse("piece of " + std::to_string(n) + " bytes at " + std::to_string(offset) +
                  " does not fit a frame of " + std::to_string(total) + " in pieces of " +
                  std::to_string(piece));
  }
  stats_.pieces += 1;
  expire(now);
  auto it = partial_.find(id);
  if (it == partial_.end()) {
    while (!partial_.empty() &&
           (partial_.size() >= options_.max_frames || bytes_ + total > options_.max_bytes)) {
      evict_oldest();
    }
    Partial p;
    p.bytes.resize(total);
    p.piece = piece;
    p.missing = (total + piece - 1) / piece;
    p.got.assign(p.missing, false);
    p.since = now;
    bytes_ += total;
    it = partial_.emplace(id, std::move(p)).first;
  }
  Partial& p = it->second;
  if (p.bytes.size() != total || p.piece != piece) {
    return refuse("piece names a frame of another size");
  }
  const size_t k = offset / piece;
  if (p.got[k]) return refuse("piece at " + std::to_string(offset) + " came twice");
  p.got[k] = true;
  std::memcpy(p.bytes.data() + offset, data + kFragmentHeaderBytes, n);
  if (--p.missing > 0) return Result::kPending;
  *frame = std::move(p.bytes);
  bytes_ -= total;
  partial_.erase(it);
  stats_.frames += 1;
  return Result::kFrame;
}

}  // namespace fedwan::transport

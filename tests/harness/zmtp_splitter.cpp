#include "harness/zmtp_splitter.hpp"

#include <algorithm>
#include <utility>

#include "harness/zmtp.hpp"

namespace fedwan::testing {

void ZmtpSplitter::feed(const uint8_t* p, size_t n, std::vector<Piece>& out) {
  if (state_ == State::kRaw) {
    if (n > 0) out.push_back({Kind::kRaw, std::vector<uint8_t>(p, p + n)});
    return;
  }
  if (state_ == State::kGreeting) {
    size_t ok = 0;  // bytes of [p, p + n) that belong to a plausible greeting
    while (ok < n && greeting_seen_ < zmtp::kGreetingBytes) {
      if (!zmtp::greeting_byte_plausible(greeting_seen_, p[ok])) break;
      ++ok;
      ++greeting_seen_;
    }
    if (ok > 0) out.push_back({Kind::kGreeting, std::vector<uint8_t>(p, p + ok)});
    p += ok;
    n -= ok;
    if (greeting_seen_ < zmtp::kGreetingBytes) {
      if (n > 0) {  // an implausible byte: not ZMTP 3.x
        state_ = State::kRaw;
        feed(p, n, out);
      }
      return;
    }
    state_ = State::kFrames;
  }
  in_.insert(in_.end(), p, p + n);
  parse(out);
}

void ZmtpSplitter::go_raw(std::vector<Piece>& out) {
  std::vector<uint8_t> rest = std::move(message_);
  rest.insert(rest.end(), in_.begin() + static_cast<std::ptrdiff_t>(pos_), in_.end());
  message_.clear();
  in_.clear();
  pos_ = 0;
  state_ = State::kRaw;
  if (!rest.empty()) out.push_back({Kind::kRaw, std::move(rest)});
}

void ZmtpSplitter::parse(std::vector<Piece>& out) {
  for (;;) {
    const size_t avail = in_.size() - pos_;
    const uint8_t* f = in_.data() + pos_;
    zmtp::FrameHeader h;
    const zmtp::HeaderParse parsed = zmtp::parse_frame_header(f, avail, &h);
    if (parsed == zmtp::HeaderParse::kNeedMore) break;
    if (parsed == zmtp::HeaderParse::kInvalid) return go_raw(out);
    // A frame or message over the limit cannot be held whole: stop parsing.
    const size_t used = h.command() ? 0 : message_.size();
    if (h.body_bytes > max_message_ ||
        h.header_bytes + h.body_bytes > max_message_ - std::min(max_message_, used)) {
      return go_raw(out);
    }
    if (avail < h.header_bytes + h.body_bytes) break;
    const size_t frame = h.header_bytes + static_cast<size_t>(h.body_bytes);
    if (h.command()) {
      // A command may arrive between the frames of a message: it passes at once.
      out.push_back({Kind::kCommand, std::vector<uint8_t>(f, f + frame)});
    } else {
      message_.insert(message_.end(), f, f + frame);
      if (!h.more()) {
        out.push_back({Kind::kMessage, std::move(message_)});
        message_.clear();
      }
    }
    pos_ += frame;
  }
  if (pos_ == in_.size()) {
    in_.clear();
    pos_ = 0;
  } else if (pos_ > in_.size() / 2) {
    in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
}

}  // namespace fedwan::testing

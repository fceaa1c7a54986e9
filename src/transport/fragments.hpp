// Fragments: a sealed frame cut into pieces that go out over whichever of a
// striped link's connections has room as each piece goes, and put back
// together by the receiver before it opens the frame (docs/protocol.md,
// "Fragments"). A frame handed whole to one connection waits for that
// connection alone: on a lossy link one whose window a loss just halved
// holds the whole update's end for seconds while the others idle. Pieces of
// 32 KiB spread a frame over the connections that are moving, in proportion
// to how fast each drains (its kernel queue kept short: TCP_NOTSENT_LOWAT on
// long connections, congestion_monitor.hpp).
//
// A fragment is a message of its own: a 28-byte header, then its bytes of
// the sealed frame.
//
//   0 u32 magic 'FWFG'   4 u8 version (1)   5..7 zero
//   8 u64 frame id (the sender's: a random link prefix, then a counter)
//   16 u32 the sealed frame's size   20 u32 piece size   24 u32 offset
//
// Every piece but the last has `piece size` bytes; offset is a multiple of
// it. The header is not authenticated (the frame it rebuilds is): a forged
// or altered piece makes a frame that does not open, which the link treats
// as it treats any frame that does not open.
//
// Not thread safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fedwan::transport {

inline constexpr size_t kFragmentHeaderBytes = 28;
// The piece size a sender uses, and the least a receiver takes.
inline constexpr size_t kFragmentBytes = 32 << 10;
inline constexpr size_t kMinFragmentBytes = 4 << 10;

// Whether `data` is a fragment (its magic; the rest is checked on adding).
bool is_fragment(const uint8_t* data, size_t size);

// Cuts one sealed frame into pieces, on demand.
class Fragmenter {
 public:
  Fragmenter(std::vector<uint8_t> sealed, uint64_t frame_id, size_t piece = kFragmentBytes);
  bool done() const { return next_ >= sealed_.size(); }
  size_t size() const { return sealed_.size(); }
  // The next piece's message (header and bytes); advance() once it went.
  std::vector<uint8_t> next() const;
  size_t next_size() const;
  void advance();

 private:
  std::vector<uint8_t> sealed_;
  uint64_t id_;
  size_t piece_;
  size_t next_ = 0;
};

class Reassembler {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    size_t max_frames = 64;                     // frames being put together at once
    size_t max_bytes = 64 << 20;                // their sizes together
    size_t max_frame_bytes = 4 << 20;           // one frame's, at most
    std::chrono::milliseconds max_wait{30000};  // for a frame's missing pieces
  };
  struct Stats {
    uint64_t pieces = 0, frames = 0;
    uint64_t refused = 0;  // malformed, inconsistent or repeated pieces
    uint64_t dropped = 0;  // frames given up (bounds, or waited too long)
  };
  enum class Result { kPending, kFrame, kRefused };

  explicit Reassembler(Options options) : options_(options) {}
  // Takes one fragment message: kFrame with the whole sealed frame in
  // *frame once its last piece came; kRefused (with why) for a piece that
  // is not one, does not fit the frame it names, or came before.
  Result add(const uint8_t* data, size_t size, Clock::time_point now, std::vector<uint8_t>* frame,
             std::string* why);
  size_t holding() const { return partial_.size(); }
  size_t bytes() const { return bytes_; }
  const Stats& stats() const { return stats_; }

 private:
  struct Partial {
    std::vector<uint8_t> bytes;
    std::vector<bool> got;
    size_t missing = 0;
    uint32_t piece = 0;
    Clock::time_point since{};
  };
  void expire(Clock::time_point now);
  void evict_oldest();

  Options options_;
  std::map<uint64_t, Partial> partial_;
  size_t bytes_ = 0;
  Stats stats_;
};

// The largest frame a receiver puts together for a socket whose messages
// may be `max_message_bytes` long (0 or less: no cap but the header's).
inline size_t fragment_frame_limit(int64_t max_message_bytes) {
  return max_message_bytes > 0 ? static_cast<size_t>(max_message_bytes) : size_t{UINT32_MAX};
}

// A frame id prefix for one link direction: random, so that pieces of an
// earlier link of the same peer never complete a frame of this one.
uint64_t fragment_id_base();

}  // namespace fedwan::transport

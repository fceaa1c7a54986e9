// Protection of one direction of a link once the TLS handshake has agreed
// keys: FrameSealer on the sending side, FrameOpener on the receiving side.
//
// Sealed frame (the wire frame with its payload encrypted):
//   [0, 64)          frame header, flags |= kFlagSealed       (authenticated)
//   [64, 64+P)       payload ciphertext, P = header.payload_length
//   [64+P, +4)       key epoch, u32 LE                        (authenticated)
//   [+4, +12)        sequence number, u64 LE                  (authenticated)
//   [+12, +28)       AEAD tag
// AAD = header || epoch || seq. nonce = iv(epoch) XOR seq (see aead.hpp).
// Sequence numbers count every frame of the direction from 0 and never
// repeat; epochs count key updates from the session's first epoch (drawn
// from the session's keys: tls_session.hpp, LinkKeys::first_epoch), modulo
// 2^32. An opener refuses, before any cryptography, a frame whose epoch is
// neither one it has reached nor one of the next kMaxEpochJump: a frame
// sealed in another session of the link (the peer restarted, or the two
// agreed keys again, while it was on its way) or an epoch forged. A sealer moves to the next epoch
// (security::ratchet, old key wiped) before its RekeyPolicy would be
// exceeded; an opener follows forward (at most kMaxEpochJump at once) and
// only commits the new key once a frame has authenticated under it. It keeps
// the keys of the epochs it moved past (at most kMaxEpochJump) only while a
// frame sealed under them could still be fresh, within the replay window
// (ReplayWindow::kSize numbers), then wipes them: frames striped over several
// connections overtake one another across key updates.
//
// Thread safety: none; one owner per object. Keys are wiped on destruction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "security/aead.hpp"
#include "security/replay_window.hpp"
#include "wire/frame_order.hpp"

namespace fedwan::security {

inline constexpr uint8_t kFlagSealed = 0x80;                  // header flags bit of a sealed frame
inline constexpr size_t kSealTrailer = 4 + 8 + kAeadTagSize;  // epoch, seq, tag
inline constexpr uint32_t kMaxEpochJump = 16;

// A sealer rekeys before a frame would take its key past max_bytes or
// max_frames, and before sealing under a key older than max_age. A frame
// larger than max_bytes goes out alone under its key; max_frames 0 means a
// fresh key for every frame.
struct RekeyPolicy {
  uint64_t max_bytes = uint64_t{1} << 36;   // payload bytes under one key
  uint64_t max_frames = uint64_t{1} << 32;  // frames under one key
  std::chrono::steady_clock::duration max_age = std::chrono::hours(1);
};

class FrameSealer {
 public:
  FrameSealer(AeadAlgorithm algorithm, const AeadKey& key, const AeadNonce& iv,
              RekeyPolicy policy = {}, uint32_t first_epoch = 0);
  ~FrameSealer();
  FrameSealer(const FrameSealer&) = delete;
  FrameSealer& operator=(const FrameSealer&) = delete;

  // Seals an encoded wire frame (64-byte header + payload whose length the
  // header states) in place; the vector grows by kSealTrailer. Throws
  // ProtocolError when the bytes are not a frame (too short, length field
  // disagrees, already sealed), CryptoError on an OpenSSL failure (the
  // frame's bytes are then unspecified). Reserve kSealTrailer bytes of spare
  // capacity to keep the growth from copying the frame. Fills the header's
  // `order` field (wire/frame_order.hpp) from the frames sealed before.
  void seal(std::vector<uint8_t>& frame);
  // The same, leaving `frame` as it is: the sealed frame is new bytes, the
  // payload encrypted across into them (no copy besides the header's).
  std::vector<uint8_t> sealed(const uint8_t* frame, size_t size);
  std::vector<uint8_t> sealed(const std::vector<uint8_t>& frame) {
    return sealed(frame.data(), frame.size());
  }

  uint32_t epoch() const { return epoch_; }
  uint64_t next_seq() const { return seq_; }

 private:
  void advance_epoch();
  // The payload length of a frame that may be sealed; throws otherwise.
  uint32_t check(const uint8_t* frame, size_t size) const;
  // Seals the frame whose header is at `d` (room for its payload and the
  // trailer after it), its payload read from `payload_in` (`d`'s own or
  // another's).
  void seal_to(const uint8_t* payload_in, uint32_t payload, uint8_t* d);

  AeadCipher cipher_;
  AeadKey key_;
  AeadNonce iv_;
  RekeyPolicy policy_;
  uint32_t epoch_ = 0;
  uint32_t epochs_left_ = UINT32_MAX;  // key updates this session may still make
  uint64_t seq_ = 0;
  uint64_t epoch_bytes_ = 0, epoch_frames_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
  wire::OrderCounter order_;
};

// A received frame checked by its FrameOpener (detach()) and opened by
// run() on any thread, with a cipher of that thread's own: the decryption,
// which is most of opening a frame, leaves the opener's thread while that
// thread goes on with the frames before it. Holds a copy of the frame's key
// (wiped when it goes). The opener records the frame only when finish() is
// given it back, on the opener's thread.
class DetachedOpen {
 public:
  DetachedOpen(const DetachedOpen&) = delete;
  DetachedOpen& operator=(const DetachedOpen&) = delete;
  ~DetachedOpen();
  // Decrypts and authenticates the frame at `data` (the bytes detach() was
  // given, at the same address or a copy) in place; true when its tag
  // verified. `cipher` is the calling thread's own: made here when null or
  // of another algorithm, rekeyed to this frame's key otherwise. A frame
  // that verified is then the plain frame finish() will hand on,
  // data[0, opened_size()) (its sealed flag cleared), so that what is
  // worked out from it may be worked out on the same thread; finish() may
  // still refuse it (a replay, a key moved on). Throws CryptoError only on
  // a failure of the library.
  bool run(uint8_t* data, std::unique_ptr<AeadCipher>* cipher) const;
  uint64_t seq() const { return seq_; }
  uint32_t payload() const { return payload_; }
  size_t opened_size() const;

 private:
  friend class FrameOpener;
  DetachedOpen() = default;
  AeadAlgorithm algorithm_ = AeadAlgorithm::kAes256Gcm;
  AeadKey key_{};
  AeadNonce iv_{};
  uint32_t epoch_ = 0;
  uint64_t seq_ = 0;
  uint32_t payload_ = 0;
};

class FrameOpener {
 public:
  enum class Result {
    kOk,
    kNotSealed,   // no kFlagSealed: a plaintext frame on a secure link
    kTruncated,   // shorter than header + trailer, or length field disagrees
    kReplay,      // sequence number already seen
    kTooOld,      // sequence number below the replay window
    kStaleEpoch,  // key epoch older than the current one (its key is gone)
    // Its epoch is none this session reached nor one of the next
    // kMaxEpochJump: sealed in another session of the link, or forged.
    kOtherSession,
    kBadTag,  // authentication failed: tampered with
  };
  static const char* result_name(Result r);

  FrameOpener(AeadAlgorithm algorithm, const AeadKey& key, const AeadNonce& iv,
              uint32_t first_epoch = 0);
  ~FrameOpener();
  FrameOpener(const FrameOpener&) = delete;
  FrameOpener& operator=(const FrameOpener&) = delete;

  // Verifies and decrypts a sealed frame in place. On kOk, data[0, *frame_size)
  // is the plain wire frame (kFlagSealed cleared) and the sequence number is
  // recorded; on anything else nothing changes (no key advance, no replay
  // record) and the bytes must be dropped: after kBadTag the payload bytes
  // are garbage, because decryption runs in place before the tag is known.
  // Refusals that need no cryptography (everything but kBadTag) come first
  // and leave the bytes untouched. Throws CryptoError only on an OpenSSL
  // failure.
  [[nodiscard]] Result open(uint8_t* data, size_t size, size_t* frame_size);

  // The same in two steps, for opening on another thread: detach() takes
  // the refusals that need no cryptography and, for a frame of the current
  // epoch whose sequence number is fresh, returns what opening it needs
  // (null for every other frame: open() it instead, in its turn). finish()
  // then records it as open() would have: kOk when `authenticated` (its
  // run() returned true) and its number is still fresh now that the frames
  // detached before it are recorded (two copies of one frame in flight: the
  // second is a replay); nothing changes otherwise. Frames are finished in
  // the order they were detached, and nothing is opened between a
  // detach() and its finish() but other detached frames.
  [[nodiscard]] std::unique_ptr<DetachedOpen> detach(const uint8_t* data, size_t size) const;
  [[nodiscard]] Result finish(const DetachedOpen& frame, bool authenticated, uint8_t* data,
                              size_t* frame_size);

  uint32_t epoch() const { return epoch_; }
  // The sequence number of the frame the last kOk opened.
  uint64_t last_seq() const { return last_seq_; }
  // Earlier epochs whose keys are still kept (see the class comment).
  size_t earlier_keys() const { return earlier_.size(); }

 private:
  // The key of an epoch the opener has moved past, for frames sealed under it
  // that arrive after the first frame under a later key: it opens only
  // numbers below that frame's (`until`).
  struct Earlier {
    uint32_t epoch;
    AeadKey key;
    AeadNonce iv;
    uint64_t until;
  };

  // The frame's payload opened in place under an earlier epoch's kept key;
  // the current key is back in the cipher afterwards, also when it throws.
  bool open_earlier(const Earlier& earlier, uint64_t seq, const uint8_t* aad, uint8_t* body,
                    uint32_t payload, const uint8_t* tag);
  // The frame's payload opened in place under the key of a later `epoch`,
  // ratcheted on copies: the opener moves to that epoch (keeping the keys it
  // passes) only when the frame authenticates under it.
  bool open_ahead(uint32_t epoch, uint64_t seq, const uint8_t* aad, uint8_t* body, uint32_t payload,
                  const uint8_t* tag);

  // Epochs counted from the session's first.
  uint32_t offset(uint32_t epoch) const { return epoch - first_epoch_; }

  AeadCipher cipher_;
  AeadKey key_;
  AeadNonce iv_;
  uint32_t first_epoch_ = 0;
  uint32_t epoch_ = 0;
  ReplayWindow window_;
  uint64_t last_seq_ = 0;
  std::deque<Earlier> earlier_;  // oldest first, at most kMaxEpochJump
};

}  // namespace fedwan::security

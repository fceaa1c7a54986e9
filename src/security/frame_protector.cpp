#include "security/frame_protector.hpp"

#include <openssl/crypto.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/byte_pool.hpp"
#include "fedwan/error.hpp"
#include "wire/frame.hpp"
#include "wire/frame_order.hpp"

namespace fedwan::security {
namespace {

constexpr size_t kHeader = wire::kHeaderSize;
constexpr size_t kOffFlags = 7;
constexpr size_t kOffPayloadLength = 56;
constexpr size_t kAadSize = kHeader + 4 + 8;  // header || epoch || seq
static_assert(kSealTrailer == 4 + 8 + kAeadTagSize, "trailer = epoch, seq, tag");

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t load_u64(const uint8_t* p) { return load_u32(p) | uint64_t(load_u32(p + 4)) << 32; }
void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void store_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// The associated data is not contiguous in the frame (the payload sits
// between the header and the epoch/seq fields), so it is gathered here.
void gather_aad(const uint8_t* header, const uint8_t* epoch_seq, uint8_t aad[kAadSize]) {
  std::memcpy(aad, header, kHeader);
  std::memcpy(aad + kHeader, epoch_seq, 12);
}

template <typename T>
void wipe(T& secret) {
  OPENSSL_cleanse(secret.data(), secret.size());
}

}  // namespace

FrameSealer::FrameSealer(AeadAlgorithm algorithm, const AeadKey& key, const AeadNonce& iv,
                         RekeyPolicy policy, uint32_t first_epoch)
    : cipher_(algorithm, key),
      key_(key),
      iv_(iv),
      policy_(policy),
      epoch_(first_epoch),
      epoch_start_(std::chrono::steady_clock::now()) {}

FrameSealer::~FrameSealer() {
  wipe(key_);
  wipe(iv_);
}

void FrameSealer::advance_epoch() {
  if (epochs_left_ == 0) {
    throw CryptoError("FrameSealer: all 2^32 key epochs of this link are used up; "
                      "reconnect to agree fresh keys");
  }
  AeadKey key = key_;
  AeadNonce iv = iv_;
  try {
    ratchet(&key, &iv);
    cipher_.rekey(key);
  } catch (...) {
    wipe(key);
    wipe(iv);
    throw;
  }
  wipe(key_);
  key_ = key;
  iv_ = iv;
  wipe(key);
  wipe(iv);
  ++epoch_;  // modulo 2^32, from the session's first
  --epochs_left_;
  epoch_bytes_ = 0;
  epoch_frames_ = 0;
  epoch_start_ = std::chrono::steady_clock::now();
}

uint32_t FrameSealer::check(const uint8_t* frame, size_t size) const {
  if (size < kHeader) {
    throw ProtocolError("FrameSealer::seal: " + std::to_string(size) +
                        " bytes cannot be a wire frame (the header alone is 64)");
  }
  const uint32_t payload = load_u32(frame + kOffPayloadLength);
  if (size_t(payload) != size - kHeader) {
    throw ProtocolError("FrameSealer::seal: the header states a " + std::to_string(payload) +
                        "-byte payload but " + std::to_string(size - kHeader) +
                        " bytes follow it; seal exactly one encoded frame");
  }
  if (frame[kOffFlags] & kFlagSealed) {
    throw ProtocolError("FrameSealer::seal: the frame is already sealed (flag 0x80 set)");
  }
  if (seq_ == std::numeric_limits<uint64_t>::max()) {
    throw CryptoError("FrameSealer: sequence numbers of this link are used up; reconnect");
  }
  return payload;
}

void FrameSealer::seal_to(const uint8_t* payload_in, uint32_t payload, uint8_t* d) {
  // Rekey before this frame would take the key past a limit. The byte limit
  // only counts once the key has sealed something: a frame larger than
  // max_bytes goes out alone under its key, since a fresh key would be no
  // emptier.
  const bool frames_full = epoch_frames_ >= policy_.max_frames;
  const bool bytes_full = epoch_frames_ > 0 && (epoch_bytes_ > policy_.max_bytes ||
                                                payload > policy_.max_bytes - epoch_bytes_);
  const bool too_old = std::chrono::steady_clock::now() - epoch_start_ > policy_.max_age;
  if (frames_full || bytes_full || too_old) advance_epoch();

  // Its place in the order of a striped link, counted in sealing order.
  const wire::OrderTag tag = order_.next(wire::order_class(d[5], d[kOffFlags]));
  store_u32(d + wire::kOrderOffset, wire::pack_order(tag));
  d[kOffFlags] |= kFlagSealed;
  uint8_t* trailer = d + kHeader + payload;
  store_u32(trailer, epoch_);
  store_u64(trailer + 4, seq_);
  uint8_t aad[kAadSize];
  gather_aad(d, trailer, aad);
  cipher_.seal(nonce_for(iv_, seq_), aad, kAadSize, payload_in, payload, d + kHeader, trailer + 12);
  ++seq_;
  ++epoch_frames_;
  epoch_bytes_ += payload;
}

void FrameSealer::seal(std::vector<uint8_t>& frame) {
  const uint32_t payload = check(frame.data(), frame.size());
  frame.resize(kHeader + payload + kSealTrailer);  // no copy when the caller reserved room
  seal_to(frame.data() + kHeader, payload, frame.data());
}

std::vector<uint8_t> FrameSealer::sealed(const uint8_t* frame, size_t size) {
  const uint32_t payload = check(frame, size);
  // The cipher writes the payload across: the only pass over it.
  // A buffer used before: every byte of it is written below.
  std::vector<uint8_t> out = BytePool::shared().take(kHeader + size_t{payload} + kSealTrailer);
  std::memcpy(out.data(), frame, kHeader);
  seal_to(frame + kHeader, payload, out.data());
  return out;
}

const char* FrameOpener::result_name(Result r) {
  switch (r) {
    case Result::kOk: return "ok";
    case Result::kNotSealed: return "not sealed";
    case Result::kTruncated: return "truncated";
    case Result::kReplay: return "replay";
    case Result::kTooOld: return "too old";
    case Result::kStaleEpoch: return "stale epoch";
    case Result::kOtherSession: return "sealed in another session of the link";
    case Result::kBadTag: return "bad tag";
  }
  return "unknown";
}

FrameOpener::FrameOpener(AeadAlgorithm algorithm, const AeadKey& key, const AeadNonce& iv,
                         uint32_t first_epoch)
    : cipher_(algorithm, key), key_(key), iv_(iv), first_epoch_(first_epoch), epoch_(first_epoch) {}

FrameOpener::~FrameOpener() {
  wipe(key_);
  wipe(iv_);
  for (Earlier& e : earlier_) {
    wipe(e.key);
    wipe(e.iv);
  }
}

FrameOpener::Result FrameOpener::open(uint8_t* data, size_t size, size_t* frame_size) {
  if (size < kHeader + kSealTrailer) return Result::kTruncated;
  if (!(data[kOffFlags] & kFlagSealed)) return Result::kNotSealed;
  const uint32_t payload = load_u32(data + kOffPayloadLength);
  if (size_t(payload) != size - kHeader - kSealTrailer) return Result::kTruncated;

  uint8_t* trailer = data + kHeader + payload;
  const uint32_t epoch = load_u32(trailer);
  const uint64_t seq = load_u64(trailer + 4);
  // Cheap refusals first, before any cryptography: a replayed or stale frame
  // costs an attacker nothing to send, so it must cost us nothing to drop.
  // Its epoch first, since a frame of another session numbers its own:
  // neither an epoch this session reached nor one it may reach next, no key
  // of this session could open it.
  if (uint64_t{offset(epoch)} > uint64_t{offset(epoch_)} + kMaxEpochJump) {
    return Result::kOtherSession;
  }
  switch (window_.check(seq)) {
    case ReplayWindow::Verdict::kReplay: return Result::kReplay;
    case ReplayWindow::Verdict::kTooOld: return Result::kTooOld;
    case ReplayWindow::Verdict::kFresh: break;
  }
  // An earlier epoch's key is gone once no frame of it can still be fresh:
  // every number it sealed lies below the window.
  while (!earlier_.empty() && window_.highest() >= earlier_.front().until + ReplayWindow::kSize) {
    wipe(earlier_.front().key);
    wipe(earlier_.front().iv);
    earlier_.pop_front();
  }
  const Earlier* earlier = nullptr;
  if (offset(epoch) < offset(epoch_)) {
    // Sealed before a key update yet overtaken on the way (frames striped
    // over several connections): only numbers below the first frame seen
    // under a later key can be genuine.
    for (const Earlier& e : earlier_) {
      if (e.epoch == epoch && seq < e.until) earlier = &e;
    }
    if (earlier == nullptr) return Result::kStaleEpoch;
  }

  uint8_t aad[kAadSize];
  gather_aad(data, trailer, aad);
  const uint8_t* tag = trailer + 12;
  uint8_t* body = data + kHeader;

  bool ok = false;
  if (earlier != nullptr) {
    ok = open_earlier(*earlier, seq, aad, body, payload, tag);
  } else if (epoch == epoch_) {
    ok = cipher_.open(nonce_for(iv_, seq), aad, kAadSize, body, payload, body, tag);
  } else {
    ok = open_ahead(epoch, seq, aad, body, payload, tag);
  }
  if (!ok) return Result::kBadTag;

  data[kOffFlags] &= static_cast<uint8_t>(~kFlagSealed);
  window_.accept(seq);
  last_seq_ = seq;
  *frame_size = kHeader + payload;
  return Result::kOk;
}

DetachedOpen::~DetachedOpen() {
  wipe(key_);
  wipe(iv_);
}

bool DetachedOpen::run(uint8_t* data, std::unique_ptr<AeadCipher>* cipher) const {
  if (!*cipher || (*cipher)->algorithm() != algorithm_) {
    *cipher = std::make_unique<AeadCipher>(algorithm_, key_);
  } else {
    (*cipher)->rekey(key_);
  }
  uint8_t* trailer = data + kHeader + payload_;
  uint8_t aad[kAadSize];
  gather_aad(data, trailer, aad);
  uint8_t* body = data + kHeader;
  if (!(*cipher)->open(nonce_for(iv_, seq_), aad, kAadSize, body, payload_, body, trailer + 12)) {
    return false;
  }
  data[kOffFlags] &= static_cast<uint8_t>(~kFlagSealed);
  return true;
}

size_t DetachedOpen::opened_size() const { return kHeader + payload_; }

std::unique_ptr<DetachedOpen> FrameOpener::detach(const uint8_t* data, size_t size) const {
  if (size < kHeader + kSealTrailer || !(data[kOffFlags] & kFlagSealed)) return nullptr;
  const uint32_t payload = load_u32(data + kOffPayloadLength);
  if (size_t(payload) != size - kHeader - kSealTrailer) return nullptr;
  const uint8_t* trailer = data + kHeader + payload;
  const uint32_t epoch = load_u32(trailer);
  const uint64_t seq = load_u64(trailer + 4);
  // Anything but a fresh number under the current key is open()'s: its
  // refusals, earlier keys and key updates.
  if (epoch != epoch_ || window_.check(seq) != ReplayWindow::Verdict::kFresh) return nullptr;
  std::unique_ptr<DetachedOpen> d(new DetachedOpen());
  d->algorithm_ = cipher_.algorithm();
  d->key_ = key_;
  d->iv_ = iv_;
  d->epoch_ = epoch;
  d->seq_ = seq;
  d->payload_ = payload;
  return d;
}

FrameOpener::Result FrameOpener::finish(const DetachedOpen& frame, bool authenticated,
                                        uint8_t* data, size_t* frame_size) {
  // Only other detached frames were finished since: the epoch cannot have
  // moved, but a frame that finds it moved is refused, never opened under
  // a key it was not checked against.
  if (frame.epoch_ != epoch_) return Result::kStaleEpoch;
  switch (window_.check(frame.seq_)) {
    case ReplayWindow::Verdict::kReplay: return Result::kReplay;
    case ReplayWindow::Verdict::kTooOld: return Result::kTooOld;
    case ReplayWindow::Verdict::kFresh: break;
  }
  if (!authenticated) return Result::kBadTag;
  data[kOffFlags] &= static_cast<uint8_t>(~kFlagSealed);
  window_.accept(frame.seq_);
  last_seq_ = frame.seq_;
  *frame_size = kHeader + frame.payload_;
  return Result::kOk;
}

bool FrameOpener::open_earlier(const Earlier& earlier, uint64_t seq, const uint8_t* aad,
                               uint8_t* body, uint32_t payload, const uint8_t* tag) {
  cipher_.rekey(earlier.key);
  bool ok = false;
  try {
    ok = cipher_.open(nonce_for(earlier.iv, seq), aad, kAadSize, body, payload, body, tag);
  } catch (...) {
    cipher_.rekey(key_);
    throw;
  }
  cipher_.rekey(key_);
  return ok;
}

bool FrameOpener::open_ahead(uint32_t epoch, uint64_t seq, const uint8_t* aad, uint8_t* body,
                             uint32_t payload, const uint8_t* tag) {
  // The sender moved on (possibly several times while frames were lost).
  // Follow on copies; the old key stays current until a frame proves the
  // new one, so a forged epoch field cannot move this opener anywhere.
  AeadKey key = key_;
  AeadNonce iv = iv_;
  std::vector<Earlier> passed;  // the keys of epoch_ .. epoch - 1
  // Room for all of them first: a vector that grew would free a buffer of
  // key copies without wiping it (the jump is bounded, see open()).
  passed.reserve(offset(epoch) - offset(epoch_));
  const auto wipe_copies = [&] {
    wipe(key);
    wipe(iv);
    for (Earlier& e : passed) {
      wipe(e.key);
      wipe(e.iv);
    }
  };
  bool ok = false, rekeyed = false;
  try {
    for (uint32_t e = epoch_; e != epoch; ++e) {  // modulo 2^32
      passed.push_back(Earlier{e, key, iv, seq});
      ratchet(&key, &iv);
    }
    cipher_.rekey(key);
    rekeyed = true;
    ok = cipher_.open(nonce_for(iv, seq), aad, kAadSize, body, payload, body, tag);
    if (!ok) cipher_.rekey(key_);
  } catch (...) {
    wipe_copies();
    // Put the current key back for the frames still to come. Should that
    // fail too, the cipher keeps a key no peer frame was sealed under, so
    // the link fails closed (kBadTag) rather than open; the first error is
    // the one worth reporting.
    if (rekeyed) {
      try {
        cipher_.rekey(key_);
      } catch (const CryptoError&) {
      }
    }
    throw;
  }
  if (!ok) {
    wipe_copies();
    return false;
  }
  for (Earlier& e : passed) {
    earlier_.push_back(e);
    wipe(e.key);
    wipe(e.iv);
  }
  while (earlier_.size() > kMaxEpochJump) {
    wipe(earlier_.front().key);
    wipe(earlier_.front().iv);
    earlier_.pop_front();
  }
  wipe(key_);
  key_ = key;
  iv_ = iv;
  epoch_ = epoch;
  wipe(key);
  wipe(iv);
  return true;
}

}  // namespace fedwan::security

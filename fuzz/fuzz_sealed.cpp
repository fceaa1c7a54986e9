// Fuzzes the receiving side of a secure link (FrameOpener::open) with the
// session keys of fuzz_keys.hpp, in two modes picked by the first byte:
//
// kModeOpen: the rest of the input is a sealed frame off the wire. Checks
//   that a refusal made without cryptography leaves the bytes untouched, and
//   that an accepted frame comes out as the plain frame (flag cleared, trailer
//   dropped) and is refused as a replay when it comes again.
// kModeTamper: the rest builds a frame, a FrameSealer with the same keys seals
//   it 1..4 times (optionally with a fresh key per frame, so the opener must
//   ratchet, and with the session's first key epoch up to 31 below 2^32, so
//   that the epochs wrap), and one bit of the last sealed frame, chosen by the input, is
//   flipped. The opener must accept the frames before it, refuse the tampered
//   one (the process aborts if it accepts it), and still accept the untouched
//   frame afterwards: a refusal changes no key and records no sequence number.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_keys.hpp"
#include "security/frame_protector.hpp"
#include "wire/frame.hpp"
#include "wire/frame_order.hpp"

namespace {

using fedwan::security::FrameOpener;
using fedwan::security::FrameSealer;
using fedwan::security::kFlagSealed;
using fedwan::security::kSealTrailer;
using fedwan::wire::kHeaderSize;
using Result = FrameOpener::Result;

constexpr size_t kOffFlags = 7;
constexpr size_t kOffPayloadLength = 56;

[[noreturn]] void fail(const char* what, Result r) {
  std::fprintf(stderr, "fuzz_sealed: %s (opener said '%s')\n", what, FrameOpener::result_name(r));
  std::abort();
}

// Opens a copy (the opener decrypts in place) and checks what an accepted
// frame must look like; returns the result and, on kOk, the plain frame.
Result open_copy(FrameOpener& opener, const std::vector<uint8_t>& sealed,
                 std::vector<uint8_t>* plain) {
  std::vector<uint8_t> buf = sealed;
  size_t frame_size = 0;
  const Result r = opener.open(buf.data(), buf.size(), &frame_size);
  if (r == Result::kOk) {
    if (frame_size != sealed.size() - kSealTrailer) fail("accepted frame has the wrong size", r);
    if (buf[kOffFlags] & kFlagSealed) fail("accepted frame still carries the sealed flag", r);
    buf.resize(frame_size);
    if (plain != nullptr) *plain = std::move(buf);
  } else if (r != Result::kBadTag && buf != sealed) {
    fail("a refusal made before any cryptography changed the bytes", r);
  }
  return r;
}

void open_mode(fedwan::security::AeadAlgorithm cipher, const uint8_t* data, size_t size) {
  FrameOpener opener(cipher, fedwan::fuzz::fuzz_key(), fedwan::fuzz::fuzz_iv());
  const std::vector<uint8_t> sealed(data, data + size);
  std::vector<uint8_t> plain;
  const Result r = open_copy(opener, sealed, &plain);
  if (r != Result::kOk) return;
  // The receiver's next step: the plain frame goes to the parser.
  (void)fedwan::wire::parse_frame(plain.data(), plain.size());
  const Result again = open_copy(opener, sealed, nullptr);
  if (again != Result::kReplay) fail("a frame accepted once was not refused as a replay", again);
}

// `frame` with the order field its sealer wrote into `sealed`'s clear header.
std::vector<uint8_t> with_order_of(std::vector<uint8_t> frame, const std::vector<uint8_t>& sealed) {
  std::copy_n(sealed.begin() + fedwan::wire::kOrderOffset, 4,
              frame.begin() + fedwan::wire::kOrderOffset);
  return frame;
}

void tamper_mode(fedwan::security::AeadAlgorithm cipher, const uint8_t* data, size_t size) {
  if (size < 5) return;
  const size_t frames = 1 + (data[0] & 3);
  fedwan::security::RekeyPolicy policy;
  if (data[0] & 4) policy.max_frames = 1;  // a new key epoch for every frame
  const uint32_t first_epoch = UINT32_MAX - (data[0] >> 3);
  uint32_t bit_choice = 0;
  std::memcpy(&bit_choice, data + 1, sizeof bit_choice);
  data += 5;
  size -= 5;

  // A frame as the sealer takes it: the input's header bytes (zero-padded),
  // with the payload length it really has and no sealed flag.
  const size_t head = size < kHeaderSize ? size : kHeaderSize;
  std::vector<uint8_t> frame(kHeaderSize, 0);
  std::memcpy(frame.data(), data, head);
  frame.insert(frame.end(), data + head, data + size);
  const uint32_t payload = static_cast<uint32_t>(size - head);
  for (int i = 0; i < 4; ++i)
    frame[kOffPayloadLength + i] = static_cast<uint8_t>(payload >> (8 * i));
  frame[kOffFlags] &= static_cast<uint8_t>(~kFlagSealed);

  FrameSealer sealer(cipher, fedwan::fuzz::fuzz_key(), fedwan::fuzz::fuzz_iv(), policy,
                     first_epoch);
  FrameOpener opener(cipher, fedwan::fuzz::fuzz_key(), fedwan::fuzz::fuzz_iv(), first_epoch);
  std::vector<uint8_t> sealed;
  for (size_t i = 0; i < frames; ++i) {
    sealed = frame;
    sealer.seal(sealed);
    if (i + 1 == frames) break;
    std::vector<uint8_t> plain;
    const Result r = open_copy(opener, sealed, &plain);
    if (r != Result::kOk) fail("refused an untouched sealed frame", r);
    if (plain != with_order_of(frame, sealed)) {
      fail("opened frame differs from the frame sealed", r);
    }
  }

  std::vector<uint8_t> tampered = sealed;
  const size_t bit = bit_choice % (tampered.size() * 8);
  tampered[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  const Result forged = open_copy(opener, tampered, nullptr);
  if (forged == Result::kOk) fail("accepted a sealed frame with one bit flipped", forged);

  std::vector<uint8_t> plain;
  const Result r = open_copy(opener, sealed, &plain);
  if (r != Result::kOk) fail("refused the untouched frame after refusing its tampered copy", r);
  if (plain != with_order_of(frame, sealed)) fail("opened frame differs from the frame sealed", r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t selector = data[0];
  const auto cipher = fedwan::fuzz::fuzz_cipher(selector);
  if ((selector & 1) == fedwan::fuzz::kModeTamper) {
    tamper_mode(cipher, data + 1, size - 1);
  } else {
    open_mode(cipher, data + 1, size - 1);
  }
  return 0;
}

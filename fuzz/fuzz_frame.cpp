// Fuzzes the wire frame parser, the first code to touch bytes from a peer,
// and the control payload decoders it hands accepted frames to.
//
// Beyond "no crash, no sanitizer report", it checks what parse_frame
// promises: an accepted frame re-encodes to the same header bytes (but the order field, a
// sealer's), its payload is exactly the bytes after the header (less its trailers: a delta's
// excused weight, finite and > 0, and unclipped-site count, below 2^32; an anchor update's or
// welcome's clip, finite and > 0), anything the tight limits accept the default limits accept too,
// and a decoded kHello/kTelemetry payload re-encodes to the bytes it came from.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/frame.hpp"
#include "wire/frame_order.hpp"

namespace {

using namespace fedwan::wire;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_frame: %s\n", what);
  std::abort();
}

// Small enough that the fuzzer reaches every limit check with short inputs.
FrameLimits tight_limits() {
  FrameLimits l;
  l.max_chunk_elements = 64;
  l.max_chunk_count = 4;
  l.max_total_elements = 256;
  l.max_control_payload = 96;
  return l;
}

void check_accepted(const ParsedFrame& f, const uint8_t* data, size_t size) {
  const FrameHeader& h = f.header;
  const bool delta = h.type == MsgType::kDelta;
  const bool excused = delta && (h.flags & kFlagExcused);
  const bool unclipped = delta && (h.flags & kFlagUnclipped);
  const bool clip =
      (h.type == MsgType::kAnchor || h.type == MsgType::kWelcome) && (h.flags & kFlagClip);
  const size_t trailers = kTrailerSize * (size_t{excused} + size_t{unclipped} + size_t{clip});
  if (trailer_size(h) != trailers) fail("trailer_size disagrees with the frame's flags");
  if (f.payload != data + kHeaderSize || f.payload_size + trailers != size - kHeaderSize) {
    fail("accepted frame's payload is not the bytes after the header, less its trailers");
  }
  if (excused != (f.excused_weight != 0) ||
      (excused && !(std::isfinite(f.excused_weight) && f.excused_weight > 0))) {
    fail("accepted frame's excused weight disagrees with its flag, or is not finite and > 0");
  }
  if (unclipped != f.unclipped_sites.has_value() ||
      (unclipped && *f.unclipped_sites >= (uint64_t{1} << 32))) {
    fail("accepted frame's unclipped count disagrees with its flag, or is 2^32 or more");
  }
  if (clip != (f.clip != 0) || (clip && !(std::isfinite(f.clip) && f.clip > 0))) {
    fail("accepted frame's clip disagrees with its flag, or is not finite and > 0");
  }
  if (h.type == MsgType::kAnchor && (h.flags & kFlagClip) && (h.flags & kFlagFullAnchor)) {
    fail("accepted a clip on the model in full");
  }
  uint8_t header[kHeaderSize];
  encode_header(f.header, header);
  // Every field but the order (a sealer's, not parsed) reads back.
  if (std::memcmp(header, data, fedwan::wire::kOrderOffset) != 0) {
    fail("accepted header does not re-encode to the bytes it was parsed from");
  }
}

void check_rejected(const ParsedFrame& f) {
  if (f.detail.empty()) fail("reject without a detail for the log");
  if (f.payload != nullptr || f.payload_size != 0) fail("rejected frame exposes a payload");
}

void decode_payload(const ParsedFrame& f) {
  if (f.header.type == MsgType::kHello) {
    HelloPayload hello;
    if (decode_hello(f.payload, f.payload_size, &hello)) {
      std::vector<uint8_t> again = encode_hello(hello);
      if (again.size() != f.payload_size ||
          std::memcmp(again.data(), f.payload, again.size()) != 0) {
        fail("decoded hello payload does not re-encode to its bytes");
      }
    }
  }
  if (f.header.type == MsgType::kTelemetry) {
    TelemetryPayload telemetry;
    if (decode_telemetry(f.payload, f.payload_size, &telemetry)) {
      std::vector<uint8_t> again = encode_telemetry(telemetry);
      if (again.size() != f.payload_size ||
          std::memcmp(again.data(), f.payload, again.size()) != 0) {
        fail("decoded telemetry payload does not re-encode to its bytes");
      }
    }
  }
  if (f.header.type == MsgType::kHeartbeat && f.payload_size > 0) {
    NeedUpdatePayload need;
    const uint32_t chunks = 1u << 16;
    if (decode_need_update(f.payload, f.payload_size, chunks, &need)) {
      if (need.delivered > chunks) fail("need-update accepted more delivered chunks than exist");
      for (size_t i = 0; i < need.missing.size(); ++i) {
        if (need.missing[i] >= chunks || (i > 0 && need.missing[i] <= need.missing[i - 1])) {
          fail("need-update names a chunk out of range or out of order");
        }
      }
      // What decodes re-encodes to a payload that decodes to the same.
      const std::vector<uint8_t> again = encode_need_update(need.delivered, need.missing);
      NeedUpdatePayload back;
      if (!decode_need_update(again.data(), again.size(), chunks, &back) ||
          back.delivered != need.delivered || back.missing != need.missing) {
        fail("need-update does not survive re-encoding");
      }
    }
    PacePayload pace;
    if (decode_pace(f.payload, f.payload_size, &pace)) {
      if (pace.allowed == 0 || pace.window == 0) fail("pace accepted with nothing allowed");
      const std::vector<uint8_t> again = encode_pace(pace);
      if (again.size() != f.payload_size ||
          std::memcmp(again.data(), f.payload, again.size()) != 0) {
        fail("decoded pace payload does not re-encode to its bytes");
      }
    }
  }
  if (f.header.type == MsgType::kHeartbeat && (f.header.flags & kFlagBusy) &&
      f.header.flags != kFlagBusy) {
    fail("accepted busy beside another flag");
  }
  if (f.header.type == MsgType::kHeartbeat && (f.header.flags & kFlagPace) &&
      f.header.flags != kFlagPace) {
    fail("accepted pace beside another flag");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const FrameLimits tight = tight_limits();

  const ParsedFrame loose = parse_frame(data, size);
  const ParsedFrame strict = parse_frame(data, size, tight);
  for (const ParsedFrame* f : {&loose, &strict}) {
    if (f->ok()) {
      check_accepted(*f, data, size);
      decode_payload(*f);
    } else {
      check_rejected(*f);
    }
  }
  if (strict.ok() && !loose.ok()) fail("tight limits accept a frame the default limits refuse");

  // The decoders also see payloads the parser never vetted (a receiver bug
  // could hand them one), so they get the raw bytes after the header too.
  if (size > kHeaderSize) {
    HelloPayload hello;
    TelemetryPayload telemetry;
    (void)decode_hello(data + kHeaderSize, size - kHeaderSize, &hello);
    (void)decode_telemetry(data + kHeaderSize, size - kHeaderSize, &telemetry);
    NeedUpdatePayload need;
    (void)decode_need_update(data + kHeaderSize, size - kHeaderSize, 1u << 20, &need);
  }
  return 0;
}

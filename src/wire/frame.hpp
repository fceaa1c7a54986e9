// Wire frame, protocol version kVersion: a fixed 64-byte little-endian header
// followed by the payload. Parsing checks every field against limits before
// anything is allocated; a frame that fails is rejected with a reason, never
// thrown at the caller (rejects are an expected outcome on a hostile WAN).
//
// Header layout (offsets in bytes):
//   0 u32 magic 'FWAN'     4 u8 version   5 u8 type   6 u8 codec   7 u8 flags
//   8 u64 job_id          16 u64 round   24 u32 sender
//  28 u32 chunk_index     32 u32 chunk_count          36 u32 element_count
//  40 u64 total_elements  48 f64 weight  56 u32 payload_length   60 u32 order
// The encoded header is also the AEAD associated data of the secure channel.
// `order` is 0 as encoded; a sealer fills it (wire/frame_order.hpp) and
// parse_frame does not judge it.
//
// Rules parse_frame enforces, in this order (first failure wins):
//   size >= 64 (kTooShort); magic; version == kVersion (kBadVersion, so a
//   newer peer is told apart from garbage); type 1..10; codec: a registered codec id on
//   kAnchor/kDelta, an AEAD id (0..kMaxAeadId) on kHandshake, 0 on every
//   other type (kBadCodec); no flag bits except kFlagFullAnchor or kFlagClip on kAnchor,
//   kFlagNoValues, kFlagExcused and kFlagUnclipped on kDelta (kFlagNoValues only with
//   kFlagExcused), kFlagNoChange, kFlagKeepsReplicas and kFlagClip on kWelcome, kFlagSent and
//   kFlagNeedReplica on kHello, kFlagPace, kFlagBusy, kFlagNeedUpdate, kFlagLeaving,
//   kFlagPausing and kFlagMembership on kHeartbeat, kFlagReplicaStored or kFlagNoReplica on
//   kCheckpoint, kFlagNoSession on kHandshake (kBadReserved); payload_length == bytes after the
//   header, so trailing bytes and truncation are kLengthMismatch. kAnchor/kDelta: 1 <= chunk_count
//   <= max_chunk_count, chunk_index < chunk_count, chunk_count <= total_elements (kBadChunk); 1 <=
//   element_count
//   <= max_chunk_elements, total_elements <= max_total_elements, and the chunk
//   fits its stream: the other chunk_count-1 chunks get >= 1 element each, a
//   single chunk carries exactly total_elements (kBadElements); payload_length
//   == codec.encoded_size(element_count) (none with kFlagNoValues) plus
//   trailer_size(header) (kBadPayloadSize); kDelta weight finite and > 0
//   (+0.0 with kFlagNoValues), kAnchor weight +0.0, a kDelta's excused-weight
//   trailer finite and > 0, its unclipped-site count below 2^32, a clip
//   finite and > 0 (kBadWeight).
//   Control types (kHello, kWelcome, kTelemetry, kReject, kDone, kHandshake,
//   kHeartbeat) carry no
//   tensor: chunk_index, chunk_count (kBadChunk), element_count (kBadElements)
//   and weight (kBadWeight, +0.0 bit pattern) must be 0, and payload_length
//   <= max_control_payload (kPayloadTooLarge). total_elements must be 0
//   except on kHello/kWelcome, where it is the model's element count
//   (<= max_total_elements) so both ends can check they train one shape
//   (kBadElements).
//   Their payload's own structure is checked by decode_hello/decode_telemetry;
//   a kWelcome with kFlagClip carries at least its clip trailer
//   (kBadPayloadSize), finite and > 0 (kBadWeight).
//   kCheckpoint (codec 0, weight +0.0) is either a piece of a checkpoint file
//   (flags 0): 1 <= chunk_count <= max_chunk_count, chunk_index <
//   chunk_count (kBadChunk), 1 <= element_count (the piece's bytes) <=
//   max_piece_bytes, element_count <= total_elements (the file's bytes) <=
//   max_checkpoint_bytes (kBadElements), payload_length == element_count
//   (kBadPayloadSize); or a signal (exactly one of kFlagReplicaStored,
//   kFlagNoReplica): chunk and element fields 0, empty payload.
// job_id, round and sender are not judged here: they need session state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fedwan::wire {

inline constexpr uint32_t kMagic = 0x4E415746;  // "FWAN" read as little-endian u32
// 2: TLS, sealed frames; 3: heartbeats, rejoin state; 4: checkpoint replicas;
// 5: the frame cipher bound into the key exporter, signed checkpoints, a
// site's delta weight taken from the topology; 6: elastic membership (a
// child's leave or pause, a region's member weight, on heartbeats); 7: a
// delta's excused weight (kFlagExcused, kFlagNoValues); 8: adaptive clipping
// over regions (kFlagUnclipped up, kFlagClip down); 9: the header's last
// field (reserved before) is `order`, which lets chunks on a striped link
// overtake one another (wire/frame_order.hpp); 10: a parent paces its
// sites' updates (kFlagPace on kHeartbeat); 11: a node busy with long work
// says so on its heartbeats (kFlagBusy); 12: a secure session's key epochs
// start at one drawn from its keys, so a frame of another session is told
// apart (security/frame_protector.hpp)
inline constexpr uint8_t kVersion = 13;
inline constexpr size_t kHeaderSize = 64;

enum class MsgType : uint8_t {
  kHello = 1,      // child -> parent: join; payload HelloPayload
  kWelcome = 2,    // parent -> child: accepted; round = round the child joins at
  kAnchor = 3,     // parent -> child: one chunk of the anchor for `round`
  kDelta = 4,      // child -> parent: one chunk of a weighted delta sum for `round`
  kTelemetry = 5,  // child -> parent: subtree byte counters for `round`
  kReject = 6,     // either way: refusal; payload is a UTF-8 reason
  kDone = 7,       // parent -> child: the federation finished; `round` = rounds run
  // Either way, before anything else: TLS 1.3 handshake records (payload),
  // carried in plain frames; the child's first one names in `codec` the AEAD
  // it asks for (security::AeadAlgorithm). Never seen by the round protocol:
  // the link's security layer consumes it. A sealed, empty kHandshake from
  // the parent confirms the child was authenticated and authorized.
  kHandshake = 8,
  // Either way, every federation.heartbeat_s: `round` = the sender's round.
  // From a parent, kFlagNeedUpdate says the open round still lacks chunks of
  // the child's update (a child that already sent it sends it again).
  kHeartbeat = 9,
  // A node's checkpoint file, sent in pieces at low priority behind the
  // round protocol: child -> parent after each checkpoint (the parent keeps
  // it as a replica), or parent -> child when the child's hello asked for
  // its replica. `round` = the checkpoint's round; chunk_index/chunk_count
  // number the pieces, element_count = the piece's bytes, total_elements =
  // the file's bytes. With kFlagReplicaStored (parent -> child, no payload)
  // it acknowledges the replica of `round`; with kFlagNoReplica the parent
  // has none to give.
  kCheckpoint = 10,
};
inline constexpr uint8_t kMaxAeadId = 2;
const char* msg_type_name(MsgType t);

// Flags. 0x80 marks a sealed frame on the wire (security/frame_protector.hpp);
// the security layer clears it before a frame reaches parse_frame.
inline constexpr uint8_t kFlagFullAnchor = 0x01;  // kAnchor: values, not an update
inline constexpr uint8_t kFlagNoChange = 0x02;    // kWelcome: child's model digest matched
// kDelta from a region that refused some children's copies of the chunk
// (docs/protocol.md, "Excused weight"): the payload ends with an 8-byte f64
// trailer, the weight that delivered the chunk below the sender but whose
// copies were refused. The parent counts it toward its quorum as delivered;
// only the header's weight stands behind the values. With kFlagNoValues
// (never alone) every copy was refused: the payload is the trailer alone and
// the header's weight is +0.0.
inline constexpr uint8_t kFlagExcused = 0x02;
inline constexpr uint8_t kFlagNoValues = 0x01;
inline constexpr size_t kExcusedTrailerSize = 8;
// Adaptive clipping over regions (docs/protocol.md, "Adaptive clipping").
// kDelta from a region, on the last chunk it sends of a round: an 8-byte
// u64 trailer (after the excused-weight one when both) counting the sites
// below the sender whose update for the round no aggregator clipped.
inline constexpr uint8_t kFlagUnclipped = 0x04;
// kAnchor (an update, never with kFlagFullAnchor) and kWelcome, from a
// parent: the payload ends with an 8-byte f64 trailer, the privacy clip
// every site update of the anchor's (the welcome's) round gets.
inline constexpr uint8_t kFlagClip = 0x08;
inline constexpr size_t kTrailerSize = 8;  // each trailer, whichever flag
// kHello: the child has sent its whole update for `round` and waits for the
// anchor (a child rejoining after a reconnect or a parent's restart).
inline constexpr uint8_t kFlagSent = 0x04;
inline constexpr uint8_t kFlagNeedUpdate = 0x04;  // kHeartbeat from a parent, see kHeartbeat
// kHeartbeat from a parent to a site, with a PacePayload: how many chunks of
// the heartbeat's round's update the site may have sent (docs/protocol.md,
// "Pacing"). Never with another flag.
inline constexpr uint8_t kFlagPace = 0x01;
// kHeartbeat either way: the sender is busy with long work at a round
// boundary (writing its checkpoint) and reads nothing meanwhile; it is
// alive, and what it owes follows (common/keep_alive.hpp). Never with
// another flag.
inline constexpr uint8_t kFlagBusy = 0x02;
// kHeartbeat from a child, membership (docs/protocol.md, "Membership"): it
// leaves the federation (kFlagLeaving) or pauses until its participation
// window opens (kFlagPausing), from the heartbeat's round on; it is no longer
// waited for nor counted in the quorum, and comes back by saying hello. A
// region's heartbeats carry kFlagMembership with a MembershipPayload: the
// weight of the sites under it that are members now.
inline constexpr uint8_t kFlagLeaving = 0x10;
inline constexpr uint8_t kFlagPausing = 0x20;
inline constexpr uint8_t kFlagMembership = 0x40;
// kHello: the child has no intact local checkpoint; the parent sends the
// child's replica (kCheckpoint pieces, or kFlagNoReplica) instead of a welcome.
inline constexpr uint8_t kFlagNeedReplica = 0x08;
// kWelcome: the parent keeps replicas; the child sends it its checkpoints.
inline constexpr uint8_t kFlagKeepsReplicas = 0x04;
inline constexpr uint8_t kFlagReplicaStored = 0x01;  // kCheckpoint signal
inline constexpr uint8_t kFlagNoReplica = 0x02;      // kCheckpoint signal
// A plain kHandshake from a parent, with no payload: it holds no session
// with the child whose sealed frame it just dropped (it restarted). Not
// authenticated: a child whose session is up takes it only as a reason to
// judge its parent's silence sooner (docs/protocol.md, "Liveness and
// rejoining").
inline constexpr uint8_t kFlagNoSession = 0x01;

struct FrameHeader {
  MsgType type = MsgType::kHello;
  uint8_t codec = 0;  // CodecId for kAnchor/kDelta, else 0
  uint8_t flags = 0;
  uint64_t job_id = 0;
  uint64_t round = 0;
  uint32_t sender = 0;
  uint32_t chunk_index = 0;
  uint32_t chunk_count = 0;
  uint32_t element_count = 0;
  uint64_t total_elements = 0;
  double weight = 0.0;
  uint32_t payload_length = 0;
};

struct FrameLimits {
  uint32_t max_chunk_elements = 1u << 20;  // 4 MiB of fp32
  uint32_t max_chunk_count = 1u << 20;
  uint64_t max_total_elements = 1ull << 36;
  uint32_t max_control_payload = 4096;         // kHello, kReject, kTelemetry, ...
  uint32_t max_piece_bytes = 4u << 20;         // kCheckpoint piece
  uint64_t max_checkpoint_bytes = 1ull << 40;  // kCheckpoint file
};

enum class RejectReason : uint8_t {
  kNone = 0,
  kTooShort,  // fewer than kHeaderSize bytes
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadCodec,  // unknown codec id, or a codec on a control message
  kBadReserved,
  kLengthMismatch,   // payload_length != bytes after the header
  kBadChunk,         // chunk_index >= chunk_count, count or elements over limits
  kBadElements,      // element_count/total_elements inconsistent or over limits
  kBadPayloadSize,   // payload size wrong for the codec, element count and flags
  kBadWeight,        // not finite and > 0 on kDelta (or its trailer), or not +0.0 where due
  kPayloadTooLarge,  // control payload over its limit
};
const char* reject_reason_name(RejectReason r);

// Writes the 64-byte header.
void encode_header(const FrameHeader& h, uint8_t* out);

// The bytes of trailers the header's type and flags call for at the end
// of its payload (kFlagExcused, kFlagUnclipped, kFlagClip; 8 each).
size_t trailer_size(const FrameHeader& h);

// Header + payload in one buffer. payload_length is taken from `size`, not
// from h; throws ProtocolError if size does not fit 32 bits.
std::vector<uint8_t> encode_frame(const FrameHeader& h, const uint8_t* payload, size_t size);
// The same with the payload left for the caller to write (zeroed) at
// data() + kHeaderSize: an encoder writes its chunk into the frame itself.
std::vector<uint8_t> frame_to_fill(const FrameHeader& h, size_t size);
// The same into `frame` (a buffer used before: resized to header + payload,
// the header written, the payload's bytes left as they were for the caller
// to overwrite every one of).
void frame_to_fill(const FrameHeader& h, size_t size, std::vector<uint8_t>& frame);

// A kDelta of `size` codec bytes that also reports `excused` weight refused
// below the sender. excused == 0: exactly encode_frame(h, values, size), no
// delta flag. excused > 0: sets kFlagExcused and appends the trailer; with
// size == 0 also sets kFlagNoValues and sends weight +0.0. Throws
// ProtocolError if h is not a kDelta, or excused is negative or not finite.
// `unclipped`, when given, sets kFlagUnclipped and appends its trailer last.
std::vector<uint8_t> encode_delta_frame(FrameHeader h, const uint8_t* values, size_t size,
                                        double excused,
                                        std::optional<uint64_t> unclipped = std::nullopt);

// `frame` (an encoded kAnchor update or kWelcome, not sealed) with
// kFlagClip set and `clip` appended as its trailer. Throws ProtocolError on
// another type, a full anchor, a frame that has the flag already, or a clip
// that is not finite and > 0.
std::vector<uint8_t> with_clip(const std::vector<uint8_t>& frame, double clip);

// On a reject, `header` still holds the raw decoded fields (when at least 64
// bytes came) for logging; none of them may be trusted.
struct ParsedFrame {
  RejectReason reject = RejectReason::kNone;
  std::string detail;  // human-readable, for logs and the audit trail
  FrameHeader header;
  // Points into the parsed buffer. It covers the payload less its trailers
  // (trailer_size), so on a kDelta the codec bytes only (0 bytes with
  // kFlagNoValues).
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;
  double excused_weight = 0;                // a kDelta's kFlagExcused trailer, else 0
  std::optional<uint64_t> unclipped_sites;  // a kDelta's kFlagUnclipped trailer
  double clip = 0;                          // a kAnchor's or kWelcome's kFlagClip trailer, else 0
  bool ok() const { return reject == RejectReason::kNone; }
};

// Checks every field; never throws, never allocates more than `detail`.
ParsedFrame parse_frame(const uint8_t* data, size_t size, const FrameLimits& limits = {});

// kHello payload: node id, topology digest and the SHA-256 of the model the
// child starts from (lets the parent skip sending a full anchor).
struct HelloPayload {
  std::string node_id;
  std::array<uint8_t, 32> topology_digest{};
  std::array<uint8_t, 32> model_digest{};
};
std::vector<uint8_t> encode_hello(const HelloPayload& p);
bool decode_hello(const uint8_t* data, size_t size, HelloPayload* out);  // false if malformed

// kHeartbeat with kFlagNeedUpdate, from a parent: how far the child's update
// of the heartbeat's round has come, so that the child sends again only the
// chunks that are lost, and only once the parent stopped receiving them (a
// slow link that still delivers has lost nothing).
//   u32 delivered   chunks of the update the parent received this round
//   u32 first       the chunk the bitmap's first bit stands for
//   bitmap          bit i (least significant first) set: chunk first + i is
//                   still missing; at most kNeedUpdateBitmapBytes
// Missing chunks past the bitmap's reach are named by a later heartbeat. An
// empty payload (a parent that says nothing of progress) means every chunk.
struct NeedUpdatePayload {
  uint32_t delivered = 0;
  std::vector<uint32_t> missing;  // ascending
  bool progress_known = false;    // false: an empty payload
};
inline constexpr size_t kNeedUpdateBitmapBytes = 4096 - 8;
// `missing` ascending; those beyond the bitmap's reach from missing[0] are
// left out.
std::vector<uint8_t> encode_need_update(uint32_t delivered, const std::vector<uint32_t>& missing);
// False if malformed, or naming a chunk at or past `chunk_count`.
bool decode_need_update(const uint8_t* data, size_t size, uint32_t chunk_count,
                        NeedUpdatePayload* out);

// kTelemetry payload: bytes that crossed the links of a subtree for a round.
struct TelemetryPayload {
  uint64_t wan_bytes = 0;   // actual bytes on the wire (headers included)
  uint64_t fp32_bytes = 0;  // what the same frames would have been with fp32
  uint64_t frames = 0;
};
std::vector<uint8_t> encode_telemetry(const TelemetryPayload& p);
bool decode_telemetry(const uint8_t* data, size_t size, TelemetryPayload* out);

// kHeartbeat with kFlagPace, from a parent: the site's allowance.
//   u8 fields (= 2)   u32 allowed   u32 window   (both >= 1)
// `allowed`: chunks of the heartbeat's round's update the site may have
// sent; `window`: what it may send of a later round's before it is told.
struct PacePayload {
  uint32_t allowed = 0;
  uint32_t window = 0;
};
std::vector<uint8_t> encode_pace(const PacePayload& p);
bool decode_pace(const uint8_t* data, size_t size, PacePayload* out);  // false if malformed

// kHeartbeat with kFlagMembership, from a region: its live membership.
//   u8 fields (= 2)   f64 member weight (finite, >= 0)   u32 member sites
struct MembershipPayload {
  double weight = 0;
  uint32_t sites = 0;
};
std::vector<uint8_t> encode_membership(const MembershipPayload& p);
bool decode_membership(const uint8_t* data, size_t size,
                       MembershipPayload* out);  // false if malformed

}  // namespace fedwan::wire

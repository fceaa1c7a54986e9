// What a parent works out from a child's delta frame on the crypto thread
// that opened it (transport::FrameInspector), while its bytes are in that
// core's cache: the digest the audit log or the replay check takes (SHA-256
// with an audit log, else the keyed fingerprint), the codec's check of the
// payload and the screen's measure of its values (fp16). The event loop then
// judges and adds the chunk without passing over its bytes for them again. Pure: a function of the
// frame's bytes alone, so it may run on any thread, on several frames at once.
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "aggregation/round_accumulator.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "transport/crypto_workers.hpp"
#include "wire/frame.hpp"

namespace fedwan::aggregator {

struct DeltaFacts {
  // What they were worked out from: they hold for that payload alone.
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;
  const Codec* codec = nullptr;
  uint32_t element_count = 0;
  std::optional<Sha256Digest> sha;      // with `sha256`
  std::optional<uint64_t> fingerprint;  // without
  bool valid = false;                   // the codec's validate() passed
  // aggregation::measure_payload's, where valid.
  std::optional<aggregation::ValueMeasure> measure;
};

// Answers DeltaFacts for a delta frame with values, nothing for any other.
// `sha256`: the node hashes payloads for its audit log (or its record of
// updates); else it takes their fingerprint (aggregation::payload_digest).
transport::FrameInspector delta_inspector(bool sha256);

// The facts `inspected` holds for the parsed frame `f`, if they are for its
// very payload, codec and element count; else null.
const DeltaFacts* delta_facts(const std::any& inspected, const wire::ParsedFrame& f);

// As the accumulator takes them.
aggregation::PayloadFacts payload_facts(const DeltaFacts* facts, const Sha256Digest* sha);

}  // namespace fedwan::aggregator

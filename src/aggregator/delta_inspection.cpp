#include "aggregator/delta_inspection.hpp"

#include <limits>

#include "aggregation/update_screen.hpp"

namespace fedwan::aggregator {

namespace {

// Only where the payload lies and what it claims to be matters here: the
// event loop parses the frame again under the model's limits.
wire::FrameLimits any_size() {
  wire::FrameLimits l;
  l.max_chunk_elements = std::numeric_limits<uint32_t>::max();
  l.max_chunk_count = std::numeric_limits<uint32_t>::max();
  l.max_total_elements = std::numeric_limits<uint64_t>::max();
  return l;
}

}  // namespace

transport::FrameInspector delta_inspector(bool sha256) {
  return [sha256, limits = any_size()](const uint8_t* frame, size_t size) -> std::any {
    const wire::ParsedFrame f = wire::parse_frame(frame, size, limits);
    if (!f.ok() || f.header.type != wire::MsgType::kDelta || f.payload_size == 0) return {};
    DeltaFacts facts;
    facts.payload = f.payload;
    facts.payload_size = f.payload_size;
    facts.codec = codec_by_wire_id(f.header.codec);
    facts.element_count = f.header.element_count;
    if (facts.codec == nullptr) return {};
    facts.valid = facts.codec->validate(f.payload, f.payload_size, f.header.element_count);
    if (facts.valid) {
      facts.measure = aggregation::measure_payload(*facts.codec, f.payload, f.header.element_count);
    }
    if (sha256) {
      facts.sha = fedwan::sha256(f.payload, f.payload_size);
    } else {
      facts.fingerprint = aggregation::payload_digest(f.payload, f.payload_size);
    }
    return facts;
  };
}

const DeltaFacts* delta_facts(const std::any& inspected, const wire::ParsedFrame& f) {
  const auto* facts = std::any_cast<DeltaFacts>(&inspected);
  if (facts == nullptr || facts->payload != f.payload || facts->payload_size != f.payload_size ||
      facts->codec != codec_by_wire_id(f.header.codec) ||
      facts->element_count != f.header.element_count) {
    return nullptr;
  }
  return facts;
}

aggregation::PayloadFacts payload_facts(const DeltaFacts* facts, const Sha256Digest* sha) {
  aggregation::PayloadFacts known;
  known.sha = sha;
  if (facts != nullptr) {
    known.fingerprint = facts->fingerprint;
    known.valid = facts->valid;
    known.measure = facts->measure;
  }
  return known;
}

}  // namespace fedwan::aggregator

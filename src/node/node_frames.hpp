// Small helpers shared by the aggregator and the site engine to build the
// frames of the round protocol and to explain refusals.
#pragma once

#include <string>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/topology.hpp"
#include "tensor/chunk_plan.hpp"
#include "wire/frame.hpp"

namespace fedwan::node {

// A header pre-filled with this node's job id and sender id.
inline wire::FrameHeader node_header(const Topology& topo, uint32_t self, wire::MsgType type,
                                     uint64_t round) {
  wire::FrameHeader h;
  h.type = type;
  h.job_id = topo.job_id();
  h.sender = self;
  h.round = round;
  return h;
}

// The header of chunk `chunk` of a model stream (kAnchor, kDelta) cut by
// `plan`, its payload in `codec`. `weight`: a delta's; an anchor's is +0.0,
// as the wire requires.
inline wire::FrameHeader chunk_header(const Topology& topo, uint32_t self, wire::MsgType type,
                                      uint64_t round, const tensor::ChunkPlan& plan, uint32_t chunk,
                                      CodecId codec, double weight = 0.0) {
  wire::FrameHeader h = node_header(topo, self, type, round);
  h.codec = static_cast<uint8_t>(codec);
  h.chunk_index = chunk;
  h.chunk_count = plan.count();
  h.element_count = plan.size(chunk);
  h.total_elements = plan.total();
  h.weight = weight;
  return h;
}

inline std::vector<uint8_t> make_frame(const wire::FrameHeader& h,
                                       const std::vector<uint8_t>& payload) {
  wire::FrameHeader copy = h;
  copy.payload_length = static_cast<uint32_t>(payload.size());
  return wire::encode_frame(copy, payload.data(), payload.size());
}

inline std::vector<uint8_t> reject_frame(const Topology& topo, uint32_t self, uint64_t round,
                                         const std::string& reason) {
  const std::string text = reason.size() > 1000 ? reason.substr(0, 1000) : reason;
  std::vector<uint8_t> payload(text.begin(), text.end());
  return make_frame(node_header(topo, self, wire::MsgType::kReject, round), payload);
}

}  // namespace fedwan::node

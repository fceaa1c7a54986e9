// RoundAccumulator's chunks in flight (round_accumulator.cpp has the
// rest): where a chunk's combiner and held copies wait for more copies, in
// memory within the budget (park_beyond), else on disk as the combiner's
// state or the payload of the one copy behind it, and held copies as their
// values or payloads (aggregation/chunk_parking.hpp).
#include "aggregation/round_accumulator.hpp"

#include <vector>

namespace fedwan::aggregation {

void RoundAccumulator::recycle(std::vector<float>&& values) {
  if (spares_.size() >= kSpares || values.capacity() < plan_.chunk_elements()) return;
  spares_.push_back(std::move(values));
}

std::vector<float> RoundAccumulator::spare(uint32_t n) {
  if (spares_.empty()) return {};
  std::vector<float> v = std::move(spares_.back());
  spares_.pop_back();
  v.resize(n);  // within its capacity: nothing moves, nothing is zeroed below its old size
  return v;
}

void RoundAccumulator::unpark(Inflight& acc) {
  if (!acc.parked.file) return;
  std::vector<float>* state = acc.combiner->parkable();
  // Read back into a kept vector (every byte is overwritten) rather than a
  // new zeroed one.
  if (state->empty()) *state = spare(static_cast<uint32_t>(acc.parked.bytes / sizeof(float)));
  ChunkParking::unpark(state, &acc.parked);
}

void RoundAccumulator::unpark_held(Inflight& acc, uint32_t chunk) {
  for (size_t i = 0; i < acc.held_parked.size(); ++i) {
    HeldParked& p = acc.held_parked[i];
    if (!p.ticket.file) continue;
    std::vector<float>& values = acc.held[i].values;
    if (p.payload) {
      ChunkParking::unpark_bytes(&replay_payload_, &p.ticket);
      values.resize(plan_.size(chunk));
      codec_by_id(p.codec)->decode(replay_payload_.data(), values.size(), values.data());
    } else {
      ChunkParking::unpark(&values, &p.ticket);
    }
  }
  acc.held_parked.clear();
}

ChunkCombiner& RoundAccumulator::combiner_of(Inflight& acc, uint32_t chunk) {
  const uint32_t n = plan_.size(chunk);
  if (acc.replay.file) {
    // The same calls as when the copy came: the same state, bit for bit.
    const Codec* codec = codec_by_id(acc.replay_codec);
    ChunkParking::unpark_bytes(&replay_payload_, &acc.replay);
    acc.combiner = rule_->begin_chunk_reusing(n, acc.fan_in, spare(n));
    acc.combiner->add_encoded(acc.added.front().first, *codec, replay_payload_.data(), n,
                              acc.added.front().second, replay_values_);
  } else if (!acc.combiner) {
    acc.fan_in = children_.size();
    acc.combiner = rule_->begin_chunk_reusing(n, acc.fan_in, spare(n));
    rule_parks_ = acc.combiner->parkable() != nullptr;
  }
  unpark(acc);
  return *acc.combiner;
}

bool RoundAccumulator::park_first_copy(Inflight& acc, uint32_t chunk, int slot, double weight,
                                       const Payload& copy) {
  // Only where park_if_over would set this copy's payload aside as soon as
  // it went into a new combiner: then no combiner is begun for it (its
  // state zeroed, the copy added, all dropped at once). combiner_of()
  // rebuilds it from the payload with the same calls when the chunk's next
  // copy comes or the chunk is taken.
  const uint32_t n = plan_.size(chunk);
  if (!parking_.on() || !rule_parks_ || acc.combiner || acc.replay.file || acc.parked.file ||
      !acc.added.empty() || !acc.held.empty() || copy.bytes >= size_t{n} * sizeof(float)) {
    return false;
  }
  if (ready_with(chunk, slot, acc.weight + weight)) return false;  // taken at once
  if (bytes_in_flight() + size_t{n} * sizeof(float) <= parking_.budget()) return false;
  if (!parking_.park_bytes(copy.data, copy.bytes, &acc.replay)) return false;
  acc.replay_codec = copy.codec->id();
  acc.fan_in = children_.size();
  return true;
}

void RoundAccumulator::park_if_over(Inflight& acc, const Payload& last) {
  if (!parking_.on() || bytes_in_flight() <= parking_.budget()) return;
  if (acc.combiner && !acc.parked.file) {
    if (std::vector<float>* state = acc.combiner->parkable()) {
      // The payload of the one copy behind the state, where it is smaller.
      const bool replay = last.codec != nullptr && !last.held && acc.added.size() == 1 &&
                          acc.held.empty() && last.bytes < state->size() * sizeof(float);
      if (replay && parking_.park_bytes(last.data, last.bytes, &acc.replay)) {
        acc.replay_codec = last.codec->id();
        recycle(std::move(*state));
        acc.combiner.reset();
      } else {
        std::vector<float> kept;
        if (parking_.park(state, &acc.parked, &kept)) recycle(std::move(kept));
      }
    }
  }
  acc.held_parked.resize(acc.held.size());
  for (size_t i = 0; i < acc.held.size(); ++i) {
    HeldParked& p = acc.held_parked[i];
    if (p.ticket.file) continue;
    std::vector<float>& values = acc.held[i].values;
    // The copy just held, as its payload where that is smaller.
    if (last.codec != nullptr && last.held && i + 1 == acc.held.size() &&
        last.bytes < values.size() * sizeof(float) &&
        parking_.park_bytes(last.data, last.bytes, &p.ticket)) {
      p.payload = true;
      p.codec = last.codec->id();
      std::vector<float>().swap(values);
    } else {
      (void)parking_.park(&values, &p.ticket);
    }
  }
}

size_t RoundAccumulator::bytes_in_flight() const {
  size_t total = 0;
  for (const auto& entry : inflight_) {
    if (entry.second.combiner) total += entry.second.combiner->bytes_held();
    for (const HeldCopy& h : entry.second.held) total += h.values.size() * sizeof(float);
  }
  return total;
}

}  // namespace fedwan::aggregation

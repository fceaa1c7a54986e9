// The payloads of control frames (declared in wire/frame.hpp): kHello,
// kTelemetry, and kHeartbeat's need-update progress, pace and membership.
// parse_frame bounds only their length; the decoders check their structure.
// kHello:     u8 id_length (1..64) | id | 32 topology digest | 32 model digest
// kTelemetry: u8 field_count (3) | u64 wan_bytes | u64 fp32_bytes | u64 frames
// Those two and the membership decoder demand the exact size: a longer
// payload is as suspect as a short one.
#include "wire/frame.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>

#include "common/node_id.hpp"
#include "fedwan/error.hpp"
#include "wire/byte_order.hpp"

namespace fedwan::wire {

namespace {
constexpr size_t kTelemetryFields = 3;
constexpr size_t kTelemetrySize = 1 + 8 * kTelemetryFields;
constexpr uint8_t kMembershipFields = 2;
constexpr size_t kMembershipSize = 1 + 8 + 4;
constexpr uint8_t kPaceFields = 2;
constexpr size_t kPaceSize = 1 + 4 + 4;
}  // namespace

std::vector<uint8_t> encode_hello(const HelloPayload& p) {
  if (!is_valid_node_id(p.node_id)) {
    FEDWAN_THROW(ConfigError,
                 "node id '" + p.node_id + "' is invalid: use 1..64 characters of [A-Za-z0-9._-]");
  }
  std::vector<uint8_t> out;
  out.reserve(1 + p.node_id.size() + 64);
  out.push_back(static_cast<uint8_t>(p.node_id.size()));
  out.insert(out.end(), p.node_id.begin(), p.node_id.end());
  out.insert(out.end(), p.topology_digest.begin(), p.topology_digest.end());
  out.insert(out.end(), p.model_digest.begin(), p.model_digest.end());
  return out;
}

bool decode_hello(const uint8_t* data, size_t size, HelloPayload* out) {
  if (data == nullptr || out == nullptr || size < 1) return false;
  size_t len = data[0];
  if (len == 0 || len > kMaxNodeIdLength || size != 1 + len + 64) return false;
  std::string_view id(reinterpret_cast<const char*>(data + 1), len);
  if (!is_valid_node_id(id)) return false;
  out->node_id.assign(id);
  std::memcpy(out->topology_digest.data(), data + 1 + len, 32);
  std::memcpy(out->model_digest.data(), data + 1 + len + 32, 32);
  return true;
}

std::vector<uint8_t> encode_telemetry(const TelemetryPayload& p) {
  std::vector<uint8_t> out(kTelemetrySize);
  out[0] = static_cast<uint8_t>(kTelemetryFields);
  put_u64(out.data() + 1, p.wan_bytes);
  put_u64(out.data() + 9, p.fp32_bytes);
  put_u64(out.data() + 17, p.frames);
  return out;
}

bool decode_telemetry(const uint8_t* data, size_t size, TelemetryPayload* out) {
  if (data == nullptr || out == nullptr || size != kTelemetrySize) return false;
  if (data[0] != kTelemetryFields) return false;
  out->wan_bytes = get_u64(data + 1);
  out->fp32_bytes = get_u64(data + 9);
  out->frames = get_u64(data + 17);
  return true;
}

std::vector<uint8_t> encode_membership(const MembershipPayload& p) {
  std::vector<uint8_t> out(kMembershipSize);
  out[0] = static_cast<uint8_t>(kMembershipFields);
  put_u64(out.data() + 1, double_bits(p.weight));
  put_u32(out.data() + 9, p.sites);
  return out;
}

bool decode_membership(const uint8_t* data, size_t size, MembershipPayload* out) {
  if (data == nullptr || out == nullptr || size != kMembershipSize) return false;
  if (data[0] != kMembershipFields) return false;
  const double w = bits_double(get_u64(data + 1));
  if (!std::isfinite(w) || w < 0) return false;
  out->weight = w;
  out->sites = get_u32(data + 9);
  return true;
}

std::vector<uint8_t> encode_pace(const PacePayload& p) {
  std::vector<uint8_t> out(kPaceSize);
  out[0] = kPaceFields;
  put_u32(out.data() + 1, p.allowed);
  put_u32(out.data() + 5, p.window);
  return out;
}

bool decode_pace(const uint8_t* data, size_t size, PacePayload* out) {
  if (data == nullptr || out == nullptr || size != kPaceSize || data[0] != kPaceFields) {
    return false;
  }
  const PacePayload p{get_u32(data + 1), get_u32(data + 5)};
  if (p.allowed == 0 || p.window == 0) return false;
  *out = p;
  return true;
}

std::vector<uint8_t> encode_need_update(uint32_t delivered, const std::vector<uint32_t>& missing) {
  const uint32_t first = missing.empty() ? 0 : missing.front();
  size_t bitmap = 0;
  for (uint32_t c : missing) {
    const uint64_t bit = uint64_t{c} - first;
    if (c < first || bit >= kNeedUpdateBitmapBytes * 8) continue;
    bitmap = std::max<size_t>(bitmap, static_cast<size_t>(bit / 8 + 1));
  }
  std::vector<uint8_t> out(8 + bitmap, 0);
  put_u32(out.data(), delivered);
  put_u32(out.data() + 4, first);
  for (uint32_t c : missing) {
    const uint64_t bit = uint64_t{c} - first;
    if (c < first || bit >= kNeedUpdateBitmapBytes * 8) continue;
    out[8 + bit / 8] = static_cast<uint8_t>(out[8 + bit / 8] | (1u << (bit % 8)));
  }
  return out;
}

bool decode_need_update(const uint8_t* data, size_t size, uint32_t chunk_count,
                        NeedUpdatePayload* out) {
  if (out == nullptr) return false;
  *out = NeedUpdatePayload{};
  if (size == 0) {
    for (uint32_t c = 0; c < chunk_count; ++c) out->missing.push_back(c);
    return true;
  }
  if (data == nullptr || size < 8 || size > 8 + kNeedUpdateBitmapBytes) return false;
  out->delivered = get_u32(data);
  out->progress_known = true;
  const uint32_t first = get_u32(data + 4);
  if (out->delivered > chunk_count) return false;
  for (size_t i = 0; i < (size - 8) * 8; ++i) {
    if ((data[8 + i / 8] >> (i % 8) & 1u) == 0) continue;
    const uint64_t c = uint64_t{first} + i;
    if (c >= chunk_count) return false;
    out->missing.push_back(static_cast<uint32_t>(c));
  }
  return true;
}

}  // namespace fedwan::wire

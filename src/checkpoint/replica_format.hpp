// What the two halves of a replica image share (replica_image.hpp says the
// format): the names of its encodings, the working block both sides use,
// and the meta section. Making an image is replica_image.cpp; reading one
// back, replica_decode.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/checkpoint_meta.hpp"

namespace fedwan::checkpoint::replica {

inline constexpr const char* kMeta = kMetaSection;
inline constexpr const char* kXor = "xor-fp32-zstd";
inline constexpr const char* kBf16 = "bf16-planes";  // zstd(high bytes), then the low bytes
inline constexpr const char* kBf16Held = "bf16-held-planes";  // the same of values kept as bf16
inline constexpr const char* kZstd = "zstd";
inline constexpr size_t kBlockFloats = size_t{1} << 16;      // working buffer: 256 KiB of fp32
inline constexpr uint64_t kMaxRawBytes = uint64_t{1} << 40;  // a section no node could hold

// A section of plain bytes (neither a view nor produced as it is written).
inline CheckpointSection plain_section(std::string name, std::vector<uint8_t> bytes) {
  CheckpointSection s;
  s.name = std::move(name);
  s.bytes = std::move(bytes);
  return s;
}

inline CheckpointSection meta_section(const nlohmann::json& meta) {
  const std::string m = meta.dump();
  return plain_section(kMeta, std::vector<uint8_t>(m.begin(), m.end()));
}

}  // namespace fedwan::checkpoint::replica

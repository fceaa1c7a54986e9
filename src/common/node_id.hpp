// The node-id rule shared by the topology file and the kHello payload, so a
// name accepted in one is never refused by the other.
#pragma once

#include <cstddef>
#include <string_view>

namespace fedwan {

inline constexpr size_t kMaxNodeIdLength = 64;

// 1..64 characters of [A-Za-z0-9._-]. Ids appear in file names, logs,
// certificate subjects and metric labels, hence the narrow alphabet.
inline bool is_valid_node_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxNodeIdLength) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace fedwan

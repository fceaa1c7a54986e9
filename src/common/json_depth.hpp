// How deep a JSON text nests, found without parsing it: lines read from
// files a peer or an operator wrote are refused past a depth before a
// recursive parser sees them. Strings (and escapes in them) are skipped.
#pragma once

#include <cstddef>

namespace fedwan {

// Whether the text [b, e) opens more than `limit` objects or arrays at once.
inline bool json_nesting_exceeds(const char* b, const char* e, size_t limit) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char* p = b; p != e; ++p) {
    const char c = *p;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return true;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return false;
}

}  // namespace fedwan

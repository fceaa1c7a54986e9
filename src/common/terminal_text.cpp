#include "common/terminal_text.hpp"

#include <cstdint>
#include <cstdio>

namespace fedwan {
namespace {

// The code point of the valid UTF-8 sequence at s[i], and its length; 0 for
// a length when the bytes there are not one (truncated, overlong,
// surrogate, past U+10FFFF, or a stray continuation byte).
size_t utf8_at(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char lead = b(0);
  size_t n = 0;
  uint32_t min = 0;
  if (lead < 0x80) {
    *cp = lead;
    return 1;
  } else if ((lead & 0xE0) == 0xC0) {
    n = 2, min = 0x80, *cp = lead & 0x1Fu;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, min = 0x800, *cp = lead & 0x0Fu;
  } else if ((lead & 0xF8) == 0xF0) {
    n = 4, min = 0x10000, *cp = lead & 0x07u;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (b(k) & 0x3Fu);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return n;
}

// Code points that change how a terminal lays out or reads what follows.
bool is_layout_control(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
         (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string terminal_text(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(text.size() < max_bytes ? text.size() : max_bytes);
  char esc[16];
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    const size_t n = utf8_at(text, i, &cp);
    if (i + (n == 0 ? 1 : n) > max_bytes) break;
    if (n == 0) {
      std::snprintf(esc, sizeof esc, "\\x%02x", static_cast<unsigned char>(text[i]));
      out += esc;
      i += 1;
      continue;
    }
    if (cp < 0x20 || cp == 0x7F) {
      std::snprintf(esc, sizeof esc, "\\x%02x", static_cast<unsigned>(cp));
      out += esc;
    } else if (is_layout_control(cp)) {
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(cp));
      out += esc;
    } else {
      out.append(text.data() + i, n);
    }
    i += n;
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace fedwan

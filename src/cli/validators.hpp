// CLI11 validators for numbers: a value outside its range, not finite, or a
// negative number given to an unsigned option (CLI11 would wrap "-1" to
// 2^64-1) is refused at parse time with the range in the message.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

namespace fedwan::cli {

inline std::string number_text(double v) {
  char buf[32];
  if (std::floor(v) == v && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%g", v);
  }
  return buf;
}

// A finite number in [lo, hi] (whole numbers when `integer`), written
// without a minus sign when lo >= 0.
inline CLI::Validator number_in(double lo, double hi, bool integer = true) {
  const std::string range = "[" + number_text(lo) + ", " + number_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, integer, range](std::string& text) -> std::string {
        const std::string kind = integer ? "a whole number" : "a number";
        if (text.empty()) return "must be " + kind + " in " + range;
        if (lo >= 0 && text.find('-') != std::string::npos) {
          return "must be " + kind + " in " + range + ", not negative";
        }
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size()) throw std::invalid_argument(text);
        } catch (const std::exception&) {
          return "must be " + kind + " in " + range + ", not '" + text + "'";
        }
        if (!std::isfinite(v) || v < lo || v > hi || (integer && std::floor(v) != v)) {
          return "must be " + kind + " in " + range + ", not '" + text + "'";
        }
        return std::string();
      },
      integer ? "INT in " + range : "NUMBER in " + range);
}

}  // namespace fedwan::cli

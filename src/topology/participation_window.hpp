// Participation windows (NodeSpec::windows): daily UTC windows in which a
// site trains. Pure: callers pass the time, so tests need no clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fedwan::topology {

struct DailyWindow {
  uint32_t start_s = 0;  // seconds after 00:00 UTC, < 86400
  uint32_t end_s = 0;    // <= 86400; below start_s: the window wraps past midnight
};

// Parses "HH:MM[:SS]-HH:MM[:SS]" (end may be 24:00); nullopt and `why` set
// when malformed or empty (start == end).
std::optional<DailyWindow> parse_daily_window(const std::string& text, std::string* why);

class ParticipationWindows {
 public:
  ParticipationWindows() = default;  // always open
  // Throws ConfigError naming the malformed window.
  explicit ParticipationWindows(const std::vector<std::string>& windows);
  bool always() const { return windows_.empty(); }
  // Whether `unix_seconds` (UTC) falls inside a window.
  bool open_at(int64_t unix_seconds) const;
  // Seconds from `unix_seconds` until a window is open (0 when one is).
  int64_t seconds_until_open(int64_t unix_seconds) const;
  // Seconds from `unix_seconds` until every window is closed (0 when none is
  // open; a day when the windows cover the whole day).
  int64_t seconds_until_closed(int64_t unix_seconds) const;

 private:
  std::vector<DailyWindow> windows_;
};

}  // namespace fedwan::topology

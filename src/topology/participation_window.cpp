#include "topology/participation_window.hpp"

#include <algorithm>
#include <cctype>

#include "fedwan/error.hpp"

namespace fedwan::topology {
namespace {

constexpr int64_t kDay = 86400;

// "HH:MM" or "HH:MM:SS" at text[pos..end); 24:00[:00] allowed when `end_of_day`.
std::optional<uint32_t> parse_clock(const std::string& t, bool end_of_day) {
  const auto two = [&](size_t at) -> int {
    if (at + 2 > t.size() || !std::isdigit(static_cast<unsigned char>(t[at])) ||
        !std::isdigit(static_cast<unsigned char>(t[at + 1])))
      return -1;
    return (t[at] - '0') * 10 + (t[at + 1] - '0');
  };
  if (t.size() != 5 && t.size() != 8) return std::nullopt;
  const int h = two(0);
  const int m = two(3);
  const int s = t.size() == 8 ? two(6) : 0;
  if (t[2] != ':' || (t.size() == 8 && t[5] != ':')) return std::nullopt;
  if (h < 0 || m < 0 || s < 0 || m > 59 || s > 59) return std::nullopt;
  if (h == 24 && m == 0 && s == 0 && end_of_day) return 86400;
  if (h > 23) return std::nullopt;
  return static_cast<uint32_t>(h * 3600 + m * 60 + s);
}

bool inside(const DailyWindow& w, int64_t second_of_day) {
  if (w.start_s < w.end_s) return second_of_day >= w.start_s && second_of_day < w.end_s;
  return second_of_day >= w.start_s || second_of_day < w.end_s;  // wraps past midnight
}

}  // namespace

std::optional<DailyWindow> parse_daily_window(const std::string& text, std::string* why) {
  const size_t dash = text.find('-');
  const auto fail = [&](const std::string& m) -> std::optional<DailyWindow> {
    if (why) *why = "window '" + text + "' " + m;
    return std::nullopt;
  };
  if (dash == std::string::npos) return fail("is not HH:MM-HH:MM (UTC)");
  const auto start = parse_clock(text.substr(0, dash), false);
  const auto end = parse_clock(text.substr(dash + 1), true);
  if (!start || !end) return fail("is not HH:MM[:SS]-HH:MM[:SS] (UTC, 00:00 to 24:00)");
  if (*start == *end % kDay && *end != 86400) return fail("is empty (start equals end)");
  if (*start == 0 && *end == 86400) return DailyWindow{0, 86400};
  return DailyWindow{*start, *end};
}

ParticipationWindows::ParticipationWindows(const std::vector<std::string>& windows) {
  for (const std::string& w : windows) {
    std::string why;
    const auto parsed = parse_daily_window(w, &why);
    if (!parsed) throw ConfigError(why);
    windows_.push_back(*parsed);
  }
}

bool ParticipationWindows::open_at(int64_t unix_seconds) const {
  if (windows_.empty()) return true;
  const int64_t sod = ((unix_seconds % kDay) + kDay) % kDay;
  for (const DailyWindow& w : windows_) {
    if (inside(w, sod)) return true;
  }
  return false;
}

int64_t ParticipationWindows::seconds_until_open(int64_t unix_seconds) const {
  if (open_at(unix_seconds)) return 0;
  const int64_t sod = ((unix_seconds % kDay) + kDay) % kDay;
  int64_t best = kDay;
  for (const DailyWindow& w : windows_) {
    best = std::min(best, ((int64_t{w.start_s} - sod) % kDay + kDay) % kDay);
  }
  return best;
}

int64_t ParticipationWindows::seconds_until_closed(int64_t unix_seconds) const {
  if (!open_at(unix_seconds)) return 0;
  // Windows may touch or overlap: walk forward second by second would be
  // slow, so step from one window's end to the next check.
  int64_t t = unix_seconds;
  for (int guard = 0; guard < 64 && open_at(t); ++guard) {
    const int64_t sod = ((t % kDay) + kDay) % kDay;
    int64_t step = kDay;
    for (const DailyWindow& w : windows_) {
      if (!inside(w, sod)) continue;
      const int64_t end = w.end_s % kDay;
      step = std::min(step, std::max<int64_t>(1, ((end - sod) % kDay + kDay) % kDay));
    }
    if (step >= kDay) return kDay;
    t += step;
  }
  return open_at(t) ? kDay : t - unix_seconds;
}

}  // namespace fedwan::topology

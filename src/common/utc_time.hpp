// UTC times as the logs, alarms and CLI print them: "2026-11-24T10:00:00Z".
#pragma once

#include <ctime>
#include <string>

namespace fedwan {

inline std::string utc_text(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fedwan

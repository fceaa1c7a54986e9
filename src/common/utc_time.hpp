// UTC times as every record, log line, alarm and CLI prints them:
// "2026-11-24T10:00:00Z", or with milliseconds "2026-11-24T10:00:00.123Z"
// (audit entries, cost records). The one place they are formatted.
#pragma once

#include <chrono>
#include <ctime>
#include <string>

namespace fedwan {

// A broken-down UTC time; "" when it cannot be rendered (a year beyond
// what strftime's buffer holds).
std::string utc_text(const std::tm& tm);
// Seconds since the epoch.
std::string utc_text(std::time_t t);
// With milliseconds.
std::string utc_text_ms(std::chrono::system_clock::time_point t);
inline std::string utc_now_ms() { return utc_text_ms(std::chrono::system_clock::now()); }

}  // namespace fedwan

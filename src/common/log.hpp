// One stderr logger for the library, tagged by subsystem in each message.
// Level from FEDWAN_LOG_LEVEL (trace|debug|info|warn|error|off; default warn).
#pragma once

#include <spdlog/spdlog.h>

namespace fedwan {

spdlog::logger& log();
void set_log_level(const std::string& level);  // throws ConfigError on an unknown level

}  // namespace fedwan

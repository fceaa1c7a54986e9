// One stderr logger for the library, tagged by subsystem in each message.
// Level from FEDWAN_LOG_LEVEL (trace|debug|info|warn|error|off; default warn).
//
// Every line is escaped before it is written: control characters (a newline
// a peer put in its node id or refusal text, terminal escape sequences) come
// out as \n, \x1b, \u0085 ..., so nothing a peer sends can forge or hide a
// log line. A failed write to stderr is counted (log_write_failures()) for
// the node's alarm, never thrown.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/log_level.hpp"
#include "fedwan/export.hpp"

namespace fedwan {

// Exported for libfedwan_cuda, which logs through the same logger; not
// public API.
FEDWAN_API spdlog::logger& log();

// `text` with every C0 control character, DEL and C1 control (U+0080..U+009F)
// written as an escape; everything else as it is.
std::string escape_log_text(std::string_view text);

// Lines the logger could not write (stderr closed, disk full), since start.
uint64_t log_write_failures();

}  // namespace fedwan

// Fixed TCP socket buffers (federation.socket_buffer_bytes): the kernel
// silently caps SO_SNDBUF / SO_RCVBUF at net.core.wmem_max / rmem_max, so a
// node says so once rather than running with a smaller window than asked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fedwan::transport {

// The warning for `requested` bytes against the kernel's caps (nullopt: a
// cap unknown), or "" when neither caps it. Pure: for tests.
std::string socket_buffer_warning(int64_t requested, std::optional<int64_t> wmem_max,
                                  std::optional<int64_t> rmem_max);

// Reads the caps from /proc/sys/net/core and logs the warning, once per
// process and requested size.
void warn_if_capped(int64_t requested);

}  // namespace fedwan::transport

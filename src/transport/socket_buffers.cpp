#include "transport/socket_buffers.hpp"

#include <fstream>
#include <mutex>
#include <set>

#include "common/log.hpp"

namespace fedwan::transport {
namespace {

std::optional<int64_t> read_proc_value(const char* path) {
  std::ifstream in(path);
  int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

}  // namespace

std::string socket_buffer_warning(int64_t requested, std::optional<int64_t> wmem_max,
                                  std::optional<int64_t> rmem_max) {
  std::string capped;
  int64_t cap = requested;
  if (wmem_max && *wmem_max < requested) {
    capped += "net.core.wmem_max " + std::to_string(*wmem_max);
    cap = std::min(cap, *wmem_max);
  }
  if (rmem_max && *rmem_max < requested) {
    capped += std::string(capped.empty() ? "" : " and ") + "net.core.rmem_max " +
              std::to_string(*rmem_max);
    cap = std::min(cap, *rmem_max);
  }
  if (capped.empty()) return "";
  const std::string n = std::to_string(requested);
  return "socket_buffer_bytes " + n + " is above " + capped +
         ": the kernel caps the TCP buffers at " + std::to_string(cap) +
         " bytes, so a link's window is smaller than asked. Raise the caps as root with "
         "`sysctl -w net.core.wmem_max=" +
         n + " net.core.rmem_max=" + n +
         "`, or set socket_buffer_bytes: 0 to let the kernel autotune (up to "
         "net.ipv4.tcp_wmem / tcp_rmem)";
}

void warn_if_capped(int64_t requested) {
  static std::mutex mu;
  static std::set<int64_t> warned;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(requested).second) return;
  }
  const std::string w =
      socket_buffer_warning(requested, read_proc_value("/proc/sys/net/core/wmem_max"),
                            read_proc_value("/proc/sys/net/core/rmem_max"));
  if (!w.empty()) log().warn("[transport] {}", w);
}

}  // namespace fedwan::transport

// A small blocking HTTP/1.1 GET over TCP (no TLS): what `fedwan status`
// and the tests use to read a node's /status and /metrics. Bounded: the
// whole exchange within `timeout`, the answer at most `max_bytes`.
// Thread safety: none needed (no shared state).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace fedwan::metrics {

struct HttpResponse {
  int status = 0;  // 0 when there was no answer (see error)
  std::string body;
  std::string error;  // why there was no answer: refused, timed out, ...
};

inline constexpr size_t kHttpGetMaxBytes = size_t{4} << 20;

// `address` is "host:port" (or "[v6]:port"). With a `bearer_token`, the
// request carries `Authorization: Bearer <token>`. Never throws.
HttpResponse http_get(const std::string& address, const std::string& path,
                      std::chrono::milliseconds timeout, size_t max_bytes = kHttpGetMaxBytes,
                      const std::string& bearer_token = {});

}  // namespace fedwan::metrics

// The channel security of a link run in plaintext (--insecure-plaintext):
// frames checked for job and sender only, and a loud warning once.
#include <mutex>
#include <utility>

#include "common/log.hpp"
#include "transport/links.hpp"

namespace fedwan::transport {

SecurityFactory plaintext_security_factory(uint64_t job_id, uint32_t self_index,
                                           LinkEventSink sink) {
  static std::once_flag warned;
  std::call_once(warned, [] {
    log().error("INSECURE: --insecure-plaintext: links are NOT authenticated or encrypted. "
                "Anyone on the network can read the model and impersonate nodes, and secure "
                "nodes will refuse this one. Use only for loopback experiments "
                "(see docs/security.md)");
  });
  return [job_id, self_index, sink = std::move(sink)](const std::string& peer) {
    return std::make_unique<PlaintextSecurity>(job_id, self_index, sink, peer);
  };
}

}  // namespace fedwan::transport

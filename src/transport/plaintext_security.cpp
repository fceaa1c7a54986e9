// The channel security of a link run in plaintext (--insecure-plaintext):
// frames checked for job and sender only, and a loud warning once; and the
// plain frames any node may still send a peer it has no session with.
#include <mutex>
#include <utility>

#include "common/log.hpp"
#include "transport/frame_peek.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan::transport {

using peek::is_sealed;
using peek::kFlagsOffset;
using peek::looks_like_frame;
using peek::type_of;

std::vector<uint8_t> plain_reject_frame(uint64_t job_id, uint32_t self_index,
                                        const std::string& reason) {
  wire::FrameHeader h;
  h.type = wire::MsgType::kReject;
  h.job_id = job_id;
  h.sender = self_index;
  const std::string text = reason.substr(0, 4000);
  return wire::encode_frame(h, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

std::vector<uint8_t> no_session_frame(uint64_t job_id, uint32_t self_index) {
  wire::FrameHeader h;
  h.type = wire::MsgType::kHandshake;
  h.flags = wire::kFlagNoSession;
  h.job_id = job_id;
  h.sender = self_index;
  return wire::encode_frame(h, nullptr, 0);
}

bool is_no_session_frame(const std::vector<uint8_t>& bytes) {
  return looks_like_frame(bytes.data(), bytes.size()) && !is_sealed(bytes.data()) &&
         type_of(bytes.data()) == wire::MsgType::kHandshake &&
         (bytes[kFlagsOffset] & wire::kFlagNoSession) != 0;
}

PlaintextSecurity::PlaintextSecurity(uint64_t job_id, uint32_t self_index, LinkEventSink sink,
                                     std::string peer)
    : job_id_(job_id), self_index_(self_index), sink_(std::move(sink)), peer_(std::move(peer)) {}

ChannelSecurity::Inbound PlaintextSecurity::receive(uint8_t* data, size_t size, size_t* frame_size,
                                                    std::string* why, SecurityReplies* out) {
  if (looks_like_frame(data, size) &&
      (type_of(data) == wire::MsgType::kHandshake || is_sealed(data))) {
    *why = "peer uses an encrypted link but this node runs with --insecure-plaintext; "
           "start every node of the federation with its credentials instead";
    if (type_of(data) == wire::MsgType::kHandshake && !is_sealed(data)) {
      out->push_back(plain_reject_frame(job_id_, self_index_, *why));
    }
    return rejected(*why, size);
  }
  *frame_size = size;
  return Inbound::kFrame;
}

ChannelSecurity::Inbound PlaintextSecurity::sealed_before_any_session(std::string reason,
                                                                      uint64_t bytes,
                                                                      std::string* why,
                                                                      SecurityReplies* out) {
  (void)out;
  // Nothing is sealed on a plaintext link: no session explains it.
  *why = std::move(reason);
  return rejected(*why, bytes);
}

ChannelSecurity::Inbound PlaintextSecurity::rejected(const std::string& why, uint64_t bytes) {
  if (sink_) {
    LinkEvent e;
    e.kind = LinkEvent::Kind::kFrameRejected;
    e.peer = peer_;
    e.reason = why;
    e.bytes = bytes;
    sink_(e);
  }
  return Inbound::kRejected;
}

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

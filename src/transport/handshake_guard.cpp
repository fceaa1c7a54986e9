#include "transport/handshake_guard.hpp"

#include <algorithm>

namespace fedwan::transport {

HandshakeGuard::HandshakeGuard(Options options) : options_(options) {
  options_.max_pending = std::max<size_t>(options_.max_pending, 1);
  options_.max_per_source = std::max<size_t>(options_.max_per_source, 1);
}

HandshakeGuard::Verdict HandshakeGuard::start(const std::string& peer, const std::string& source,
                                              Clock::time_point now) {
  finish(peer);  // its own earlier attempt does not count against it
  if (pending_.size() >= options_.max_pending) return Verdict::kTooMany;
  if (from_source(source) >= options_.max_per_source) return Verdict::kTooManyFromSource;
  ++per_source_[source];
  pending_[peer] = Entry{source, now};
  return Verdict::kAdmit;
}

void HandshakeGuard::finish(const std::string& peer) {
  auto it = pending_.find(peer);
  if (it == pending_.end()) return;
  auto src = per_source_.find(it->second.source);
  if (src != per_source_.end() && --src->second == 0) per_source_.erase(src);
  pending_.erase(it);
}

std::vector<std::string> HandshakeGuard::expire(Clock::time_point now) {
  std::vector<std::string> out;
  for (const auto& [peer, e] : pending_) {
    if (now - e.started >= options_.timeout) out.push_back(peer);
  }
  for (const std::string& peer : out) finish(peer);
  return out;
}

size_t HandshakeGuard::from_source(const std::string& source) const {
  auto it = per_source_.find(source);
  return it == per_source_.end() ? 0 : it->second;
}

const char* handshake_verdict_text(HandshakeGuard::Verdict v) {
  switch (v) {
    case HandshakeGuard::Verdict::kAdmit: return "admitted";
    case HandshakeGuard::Verdict::kTooMany: return "too many handshakes in progress";
    case HandshakeGuard::Verdict::kTooManyFromSource:
      return "too many handshakes in progress from one address";
  }
  return "?";
}

}  // namespace fedwan::transport

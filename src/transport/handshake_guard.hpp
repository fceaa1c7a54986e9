// Bounds what peers that have not authenticated yet can make a parent hold:
// TLS handshakes in progress, in all and per source address, each for at
// most a timeout. A handshake beyond a bound is not started (its ClientHello
// is dropped; the peer retries later), and one that outlives the timeout is
// dropped with its state. Pure bookkeeping: the link asks before it starts a
// handshake and tells when one ends. Not thread safe (the link's thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace fedwan::transport {

class HandshakeGuard {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    size_t max_pending = 64;
    size_t max_per_source = 8;
    std::chrono::milliseconds timeout{10000};
  };
  enum class Verdict { kAdmit, kTooMany, kTooManyFromSource };

  HandshakeGuard() : HandshakeGuard(Options{}) {}
  explicit HandshakeGuard(Options options);

  // A handshake of `peer` from `source` wants to start at `now`. A peer that
  // starts again replaces its own handshake in progress.
  Verdict start(const std::string& peer, const std::string& source, Clock::time_point now);
  // `peer`'s handshake completed or failed.
  void finish(const std::string& peer);
  bool pending(const std::string& peer) const { return pending_.count(peer) != 0; }
  // Handshakes older than the timeout at `now`: they are forgotten here and
  // returned, for the link to drop their state.
  std::vector<std::string> expire(Clock::time_point now);

  size_t pending_count() const { return pending_.size(); }
  size_t from_source(const std::string& source) const;
  const Options& options() const { return options_; }

 private:
  struct Entry {
    std::string source;
    Clock::time_point started;
  };
  Options options_;
  std::map<std::string, Entry> pending_;      // by peer
  std::map<std::string, size_t> per_source_;  // handshakes in progress
};

const char* handshake_verdict_text(HandshakeGuard::Verdict v);

}  // namespace fedwan::transport

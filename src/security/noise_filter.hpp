// A rate limit for events a peer can cause at will (refused frames, refused
// handshakes, protocol refusals): per key, the first `burst` occurrences in a
// window are written to the logs and the audit trail; the rest are counted
// and summarised once when the window ends. So a flood costs a bounded
// number of log and audit lines, and an operator still learns how big it was.
//
// Keys come from the caller (an event name and a peer, or a reason with the
// peer-chosen parts taken out: see noise_key()). At most `max_keys` are
// tracked; further keys share one overflow key, so memory stays bounded
// whatever an attacker sends. Pure: the caller passes the time. Not thread
// safe (one owner, the node's thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fedwan::security {

class NoiseFilter {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::chrono::milliseconds window{10000};
    uint32_t burst = 20;    // written per key and window
    size_t max_keys = 256;  // keys tracked at once; more share kOverflowKey
  };
  static constexpr const char* kOverflowKey = "(other)";

  NoiseFilter() : NoiseFilter(Options{}) {}
  explicit NoiseFilter(Options options);

  // One occurrence of `key` at `now` (`bytes`: its size, for the summary).
  // True when it is to be written; false when it is only counted.
  bool admit(std::string_view key, Clock::time_point now, uint64_t bytes = 0);

  struct Summary {
    std::string key;
    uint64_t suppressed = 0;  // occurrences not written
    uint64_t bytes = 0;       // their bytes
    std::chrono::milliseconds window{0};
  };
  // Summaries of the windows that ended by `now` with occurrences not
  // written (all open windows too when `all`, at shutdown); those windows
  // are reset. Keys idle for a whole window are forgotten.
  std::vector<Summary> drain(Clock::time_point now, bool all = false);

  size_t keys() const { return keys_.size(); }
  const Options& options() const { return options_; }

 private:
  struct Window {
    Clock::time_point start;
    uint32_t written = 0;
    uint64_t suppressed = 0;
    uint64_t bytes = 0;
  };
  // Appends the summaries of ended (or, with `all`, every) window to `out`
  // and forgets idle keys.
  void collect(Clock::time_point now, bool all, std::vector<Summary>* out);

  Options options_;
  std::unordered_map<std::string, Window> keys_;
  std::vector<Summary> ended_;  // closed by admit() before a drain() picked them up
};

// A key for `event` with `text` (a reason, possibly holding peer-chosen
// names and sizes): digits become '#', quoted parts become '...', and the
// rest is cut at 80 characters, so one kind of refusal is one key.
std::string noise_key(std::string_view event, std::string_view text);

}  // namespace fedwan::security

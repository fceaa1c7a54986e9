// fedwan-linkemu: a userspace WAN link emulator. Every emulated host is a
// network namespace with one TUN device; the emulator reads each IP packet
// a host sends, finds the link between that host and the packet's
// destination, and writes the packet into the destination's TUN device when
// the link's LinkDirection says it arrives (or never, when it is lost). The
// hosts' kernels run real TCP over it: congestion control, the
// bandwidth-delay product and loss recovery are what is measured.
//
// One thread: an epoll loop over the TUN descriptors, a timerfd for the
// next delivery and a signalfd (SIGTERM/SIGINT stop, SIGUSR1 writes the
// statistics now).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "link_shaper.hpp"
#include "packet_stats.hpp"

namespace fedwan::linkemu {

struct HostConfig {
  std::string name;
  std::string netns;
  std::string address;  // dotted IPv4, inside prefix_len of the others
};

struct LinkConfig {
  std::string a, b;  // host names
  LinkProfile a_to_b, b_to_a;
};

// Traffic between two hosts without a link of their own crosses the links
// from -> via[0] -> ... -> via[n-1] -> to, each shaping it as it shapes its
// own (rate and queue shared), and the reverse direction the same hops
// backwards: a site behind its region's uplink, whatever it talks to.
struct PathConfig {
  std::string from, to;
  std::vector<std::string> via;  // at least one host
};

struct EmulatorConfig {
  std::vector<HostConfig> hosts;
  std::vector<LinkConfig> links;
  std::vector<PathConfig> paths;
  int prefix_len = 16;
  int mtu = 1500;
  uint64_t seed = 1;
};

// Reads a profile from JSON: rate_mbit, delay_ms, jitter_ms, loss_percent,
// duplicate_percent, reorder_percent, queue_kb (every key optional; unknown
// keys are an error). Throws std::invalid_argument naming the bad key.
LinkProfile profile_from_json(const nlohmann::json& j);
nlohmann::json profile_to_json(const LinkProfile& p);

// The configuration file (docs/benchmarks.md, "Link emulator"):
//   {"hosts": [{"name", "netns", "address"}...],
//    "links": [{"a", "b", "profile": {...}, "a_to_b": {...}, "b_to_a": {...}}...],
//    "paths": [{"from", "to", "via": [host...]}...],
//    "prefix_len": 16, "mtu": 1500, "seed": 1}
// `profile` sets both directions; `a_to_b`/`b_to_a` override keys of it.
// Throws std::invalid_argument: an unknown host, a repeated link, path or
// address, a bad profile, a path over a missing link or between linked hosts.
EmulatorConfig config_from_json(const nlohmann::json& j);

class Emulator {
 public:
  // Creates the TUN devices (root needed). Throws std::runtime_error.
  explicit Emulator(const EmulatorConfig& config);
  ~Emulator();
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  // Forwards packets until SIGTERM or SIGINT (blocked in the calling thread
  // and taken through a signalfd). On SIGUSR1, and before returning, writes
  // stats() to `stats_path` (when not empty), atomically.
  void run(const std::string& stats_path);

  // Per link and direction: the profile and the counters so far.
  nlohmann::json stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedwan::linkemu

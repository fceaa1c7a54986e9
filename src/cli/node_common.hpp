// What `fedwan aggregator` and `fedwan site` share: their flags, the signal
// handling that stops a node cleanly, and the small steps around a run
// (waiting for a launcher's go, lingering for a last scrape, alarms).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "fedwan/security.hpp"

namespace fedwan {
class Aggregator;
class SiteCore;
}  // namespace fedwan

namespace fedwan::cli {

// SIGTERM/SIGINT: an aggregator stops at once (its last round boundary is
// checkpointed); a site finishes its current step or sync, checkpoints and
// exits. Both exit 0. Only lock-free atomics are touched in the handler.
void install_signal_handlers();
bool terminate_requested();

// While alive, a signal stops this aggregator (also one that came before).
class AggregatorRegistration {
 public:
  explicit AggregatorRegistration(Aggregator& a);
  ~AggregatorRegistration();
  AggregatorRegistration(const AggregatorRegistration&) = delete;
  AggregatorRegistration& operator=(const AggregatorRegistration&) = delete;
};

// While alive, a signal stops this site's core (null: a rank that is not
// the leader; nothing to stop). A site blocked in join() or sync() (its
// parent gone, say) would otherwise notice the signal only at its round
// timeout.
class SiteCoreRegistration {
 public:
  explicit SiteCoreRegistration(SiteCore* c);
  ~SiteCoreRegistration();
  SiteCoreRegistration(const SiteCoreRegistration&) = delete;
  SiteCoreRegistration& operator=(const SiteCoreRegistration&) = delete;
};

// Logs a site stopped by a signal; its exit code (0).
int stopped_by_signal(const std::string& node, uint64_t round, bool checkpointed);

void add_node_flags(CLI::App& cmd, NodeArgs& a);
// A finished node keeps its metrics endpoint up for --metrics-linger (a
// signal cuts it short).
void linger_for_metrics(const NodeArgs& a);
// --join-after-file: waits for the launcher's go. False when a signal
// ended the wait (the site never joined: it exits like a stopped one).
bool wait_for_go(const NodeArgs& a);
// --costs, else <checkpoint-dir>/costs.jsonl, else none.
std::string costs_path(const NodeArgs& a);
SecurityOptions security_options(const SecurityArgs& s);
std::string human_bytes(uint64_t b);
// What the node rode out that an operator must act on (docs/operations.md).
void print_alarms(const std::string& who, const std::vector<std::string>& alarms);

// A node frees and allocates chunk-sized buffers (received frames, the
// rule's sums) all round; glibc by default hands the top of its heap back
// to the kernel whenever over 128 KiB of it is free, so the next round's
// buffers fault their pages in again, zeroed and charged to the cgroup: at
// 100M parameters 40% of the root's system time. The node programs keep
// up to eight chunks (fp32) of freed heap for reuse instead, 8 MiB at
// least (more saves a little more time and costs peak RSS), and take
// anything of two chunks or more, 2 MiB at least (a model's arrays),
// straight from the kernel, which gets it back at once. Called with the
// default chunk when a program starts and again with the topology's once
// a node has read it: a frame of a larger chunk above a fixed threshold
// would be mapped and faulted in afresh, every byte received.
// When GLIBC_TUNABLES is set, it decides instead.
void keep_freed_memory_for_reuse(uint64_t chunk_bytes = uint64_t{1} << 20);

// Parses argv with `app`, whose callbacks run the command, and turns what
// goes wrong into a line on stderr led by `program` and the exit code: 2
// for a configuration error, 1 for any other; else `exit_code`, as the
// command left it. Calls keep_freed_memory_for_reuse first.
int parse_and_run(CLI::App& app, int argc, const char* const* argv, const std::string& program,
                  const int& exit_code);

}  // namespace fedwan::cli

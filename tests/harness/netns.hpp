// Network namespaces for chaos tests: probes for what this process may do
// (create a namespace and a veth pair; attach netem), and VethPartition, a
// namespace joined to the host by a veth pair whose link a test can cut and
// heal to partition whatever runs inside from whatever runs outside.
//
// Everything runs `ip` (iproute2) and `tc` as child processes through
// posix_spawn (no shell, no quoting); their output is kept for error
// messages. Root is needed; tests GTEST_SKIP() when netns_available() is
// false, with netns_unavailable_reason() as the reason.
//
// Names: namespace "fw-<8 hex>", devices "fw{h,n,b,c}<8 hex>" (at most 15
// characters, the kernel's limit), the hex drawn at random per object, so
// parallel tests (separate processes) do not clash; a clash on the namespace
// name is retried. Addresses: 10.X.Y.1/30 on the host side, 10.X.Y.2/30 in
// the namespace, X in [200, 254], chosen so no address or route on the host
// already uses 10.X.Y.
//
// A test killed with SIGKILL leaves its namespace behind (`ip netns list`,
// then `ip netns del fw-...`): no destructor runs.
//
// Thread safety: the probes may be called from any thread (cached after the
// first call). A VethPartition belongs to one thread at a time.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace fedwan::testing {

namespace netns_detail {

// The path of iproute2's `ip`, or "" when it is not installed.
const std::string& ip_tool();

// Runs argv[0] (an absolute path) with stdin from /dev/null and stdout and
// stderr captured into *output. Returns the exit status, 128 + signal when
// killed, or -1 when it could not start. Blocks at most `timeout`, then
// kills the child.
int run(const std::vector<std::string>& argv, std::string* output = nullptr,
        std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace netns_detail

// Whether this process can create a network namespace and a veth pair (tried
// once, cleaned up, cached).
bool netns_available();
std::string netns_unavailable_reason();

// Whether a netem qdisc can be attached (tried once in a throwaway namespace).
bool netem_available();
std::string netem_unavailable_reason();

// A network namespace joined to the host by a veth pair; cut() and heal()
// partition it. Processes started with run_in_namespace() see the host at
// host_address(); processes on the host see them at namespace_address().
//
// cut() takes the namespace end of the veth down. That is a silent
// partition both ways, like a dead WAN link: the host still routes to
// 10.X.Y.2 through its (carrier-less) veth end, which drops the packets; in
// the namespace a fallback route sends 10.X.Y.0/30 into a second,
// carrier-less veth that drops them too. Open TCP connections retransmit
// and new connects hang, in both directions, until heal() or their own
// timeouts. (Taking the *host* end down instead would withdraw the host's
// route, and packets to 10.X.Y.2 would leave through the default route:
// not a partition.)
class VethPartition {
 public:
  // Creates the namespace, the veth pairs and the addresses. Throws
  // std::runtime_error naming the failing command (and cleans up).
  VethPartition();

  // Deletes the veth pairs and the namespace. Processes still running inside
  // keep the namespace alive until they exit: stop them first.
  ~VethPartition() { cleanup(); }
  VethPartition(const VethPartition&) = delete;
  VethPartition& operator=(const VethPartition&) = delete;

  const std::string& name() const { return name_; }
  const std::string& host_address() const { return host_address_; }     // 10.X.Y.1
  const std::string& namespace_address() const { return ns_address_; }  // 10.X.Y.2
  const std::string& host_device() const { return host_dev_; }
  const std::string& namespace_device() const { return ns_dev_; }

  // {"/usr/sbin/ip", "netns", "exec", name()}: put it before an argv to run
  // that program inside. `ip netns exec` execs the program (no fork), so the
  // pid a spawn returns is the program's own and signals reach it.
  std::vector<std::string> exec_prefix() const {
    return {netns_detail::ip_tool(), "netns", "exec", name_};
  }
  // exec_prefix() + argv: spawn argv[0] of the result with the rest as
  // arguments, e.g. with process.hpp's spawn_process(v[0], {v.begin() + 1,
  // v.end()}, log). argv[0] should be an absolute path.
  std::vector<std::string> run_in_namespace(const std::vector<std::string>& argv) const {
    std::vector<std::string> out = exec_prefix();
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  // Runs a short command inside and waits for it; returns its exit status.
  int exec(const std::vector<std::string>& argv, std::string* output = nullptr) const {
    return netns_detail::run(run_in_namespace(argv), output);
  }

  // Partitions the namespace from the host (see the class comment). Throws
  // std::runtime_error when `ip` fails. Idempotent.
  void cut();
  // Reconnects; open TCP connections that have not given up resume.
  void heal();
  bool is_cut() const { return cut_; }

 private:
  // `ip args...`; throws std::runtime_error with the command and its output.
  static void ip(std::vector<std::string> args);
  // A 10.X.Y.0/30 that no host address or route mentions.
  void pick_subnet();
  void cleanup();

  std::string tag_;
  std::string name_;
  std::string host_dev_;
  std::string ns_dev_;
  std::string subnet_;
  std::string host_address_;
  std::string ns_address_;
  bool cut_ = false;
};

}  // namespace fedwan::testing

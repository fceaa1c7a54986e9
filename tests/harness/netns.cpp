#include "harness/netns.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <utility>

extern char** environ;

namespace fedwan::testing {

namespace netns_detail {

// The first executable among the usual places, or "".
std::string find_tool(const char* name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/", "/usr/local/sbin/"}) {
    std::string p = std::string(dir) + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

const std::string& ip_tool() {
  static const std::string path = find_tool("ip");
  return path;
}

int run(const std::vector<std::string>& argv, std::string* output,
        std::chrono::milliseconds timeout) {
  if (output) output->clear();
  if (argv.empty() || argv[0].empty()) return -1;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&fa, p[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&fa, p[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  if (rc != 0) {
    ::close(p[0]);
    if (output) *output = "cannot start " + argv[0];
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd pfd{p[0], POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    if (pfd.revents == 0) continue;
    const ssize_t n = ::read(p[0], buf, sizeof buf);
    if (n > 0) {
      // Bounded: these tools print a few lines, but a runaway one must not grow memory.
      if (output && output->size() < 65536) output->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EOF: every writer has exited or closed it
  }
  ::close(p[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

// `ip args...`; throws std::runtime_error with the command and its output
// when it fails.
void ip_or_throw(std::vector<std::string> args) {
  args.insert(args.begin(), ip_tool());
  std::string out;
  if (run(args, &out) != 0) {
    std::string cmd;
    for (const std::string& a : args) cmd += (cmd.empty() ? "" : " ") + a;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    throw std::runtime_error("'" + cmd + "' failed: " + (out.empty() ? "no output" : out));
  }
}

// 8 hex digits, different across processes and calls.
std::string random_tag() {
  static std::atomic<uint32_t> counter{0};
  std::random_device rd;
  std::seed_seq s{
      rd(), rd(), static_cast<uint32_t>(::getpid()), counter.fetch_add(1),
      static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::mt19937 g(s);
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(g()));
  return buf;
}

struct Probe {
  bool ok = false;
  std::string why;  // when !ok
};

Probe probe_netns() {
  if (::geteuid() != 0)
    return {false, "not running as root (network namespaces need CAP_NET_ADMIN)"};
  if (ip_tool().empty()) return {false, "the 'ip' tool (iproute2) is not installed"};
  const std::string tag = random_tag();
  const std::string ns = "fw-" + tag;
  const std::string host_dev = "fwh" + tag;
  Probe p{true, {}};
  try {
    ip_or_throw({"netns", "add", ns});
    try {
      ip_or_throw(
          {"link", "add", host_dev, "type", "veth", "peer", "name", "fwn" + tag, "netns", ns});
      run({ip_tool(), "link", "del", host_dev});
    } catch (const std::exception& e) {
      p = {false, e.what()};
    }
    run({ip_tool(), "netns", "del", ns});
  } catch (const std::exception& e) {
    p = {false, e.what()};
  }
  return p;
}

Probe probe_netem(const Probe& netns) {
  if (!netns.ok) return {false, "no network namespaces: " + netns.why};
  const std::string tc = find_tool("tc");
  if (tc.empty()) return {false, "the 'tc' tool (iproute2) is not installed"};
  const std::string ns = "fw-" + random_tag();
  Probe p{true, {}};
  try {
    ip_or_throw({"netns", "add", ns});
    try {
      ip_or_throw({"-n", ns, "link", "set", "lo", "up"});
      ip_or_throw(
          {"netns", "exec", ns, tc, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"});
    } catch (const std::exception& e) {
      p = {false, e.what()};
    }
    run({ip_tool(), "netns", "del", ns});
  } catch (const std::exception& e) {
    p = {false, e.what()};
  }
  return p;
}

const Probe& netns_probe() {
  static const Probe p = probe_netns();
  return p;
}

const Probe& netem_probe() {
  static const Probe p = probe_netem(netns_probe());
  return p;
}

}  // namespace netns_detail

bool netns_available() { return netns_detail::netns_probe().ok; }
std::string netns_unavailable_reason() { return netns_detail::netns_probe().why; }

bool netem_available() { return netns_detail::netem_probe().ok; }
std::string netem_unavailable_reason() { return netns_detail::netem_probe().why; }

VethPartition::VethPartition() {
  if (!netns_available()) {
    throw std::runtime_error("VethPartition: network namespaces are not available: " +
                             netns_unavailable_reason());
  }
  for (int attempt = 0;; ++attempt) {
    tag_ = netns_detail::random_tag();
    name_ = "fw-" + tag_;
    try {
      netns_detail::ip_or_throw({"netns", "add", name_});
      break;
    } catch (const std::exception&) {
      if (attempt == 4) throw;  // not a name clash, or very unlucky
    }
  }
  host_dev_ = "fwh" + tag_;
  ns_dev_ = "fwn" + tag_;
  try {
    pick_subnet();
    const std::string black = "fwb" + tag_;
    ip({"link", "add", host_dev_, "type", "veth", "peer", "name", ns_dev_, "netns", name_});
    ip({"addr", "add", host_address_ + "/30", "dev", host_dev_});
    ip({"link", "set", host_dev_, "up"});
    ip({"-n", name_, "link", "set", "lo", "up"});
    ip({"-n", name_, "addr", "add", ns_address_ + "/30", "dev", ns_dev_});
    ip({"-n", name_, "link", "set", ns_dev_, "up"});
    ip({"-n", name_, "link", "add", black, "type", "veth", "peer", "name", "fwc" + tag_});
    ip({"-n", name_, "link", "set", black, "up"});
    ip({"-n", name_, "route", "add", subnet_ + "/30", "dev", black, "metric", "4000"});
  } catch (...) {
    cleanup();
    throw;
  }
}

void VethPartition::ip(std::vector<std::string> args) {
  netns_detail::ip_or_throw(std::move(args));
}

void VethPartition::cut() {
  ip({"-n", name_, "link", "set", ns_dev_, "down"});
  cut_ = true;
}

void VethPartition::heal() {
  ip({"-n", name_, "link", "set", ns_dev_, "up"});
  cut_ = false;
}

void VethPartition::pick_subnet() {
  std::string used;
  std::string out;
  netns_detail::run({netns_detail::ip_tool(), "-4", "-o", "addr", "show"}, &used);
  netns_detail::run({netns_detail::ip_tool(), "-4", "route", "show", "table", "all"}, &out);
  used += out;
  std::mt19937 g(static_cast<uint32_t>(std::stoul(tag_, nullptr, 16)));
  for (int i = 0; i < 64; ++i) {
    const uint32_t x = 200 + static_cast<uint32_t>(g() % 55);
    const uint32_t y = static_cast<uint32_t>(g() % 256);
    const std::string prefix = "10." + std::to_string(x) + "." + std::to_string(y) + ".";
    if (used.find(prefix) != std::string::npos) continue;
    subnet_ = prefix + "0";
    host_address_ = prefix + "1";
    ns_address_ = prefix + "2";
    return;
  }
  throw std::runtime_error("VethPartition: no free 10.X.Y.0/30 subnet found");
}

void VethPartition::cleanup() {
  if (name_.empty()) return;
  // Deleting one end deletes the pair; deleting the namespace deletes the
  // devices inside it. Best effort: a destructor cannot report failures.
  netns_detail::run({netns_detail::ip_tool(), "link", "del", host_dev_});
  netns_detail::run({netns_detail::ip_tool(), "netns", "del", name_});
  name_.clear();
}

}  // namespace fedwan::testing

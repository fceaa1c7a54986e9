#include "cli/demo_supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "fedwan/error.hpp"

namespace fedwan::cli {
namespace {

namespace fs = std::filesystem;

// Starts `exe args...` with `env` added; stdout is inherited, stderr goes to
// `log` (appended on a restart, so the log keeps the whole story).
pid_t spawn(const std::string& exe, const std::vector<std::string>& args, const std::string& log,
            const std::map<std::string, std::string>& env, bool append) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  // Closed by the exec: the demo waits for it, so that nothing it samples
  // of the process (its memory) is of its copy of the demo before.
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) throw Error("demo: pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    throw Error("demo: fork failed");
  }
  if (pid == 0) {
    ::close(exec_pipe[0]);
    // A node never outlives the demo, however the demo ends (SIGKILL too):
    // it is told to stop the way an operator would stop it.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    if (!log.empty()) {
      FILE* f = std::fopen(log.c_str(), append ? "a" : "w");
      if (f) ::dup2(fileno(f), STDERR_FILENO);
    }
    ::execv(exe.c_str(), argv.data());
    std::perror("fedwan demo: exec");
    ::_exit(127);  // closes the pipe too; the exit status tells the failure
  }
  ::close(exec_pipe[1]);
  char byte = 0;
  while (::read(exec_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  ::close(exec_pipe[0]);
  return pid;
}

// The values of `keys` (KiB) in a /proc status file, in the order asked;
// a key not there (the process gone, or a zombie without memory) is none.
std::vector<std::optional<uint64_t>> status_kib(const std::string& path,
                                                const std::vector<std::string>& keys) {
  std::vector<std::optional<uint64_t>> out(keys.size());
  std::ifstream status(path);
  std::string key;
  while (status >> key) {
    for (size_t i = 0; i < keys.size(); ++i) {
      uint64_t kib = 0;
      if (key == keys[i] && status >> kib) out[i] = kib;
    }
    status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return out;
}

std::optional<uint64_t> one_status_kib(const std::string& path, const std::string& key) {
  return status_kib(path, std::vector<std::string>{key})[0];
}

std::string describe(int status) {
  return WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                           : "signal " + std::to_string(WTERMSIG(status));
}

// The audit log's entries of `event`, in order (a log that cannot be read:
// none).
std::vector<nlohmann::json> audit_entries(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (e.is_object() && e.contains("event") && e.contains("fields")) out.push_back(e);
  }
  return out;
}

}  // namespace

std::optional<ChaosPlan> parse_chaos(const std::string& spec, const Topology& topo,
                                     uint64_t rounds) {
  if (spec.empty()) return std::nullopt;
  const std::string form =
      "--chaos " + spec + ": expected NODE@ROUND or NODE@ROUND:disk, e.g. site-0@3";
  ChaosPlan plan;
  std::string body = spec;
  if (const size_t colon = body.rfind(':'); colon != std::string::npos) {
    if (body.substr(colon + 1) != "disk") throw ConfigError(form);
    plan.disk = true;
    body.resize(colon);
  }
  const size_t at = body.rfind('@');
  if (at == std::string::npos || at == 0 || at + 1 == body.size()) throw ConfigError(form);
  plan.node = body.substr(0, at);
  const std::string round = body.substr(at + 1);
  if (round.find_first_not_of("0123456789") != std::string::npos || round.size() > 9) {
    throw ConfigError(form);
  }
  plan.round = std::stoull(round);
  const NodeSpec* n = topo.find(plan.node);
  if (n == nullptr) {
    std::string ids;
    for (const NodeSpec& x : topo.nodes()) {
      if (x.role != Role::kRoot) ids += (ids.empty() ? "" : ", ") + x.id;
    }
    throw ConfigError("--chaos " + spec + ": no node '" + plan.node + "' in this federation (" +
                      ids + ")");
  }
  if (n->role == Role::kRoot) {
    throw ConfigError("--chaos " + spec +
                      ": the root is not killed by the demo (its recovery is a standby root, "
                      "docs/operations.md); name a site or a region");
  }
  if (plan.round < 1 || plan.round > rounds) {
    throw ConfigError("--chaos " + spec + ": round " + round + " is not one of the rounds 1.." +
                      std::to_string(rounds));
  }
  plan.crash_point =
      std::string(n->role == Role::kSite ? "site.mid_upload" : "aggregator.round_closed") + "@" +
      std::to_string(plan.round);
  return plan;
}

std::optional<SiteRound> parse_site_round(const std::string& flag, const std::string& spec,
                                          int sites, uint64_t first, uint64_t rounds) {
  if (spec.empty()) return std::nullopt;
  const std::string form = flag + " " + spec + ": expected SITE@ROUND, e.g. site-1@" +
                           std::to_string(std::max<uint64_t>(first, std::min<uint64_t>(5, rounds)));
  const size_t at = spec.rfind('@');
  if (at == std::string::npos || at == 0 || at + 1 == spec.size()) throw ConfigError(form);
  SiteRound out;
  out.site = spec.substr(0, at);
  const std::string round = spec.substr(at + 1);
  if (round.find_first_not_of("0123456789") != std::string::npos || round.size() > 9) {
    throw ConfigError(form);
  }
  out.round = std::stoull(round);
  bool known = false;
  for (int s = 0; s < sites; ++s) known = known || out.site == "site-" + std::to_string(s);
  if (!known) {
    throw ConfigError(flag + " " + spec + ": no site '" + out.site +
                      "' in this demo (site-0 .. site-" + std::to_string(sites - 1) + ")");
  }
  if (out.round < first || out.round > rounds) {
    throw ConfigError(flag + " " + spec + ": round " + round + " is not one of the rounds " +
                      std::to_string(first) + ".." + std::to_string(rounds));
  }
  return out;
}

std::string tail_of(const std::string& path, size_t max_bytes) {
  std::ifstream f(path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s.size() > max_bytes ? "..." + s.substr(s.size() - max_bytes) : s;
}

DemoSupervisor::~DemoSupervisor() {
  stop_all(SIGTERM);
  for (Process& p : procs_) {
    if (p.pid > 0) (void)reap(p.pid, nullptr, 0);
  }
}

void DemoSupervisor::start(NodeLaunch node) {
  Node n;
  n.launch = std::move(node);
  n.released = n.launch.start_after_rounds == 0;
  nodes_.push_back(std::move(n));
  spawn_node(nodes_.size() - 1, true);
}

void DemoSupervisor::spawn_node(size_t index, bool first) {
  const NodeLaunch& n = nodes_[index].launch;
  if (!first && !n.rendezvous_dir.empty()) {
    // The ranks meet again; addresses the dead ones left would be taken
    // for live ranks.
    std::error_code ec;
    fs::remove_all(n.rendezvous_dir, ec);
  }
  if (!first && !n.lose_before_restart.empty() && nodes_[index].restarts == 1) {
    std::error_code ec;
    fs::remove_all(n.lose_before_restart, ec);
    std::cerr << "fedwan demo: deleted '" << n.node << "''s checkpoint directory "
              << n.lose_before_restart << " (its disk lost): it recovers from its parent's replica"
              << std::endl;
  }
  static const std::map<std::string, std::string> kNone;
  for (size_t r = 0; r < n.rank_args.size(); ++r) {
    Process p;
    p.node = index;
    p.rank = r;
    p.fork_rss_kib = one_status_kib("/proc/self/status", "VmRSS:").value_or(0);
    p.pid = spawn(n.exe.empty() ? exe_ : n.exe, n.rank_args[r], n.rank_logs[r],
                  first ? n.first_env : kNone, !first);
    procs_.push_back(p);
  }
}

void DemoSupervisor::release_due() {
  for (Node& n : nodes_) {
    if (n.released) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now < n.next_check) continue;
    n.next_check = now + std::chrono::milliseconds(250);
    uint64_t closed = 0;
    for (const nlohmann::json& e : audit_entries(n.launch.watch_audit)) {
      closed += e.value("event", "") == "round_closed" ? 1 : 0;
    }
    if (closed < n.launch.start_after_rounds) continue;
    const bool added = !n.launch.publish_from.empty();
    if (added && !n.published) {
      n.published = true;
      write_file_atomic(n.launch.publish_to, read_file(n.launch.publish_from), 0644);
      std::cout << "fedwan demo: topology version 2 (signed by the admin) adds '" << n.launch.node
                << "' in round " << closed + 1 << std::endl;
    }
    if (added) {
      bool adopted = false;
      for (const nlohmann::json& e : audit_entries(n.launch.adopted_audit)) {
        adopted = adopted || e.value("event", "") == "topology_adopted";
      }
      if (!adopted) continue;
    }
    std::cout << "fedwan demo: '" << n.launch.node << "' joins in round " << closed + 1
              << (added ? " (added by the new topology version)" : " (late join)") << std::endl;
    n.released = true;
    std::ofstream(n.launch.go_file) << "go\n";
  }
}

void DemoSupervisor::stop_all(int sig) {
  for (Process& p : procs_) {
    if (p.pid > 0) ::kill(p.pid, sig);
  }
}

void DemoSupervisor::kill_node(size_t index) {
  for (Process& p : procs_) {
    if (p.node != index || p.pid <= 0) continue;
    ::kill(p.pid, SIGKILL);
    (void)reap(p.pid, nullptr, 0);
    p.pid = -1;
  }
}

bool DemoSupervisor::run(const std::atomic<bool>& stop) {
  bool ok = true;
  bool stopping = false;
  for (;;) {
    if (stop.load() && !stopping) {
      stopping = true;
      stop_all(SIGTERM);
    }
    int status = 0;
    // Polled, so a signal that lands between the check above and the wait
    // is still seen within 50 ms.
    if (!stopping) release_due();
    const pid_t pid = reap(-1, &status, WNOHANG);
    if (pid == 0) {
      sample_memory();
      ::usleep(50 * 1000);
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      return ok;  // ECHILD: none left
    }
    Process* proc = nullptr;
    for (Process& p : procs_) {
      if (p.pid == pid) proc = &p;
    }
    if (proc == nullptr) continue;
    proc->pid = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    Node& node = nodes_[proc->node];
    const std::string& name = node.launch.node;
    const std::string& log = node.launch.rank_logs[proc->rank];
    if (stopping) continue;  // stopped on purpose, or dying with the others
    if (node.restarts < max_restarts_) {
      node.restarts += 1;
      Restart r;
      r.node = name;
      r.cause = describe(status);
      r.number = node.restarts;
      r.at_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      restarts_.push_back(r);
      std::cerr << "fedwan demo: node '" << name << "' died (" << r.cause << "); restarting it "
                << "from its checkpoint (" << node.restarts << " of " << max_restarts_ << ")"
                << std::endl;
      kill_node(proc->node);  // its other ranks: the site starts again as one
      spawn_node(proc->node, false);
      continue;
    }
    ok = false;
    stopping = true;
    std::cerr << "fedwan demo: node '" << name << "' failed (" << describe(status) << ")"
              << (max_restarts_ > 0 ? " after " + std::to_string(node.restarts) + " restarts"
                                    : std::string())
              << "; its log " << log << " ends with:\n"
              << tail_of(log) << "\n";
    stop_all(SIGTERM);
  }
}

pid_t DemoSupervisor::reap(pid_t pid, int* status, int options) {
  struct rusage usage {};
  const pid_t got = ::wait4(pid, status, options, &usage);
  if (got <= 0) return got;
  for (const Process& p : procs_) {
    if (p.pid != got) continue;
    const std::string& node = nodes_[p.node].launch.node;
    uint64_t& peak = peak_rss_kib_[node];
    const auto kernel = static_cast<uint64_t>(usage.ru_maxrss);  // KiB on Linux
    // No larger than the demo's copy it held before exec: that copy's,
    // perhaps; its own peak as sampled is the node's.
    const bool fork_copy = kernel <= p.fork_rss_kib && p.hwm_kib > 0;
    peak = std::max(peak, fork_copy ? p.hwm_kib : kernel);
    const auto seconds = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
    };
    auto& [user, system] = cpu_seconds_[node];
    user += seconds(usage.ru_utime);
    system += seconds(usage.ru_stime);
    minor_faults_[node] += static_cast<uint64_t>(usage.ru_minflt);
  }
  return got;
}

void DemoSupervisor::sample_memory() {
  const auto now = std::chrono::steady_clock::now();
  if (now - sampled_at_ < std::chrono::milliseconds(250)) return;
  sampled_at_ = now;
  for (Process& p : procs_) {
    if (p.pid <= 0) continue;
    const auto kib = status_kib("/proc/" + std::to_string(p.pid) + "/status",
                                std::vector<std::string>{"RssAnon:", "VmHWM:"});
    if (kib[0]) {
      uint64_t& peak = peak_anon_kib_[nodes_[p.node].launch.node];
      peak = std::max(peak, *kib[0]);
    }
    // Sampled after the exec (spawn waits for it): the node's own.
    if (kib[1]) p.hwm_kib = std::max(p.hwm_kib, *kib[1]);
  }
}

void DemoSupervisor::account() {
  std::map<std::string, std::vector<Restart*>> by_node;
  for (Restart& r : restarts_) by_node[r.node].push_back(&r);
  for (auto& [node, list] : by_node) {
    const Node* n = nullptr;
    for (const Node& x : nodes_) {
      if (x.launch.node == node) n = &x;
    }
    if (n == nullptr || n->launch.audit_log.empty()) continue;
    // Each start of the node opens its audit log (or takes up an earlier
    // run's): one life each. This run's are the last restarts + 1.
    struct Life {
      std::optional<uint64_t> last_round;  // the latest round it worked on
      std::optional<uint64_t> resumed;
    };
    std::vector<Life> lives;
    for (const nlohmann::json& e : audit_entries(n->launch.audit_log)) {
      const std::string event = e["event"].get<std::string>();
      const nlohmann::json& f = e["fields"];
      if (event == "audit_opened" || event == "audit_resumed") {
        lives.emplace_back();
        continue;
      }
      if (lives.empty() || !f.is_object() || !f.contains("round") ||
          !f["round"].is_number_unsigned()) {
        continue;
      }
      // A checkpoint is taken as a round starts; a site sends its update
      // in the round, an aggregator takes its children's and closes it.
      const uint64_t round = f["round"].get<uint64_t>();
      if (event == "checkpoint" || event == "update_sent" || event == "round_closed" ||
          (event == "update" && f.value("decision", "") == "accepted")) {
        Life& life = lives.back();
        life.last_round = std::max(life.last_round.value_or(0), round);
      }
      if (event == "resumed") lives.back().resumed = round;
    }
    if (lives.size() < list.size() + 1) continue;
    const size_t first = lives.size() - (list.size() + 1);
    for (size_t i = 0; i < list.size(); ++i) {
      const Life& died = lives[first + i];
      list[i]->died_in_round = died.last_round ? died.last_round : died.resumed;
      list[i]->resumed_round = lives[first + i + 1].resumed;
    }
  }
}

}  // namespace fedwan::cli

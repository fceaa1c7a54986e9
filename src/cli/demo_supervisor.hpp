// The demo's process supervisor: one process per node (one per rank of a
// multi-rank site), restarted when it dies, like torchrun --max-restarts.
// A node whose process fails (a non-zero exit, a signal) is started again,
// all its ranks together, from its checkpoint directory, up to
// `max_restarts` times per node; past that, or when the demo is asked to
// stop, every node is stopped (SIGTERM: each checkpoints and exits) and
// waited for, none left behind. Each restart is recorded with what it cost.
//
// Not thread safe: the demo's main thread owns it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/topology.hpp"

namespace fedwan::cli {

// `fedwan demo --chaos NODE@ROUND`: NODE (a site or a region) kills itself
// with SIGKILL in round ROUND (1-based, as the demo prints rounds) of its
// first life, through a crash point: a site after the first chunk of its
// update of that round went up, a region as it closes that round.
// NODE@ROUND:disk also deletes its checkpoint directory before it is started
// again (its disk lost): it recovers from its parent's replica.
struct ChaosPlan {
  std::string node;
  uint64_t round = 0;
  std::string crash_point;  // FEDWAN_CRASH_POINT's value
  bool disk = false;        // its checkpoint directory goes too
};
// nullopt for ""; throws ConfigError naming what is wrong.
std::optional<ChaosPlan> parse_chaos(const std::string& spec, const Topology& topo,
                                     uint64_t rounds);

// `fedwan demo --late SITE@ROUND` / `--leave SITE@ROUND`: a site of the
// demo (site-0 .. site-<sites-1>) and a 1-based round in first..rounds.
// nullopt for ""; throws ConfigError naming what is wrong.
struct SiteRound {
  std::string site;
  uint64_t round = 0;
};
std::optional<SiteRound> parse_site_round(const std::string& flag, const std::string& spec,
                                          int sites, uint64_t first, uint64_t rounds);

// A node as the supervisor starts it: its processes' arguments (one per
// rank) and logs, what to clear before a restart, and where its audit log
// says where it resumed.
struct NodeLaunch {
  std::string node;
  std::string exe;  // the program its ranks run; "": the supervisor's own
  std::vector<std::vector<std::string>> rank_args;
  std::vector<std::string> rank_logs;
  // Environment of the first start only (a chaos crash point).
  std::map<std::string, std::string> first_env;
  std::string rendezvous_dir;       // removed before a restart ("" for none)
  std::string lose_before_restart;  // removed before its first restart (--chaos ...:disk)
  std::string audit_log;            // rank 0's
  // > 0: the node's processes start at once but join only once
  // `watch_audit` (the root's audit log) records this many closed rounds:
  // the supervisor then creates `go_file`, which they wait for
  // (`fedwan demo --late`; `fedwan site --join-after-file`).
  uint64_t start_after_rounds = 0;
  std::string watch_audit;
  std::string go_file;
  // A site added by a topology version (`fedwan demo --add-site`): once due,
  // `publish_from` (the signed version) is copied over `publish_to` (the
  // aggregators' topology file), and the go file waits until
  // `adopted_audit` (its parent's audit log) records topology_adopted.
  std::string publish_from, publish_to, adopted_audit;
};

struct Restart {
  std::string node;
  std::string cause;  // "signal 9", "exit 1"
  double at_s = 0;    // seconds into the federation
  int number = 0;     // 1 for the node's first restart
  // The round the node was in when it died (its audit log's last update or
  // closed round, + 1), and the round it resumed at; the difference is what
  // the restart cost it.
  std::optional<uint64_t> died_in_round;
  std::optional<uint64_t> resumed_round;
};

class DemoSupervisor {
 public:
  DemoSupervisor(std::string exe, int max_restarts)
      : exe_(std::move(exe)), max_restarts_(max_restarts) {}
  // Stops (SIGTERM) and reaps whatever still runs.
  ~DemoSupervisor();
  DemoSupervisor(const DemoSupervisor&) = delete;
  DemoSupervisor& operator=(const DemoSupervisor&) = delete;

  // Starts the node's processes.
  void start(NodeLaunch node);
  // Waits for every process, restarting failed nodes; true when every node
  // finished with exit 0 (false on a node that failed past its restarts,
  // after all were stopped). `stop` set: every node is stopped, none
  // restarted, and run returns once all are gone.
  bool run(const std::atomic<bool>& stop);
  // Called once the federation is over: fills in each restart's rounds from
  // the audit logs.
  void account();
  const std::vector<Restart>& restarts() const { return restarts_; }
  // Each node's peak resident memory in KiB, the largest of its processes'
  // (every rank, every life) as the kernel counted them when they exited;
  // where that count is no larger than the copy of the demo a process held
  // before it exec'd (a small model), the process's own peak as sampled
  // every 250 ms while it ran (VmHWM) instead.
  const std::map<std::string, uint64_t>& peak_rss_kib() const { return peak_rss_kib_; }
  // Each node's peak anonymous memory in KiB (RssAnon, sampled every
  // 250 ms while it runs): its RSS less the file pages it maps, such as a
  // large model's anchor in a file the kernel pages (SiteOptions::
  // page_out_from_bytes), which ru_maxrss counts while they are resident.
  const std::map<std::string, uint64_t>& peak_anon_kib() const { return peak_anon_kib_; }
  // Each node's CPU time in seconds (user, system), all its processes and
  // lives together, as the kernel counted them when they exited.
  const std::map<std::string, std::pair<double, double>>& cpu_seconds() const {
    return cpu_seconds_;
  }
  // Each node's page faults that needed no disk read (ru_minflt), counted
  // the same way: pages it touched for the first time, or again after
  // giving them back (a buffer mapped afresh for every frame received).
  const std::map<std::string, uint64_t>& minor_faults() const { return minor_faults_; }

 private:
  struct Process {
    size_t node = 0;  // index into nodes_
    size_t rank = 0;
    pid_t pid = -1;
    // The demo's own resident memory as it forked this process: the child
    // counts a copy of it before it execs, so a kernel peak no larger may
    // be that copy's rather than the node's.
    uint64_t fork_rss_kib = 0;
    uint64_t hwm_kib = 0;  // the node's own peak (VmHWM, reset at exec), as last sampled
  };
  struct Node {
    NodeLaunch launch;
    int restarts = 0;
    bool released = false;                             // joined (or free to)
    bool published = false;                            // its topology version is out
    std::chrono::steady_clock::time_point next_check;  // of the audit log, until released
  };
  // Lets the nodes whose start_after_rounds the root's audit log reached join.
  void release_due();

  void spawn_node(size_t index, bool first);
  void stop_all(int sig);
  // The node's processes still running: SIGKILLed and reaped.
  void kill_node(size_t index);
  // Waits for `pid` (-1: any child) like waitpid, and records the peak RSS
  // and the CPU time of the process it reaps.
  pid_t reap(pid_t pid, int* status, int options);
  // Reads every running process's RssAnon, at most every 250 ms.
  void sample_memory();

  std::string exe_;
  int max_restarts_;
  std::vector<Node> nodes_;
  std::vector<Process> procs_;
  std::vector<Restart> restarts_;
  std::map<std::string, uint64_t> peak_rss_kib_;
  std::map<std::string, uint64_t> peak_anon_kib_;
  std::chrono::steady_clock::time_point sampled_at_{};
  std::map<std::string, std::pair<double, double>> cpu_seconds_;
  std::map<std::string, uint64_t> minor_faults_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// The last `max_bytes` of a file, for error messages.
std::string tail_of(const std::string& path, size_t max_bytes = 2000);

}  // namespace fedwan::cli

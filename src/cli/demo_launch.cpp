// Each node's command lines as the demo starts it (demo_launch.hpp).
#include "cli/demo_launch.hpp"

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace fedwan::cli {
namespace {

// A late site (--late) or the added one (--add-site): its processes start
// at once but join in the round it was given (see NodeLaunch).
void join_when_due(NodeLaunch& l, const DemoArgs& a, const DemoPlan& plan, const NodeSpec& n) {
  const std::filesystem::path& dir = plan.dir;
  const auto& late = plan.late;
  const auto& added = plan.added;
  if ((late && late->site == n.id) || (added && added->node.id == n.id)) {
    l.start_after_rounds = added && added->node.id == n.id ? a.add_site - 1 : late->round - 1;
    l.watch_audit = (dir / "audit" / "root.jsonl").string();
    l.go_file = (dir / ("go-" + n.id)).string();
    std::filesystem::remove(l.go_file);
    for (auto& args : l.rank_args) args.insert(args.end(), {"--join-after-file", l.go_file});
  }
  if (added && added->node.id == n.id) {
    l.publish_from = added->topology;
    l.publish_to = plan.topology_file;
    l.adopted_audit = (dir / "audit" / (n.parent + ".jsonl")).string();
  }
}

}  // namespace

std::string torch_free_aggregator() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::filesystem::path p = self.parent_path() / "fedwan-aggregator";
  return std::filesystem::exists(p, ec) ? p.string() : "";
}

NodeLaunch demo_node_launch(const DemoArgs& a, const DemoPlan& plan, const NodeSpec& n,
                            const std::string& topology_file) {
  const std::filesystem::path& dir = plan.dir;
  const auto& leave = plan.leave;
  const bool site = n.role == Role::kSite;
  NodeLaunch l;
  l.node = n.id;
  if (auto b = plan.binaries.find(n.id); b != plan.binaries.end()) l.exe = b->second;
  if (l.exe.empty() && !site && a.workload.trainer == "synthetic") l.exe = torch_free_aggregator();
  for (int rank = 0; rank < (site ? a.ranks_per_site : 1); ++rank) {
    std::vector<std::string> args = {site ? "site" : "aggregator", "--topology", topology_file,
                                     "--node", n.id};
    std::string name = n.id;
    if (site && a.ranks_per_site > 1) {
      name = n.id + ".rank" + std::to_string(rank);
      l.rendezvous_dir = (dir / "rendezvous" / n.id).string();
      args.insert(args.end(), {"--ranks", std::to_string(a.ranks_per_site), "--rank",
                               std::to_string(rank), "--rendezvous", l.rendezvous_dir});
    }
    if (site) args.insert(args.end(), {"--device", a.device});
    if (a.insecure_plaintext) {
      args.push_back("--insecure-plaintext");
    } else {
      args.insert(args.end(), {"--credentials", (plan.pki / n.id).string(), "--cipher", a.cipher});
    }
    if (!a.no_audit_log) {
      const std::string audit = (dir / "audit" / (name + ".jsonl")).string();
      if (rank == 0) l.audit_log = audit;
      // A node that dies is started again from here (the supervisor).
      args.insert(args.end(), {"--audit-log", audit});
    }
    if (!a.no_checkpoints) {
      args.insert(args.end(), {"--checkpoint-dir", (dir / "checkpoints" / name).string()});
    }
    if (!site && a.no_pace) args.push_back("--no-pace");
    if (n.role == Role::kRoot) args.insert(args.end(), {"--eval", "--report", plan.root_report});
    // A site's report: what its training cost, apart from its sync (cpu.training_s).
    if (site && rank == 0) {
      args.insert(args.end(), {"--report", (dir / "reports" / (n.id + ".json")).string()});
    }
    if (leave && leave->site == n.id) {
      args.insert(args.end(), {"--leave-at-round", std::to_string(leave->round - 1)});
    }
    if (a.metrics_linger_s > 0) {
      args.insert(args.end(), {"--metrics-linger", std::to_string(a.metrics_linger_s)});
    }
    for (const std::string& w : workload_args(a.workload)) args.push_back(w);
    l.rank_args.push_back(std::move(args));
    l.rank_logs.push_back((dir / (name + ".log")).string());
  }
  if (plan.chaos && plan.chaos->node == n.id) {
    l.first_env = {{"FEDWAN_CRASH_POINT", plan.chaos->crash_point}};
    if (plan.chaos->disk) l.lose_before_restart = (dir / "checkpoints" / n.id).string();
  }
  join_when_due(l, a, plan, n);
  return l;
}

}  // namespace fedwan::cli

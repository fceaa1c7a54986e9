// `fedwan demo`: a whole federation on loopback, one OS process per node
// (the same `fedwan aggregator` / `fedwan site` commands a deployment runs),
// then the same model trained centrally on the pooled data for the same
// number of samples, and a JSON report comparing the two.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>

#include <torch/utils.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/demo_supervisor.hpp"
#include "cli/demo_versions.hpp"
#include "cli/placement.hpp"
#include "cli/validators.hpp"
#include "common/loopback_port.hpp"
#include "costs/cost_bill.hpp"
#include "costs/cost_checks.hpp"
#include "costs/cost_ledger.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "fedwan/security.hpp"
#include "fedwan/topology.hpp"
#include "security/node_key.hpp"
#include "security/tls_session.hpp"
#include "workload/fashion_mnist.hpp"
#include "workload/fashion_model.hpp"

namespace fedwan::cli {

using namespace fedwan::costs;  // the ledger, the bill and its checks

using workload::FashionMnistData;
using workload::FashionMnistSet;
using workload::load_fashion_mnist;
using workload::FashionCnn;
using workload::make_fashion_cnn;
using workload::Trainer;
using workload::evaluate;
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A free loopback port this demo has not handed out yet, reserved for it
// (common/loopback_port.hpp: outside the ephemeral range, so a node killed
// by --chaos finds its port free again when it restarts).
int free_port() {
  static std::set<int> given;
  for (int tries = 0; tries < 1000; ++tries) {
    const int port = reserve_loopback_port();
    if (given.insert(port).second) return port;
  }
  throw Error("demo: cannot find a free loopback port not already in use by this demo");
}

// What every node's cost records add up to, as `fedwan costs` bills them:
// per node, its rounds, device-seconds and bytes sent and received, each
// record checked against the demo's CA (unsigned with --insecure-plaintext)
// and the topology.
nlohmann::json demo_costs(const fs::path& dir, const Topology& topo, bool plaintext) {
  std::error_code ec;
  try {
    std::unique_ptr<security::SignatureVerifier> ca;
    CostTrust trust;
    trust.job = topo.job();
    if (plaintext) {
      trust.on_their_word = true;
    } else {
      ca = std::make_unique<security::SignatureVerifier>((dir / "pki" / "ca" / "ca.pem").string(),
                                                         (dir / "pki" / "ca" / "crl.pem").string());
      trust.ca = ca.get();
    }
    CostLedger ledger(trust);
    for (const auto& e : fs::recursive_directory_iterator(dir / "checkpoints", ec)) {
      if (e.path().filename() != "costs.jsonl") continue;
      std::ifstream f(e.path());
      ledger.read(f, e.path().string());
    }
    const CheckedCosts checked = check_costs(ledger, &topo);
    const CostBill bill = bill_costs(checked.billed, CostRates{}, 0);
    nlohmann::json nodes = nlohmann::json::object();
    for (const CostLine& l : bill.nodes) {
      nodes[l.node] = {{"role", l.role},
                       {"rounds", l.rounds},
                       {"rounds_contributed", l.contributed},
                       {"device_seconds", static_cast<double>(l.device_us_total) / 1e6},
                       {"bytes_sent", l.sent},
                       {"bytes_received", l.received}};
    }
    nlohmann::json refused = nlohmann::json::array();
    for (const CostRefusal& r : ledger.refusals()) refused.push_back(r.origin + ": " + r.reason);
    for (const CostRefusal& r : checked.refused) refused.push_back(r.origin + ": " + r.reason);
    nlohmann::json mismatched = nlohmann::json::array();
    for (const LinkReconciliation& l : checked.links) {
      if (l.mismatch) mismatched.push_back(l.child + "->" + l.parent);
    }
    return {{"records", bill.records},
            {"signed", !plaintext},
            {"refused", refused},
            {"link_mismatches", mismatched},
            {"nodes", nodes}};
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
}

std::string self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("demo: cannot locate the fedwan executable: " + ec.message());
  return p.string();
}

// SIGTERM/SIGINT to the demo: every node is sent SIGTERM (each checkpoints
// and exits 0) and the demo waits for them all before it exits.
std::atomic<bool> g_demo_stop{false};

extern "C" void on_demo_signal(int) { g_demo_stop.store(true); }

void install_demo_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_demo_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: waitpid returns EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// Rounds 1-based, as the demo prints them.
nlohmann::json restarts_json(const std::vector<Restart>& restarts) {
  nlohmann::json out = nlohmann::json::array();
  for (const Restart& r : restarts) {
    nlohmann::json j = {
        {"node", r.node}, {"cause", r.cause}, {"number", r.number}, {"at_seconds", r.at_s}};
    j["died_in_round"] = r.died_in_round ? nlohmann::json(*r.died_in_round + 1) : nullptr;
    j["resumed_at_round"] = r.resumed_round ? nlohmann::json(*r.resumed_round + 1) : nullptr;
    j["rounds_lost"] =
        r.died_in_round && r.resumed_round
            ? nlohmann::json(*r.died_in_round - std::min(*r.died_in_round, *r.resumed_round))
            : nullptr;
    out.push_back(std::move(j));
  }
  return out;
}

Topology demo_topology(const DemoArgs& a, const std::vector<double>& weights,
                       const std::string& late_site) {
  FederationSpec fed;
  fed.rounds = a.rounds;
  fed.inner_steps = a.inner_steps;
  fed.overlap_steps = a.overlap_steps;
  fed.streams = a.streams;
  fed.codec = a.codec;
  fed.chunk_bytes = a.chunk_bytes;
  fed.outer.name = a.outer;
  auto endpoint = [&](int k) {
    const int port = a.base_port > 0 ? a.base_port + k : free_port();
    return "tcp://127.0.0.1:" + std::to_string(port);
  };
  std::vector<NodeSpec> nodes;
  NodeSpec root;
  root.id = "root";
  root.role = Role::kRoot;
  root.endpoint = endpoint(0);
  nodes.push_back(root);
  for (int r = 0; r < a.regions; ++r) {
    NodeSpec n;
    n.id = "region-" + std::to_string(r);
    n.role = Role::kRegion;
    n.parent = "root";
    n.endpoint = endpoint(1 + r);
    nodes.push_back(n);
  }
  for (int s = 0; s < a.sites; ++s) {
    NodeSpec n;
    n.id = "site-" + std::to_string(s);
    n.role = Role::kSite;
    n.parent = a.regions > 0 ? "region-" + std::to_string(s % a.regions) : "root";
    n.weight = weights[static_cast<size_t>(s)];
    n.late_join = n.id == late_site;
    // What its cost records may bill: one device per rank.
    n.devices = static_cast<uint64_t>(std::max(1, a.ranks_per_site));
    nodes.push_back(n);
  }
  if (a.metrics) {
    for (NodeSpec& n : nodes) n.metrics = "127.0.0.1:" + std::to_string(free_port());
  }
  return Topology::build("fedwan-demo", fed, nodes);
}

// The demo's federation CA: a fresh one, or the one an earlier run left in
// the same --dir when it still serves every node. An existing CA is never
// replaced unless asked (--force): it may be one the user cares about.
void prepare_credentials(const Topology& topo, const fs::path& pki, bool force) {
  std::error_code ec;
  if (!fs::exists(pki / "ca", ec)) {
    provision_credentials(topo, pki.string(), 7, /*overwrite=*/false);
    return;
  }
  if (force) {
    std::cout << "fedwan demo: replacing the federation CA in " << pki.string() << " (--force)\n";
    provision_credentials(topo, pki.string(), 7, /*overwrite=*/true);
    return;
  }
  for (const NodeSpec& n : topo.nodes()) {
    try {
      const security::TlsContext bundle((pki / n.id).string());
      if (bundle.self().node_id != n.id) throw ConfigError("it is the bundle of another node");
    } catch (const Error& e) {
      throw ConfigError(pki.string() + " already holds a federation CA, but it cannot serve '" +
                        n.id + "' of this demo (" + e.what() +
                        "); pass --force to replace that CA and every bundle, or choose "
                        "another --dir");
    }
  }
  std::cout << "fedwan demo: reusing the federation CA in " << pki.string() << "\n";
}

// Central training on the pooled shards for `steps` minibatches.
double train_baseline(const WorkloadSettings& w, uint64_t steps) {
  const FashionMnistData train = load_fashion_mnist(FashionMnistSet::kTrain, w.data_dir);
  const FashionMnistData test = load_fashion_mnist(FashionMnistSet::kTest, w.data_dir);
  std::vector<int64_t> all(static_cast<size_t>(train.labels.size(0)));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  FashionCnn model = make_fashion_cnn(w.seed);
  std::unique_ptr<torch::optim::Optimizer> opt = make_inner_optimizer(*model, w);
  Trainer trainer(train.images, train.labels, std::move(all), w.batch_size, w.seed);
  for (uint64_t s = 0; s < steps; ++s) trainer.step(model, *opt);
  return evaluate(model, test.images, test.labels).accuracy;
}

int run_demo(const DemoArgs& a) {
  torch::set_num_threads(1);
  if (a.sites < 1) throw ConfigError("--sites must be at least 1");
  if (a.regions < 0 || a.regions > a.sites) {
    throw ConfigError("--regions must be between 0 and the number of sites");
  }
  (void)codec_by_name(a.codec);  // fail before launching anything
  OuterOptimizerSpec outer;
  outer.name = a.outer;
  (void)make_outer_optimizer(outer, 1);
  if (a.device == "cuda" && a.workload.trainer != "fashion-cnn") {
    throw ConfigError("--device cuda trains fashion-cnn; the synthetic trainer runs on the CPU");
  }
  // Where the sites' ranks will train (each resolves the same on this
  // machine); --device cuda without what it needs fails here.
  const Placement place =
      a.workload.trainer == "fashion-cnn" ? place_rank(a.device, 0, a.ranks_per_site) : Placement{};
  const auto t0 = Clock::now();

  fs::path dir = a.work_dir;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "fedwan-demo-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw Error("demo: cannot create a temporary directory");
    dir = tmpl;
  } else {
    fs::create_directories(dir);
  }

  // Site weights are their sample counts (FedAvg weighting).
  std::vector<double> weights(static_cast<size_t>(a.sites), 1.0);
  if (a.workload.trainer == "fashion-cnn") {
    const auto shards = fashion_shards(a.workload, static_cast<size_t>(a.sites));
    for (size_t s = 0; s < shards.size(); ++s) weights[s] = static_cast<double>(shards[s].size());
  }
  if (a.insecure_plaintext && a.streams > 1) {
    throw ConfigError("--streams " + std::to_string(a.streams) +
                      " needs the secure channel (plaintext frames carry no sequence numbers "
                      "to restore their order): drop --insecure-plaintext, or use --streams 1");
  }
  const std::optional<SiteRound> late = parse_site_round("--late", a.late, a.sites, 2, a.rounds);
  const std::optional<SiteRound> leave = parse_site_round("--leave", a.leave, a.sites, 1, a.rounds);
  if (late && leave && late->site == leave->site && leave->round <= late->round) {
    throw ConfigError("--leave " + a.leave + " comes before --late " + a.late);
  }
  const Topology topo = demo_topology(a, weights, late ? late->site : std::string());
  const std::optional<ChaosPlan> chaos = parse_chaos(a.chaos, topo, a.rounds);
  const std::string topo_path = (dir / "topology.yaml").string();
  std::ofstream(topo_path) << topo.to_yaml();
  // Every link is mutual TLS unless asked otherwise: a fresh federation CA
  // and one bundle per node, private to this run.
  const fs::path pki = dir / "pki";
  if (!a.insecure_plaintext) prepare_credentials(topo, pki, a.force);
  std::optional<AddedSite> added;
  if (a.add_site > 0) {
    if (a.insecure_plaintext) {
      throw ConfigError("--add-site needs mutual TLS: aggregators adopt only topology versions "
                        "the admin signed, checked against the federation CA");
    }
    if (a.add_site < 2 || a.add_site > a.rounds) {
      throw ConfigError("--add-site " + std::to_string(a.add_site) + ": a round in 2.." +
                        std::to_string(a.rounds));
    }
    added = prepare_added_site(topo, dir, pki,
                               a.metrics ? "127.0.0.1:" + std::to_string(free_port()) : "");
  }
  fs::create_directories(dir / "audit");
  // The ranks of a site meet here; addresses left by an earlier run in the
  // same directory would be taken for live ranks.
  fs::remove_all(dir / "rendezvous");
  // Nodes resume from these after a restart, never from an earlier run's.
  fs::remove_all(dir / "checkpoints");

  if (a.ranks_per_site > 1 && a.workload.trainer != "fashion-cnn") {
    throw ConfigError("--ranks-per-site > 1 needs --trainer fashion-cnn");
  }
  const std::string engine = place.cuda() ? "NCCL" : "Gloo";
  std::cout << "fedwan demo: root, " << a.regions << " regions, " << a.sites << " sites"
            << (a.ranks_per_site > 1
                    ? " of " + std::to_string(a.ranks_per_site) + " ranks (" + engine + ")"
                    : std::string())
            << " on " << (place.cuda() ? "GPUs" : "the CPU") << "; " << a.rounds << " rounds x "
            << a.inner_steps << " steps"
            << (a.overlap_steps > 0 ? " (overlapped: anchors merged " +
                                          std::to_string(a.overlap_steps) + " steps late)"
                                    : std::string())
            << "; codec " << a.codec << ", outer " << a.outer << ", trainer " << a.workload.trainer
            << "\n"
            << "fedwan demo: topology and logs in " << dir.string() << "\n"
            << "fedwan demo: links "
            << (a.insecure_plaintext ? std::string("PLAINTEXT (--insecure-plaintext)")
                                     : "mutual TLS 1.3, frames " + a.cipher + "; credentials in " +
                                           (dir / "pki").string())
            << std::endl;

  const std::string root_report = (dir / "root.json").string();
  DemoSupervisor supervisor(self_exe(), a.max_restarts);
  install_demo_signal_handlers();
  auto launch = [&](const NodeSpec& n, const std::string& topology_file) {
    const bool site = n.role == Role::kSite;
    NodeLaunch l;
    l.node = n.id;
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
        args.insert(args.end(), {"--credentials", (pki / n.id).string(), "--cipher", a.cipher});
      }
      const std::string audit = (dir / "audit" / (name + ".jsonl")).string();
      if (rank == 0) l.audit_log = audit;
      // A node that dies is started again from here (the supervisor).
      args.insert(args.end(), {"--audit-log", audit, "--checkpoint-dir",
                               (dir / "checkpoints" / name).string()});
      if (n.role == Role::kRoot) args.insert(args.end(), {"--eval", "--report", root_report});
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
    if (chaos && chaos->node == n.id) l.first_env = {{"FEDWAN_CRASH_POINT", chaos->crash_point}};
    if ((late && late->site == n.id) || (added && added->node.id == n.id)) {
      l.start_after_rounds = added && added->node.id == n.id ? a.add_site - 1 : late->round - 1;
      l.watch_audit = (dir / "audit" / "root.jsonl").string();
      l.go_file = (dir / ("go-" + n.id)).string();
      fs::remove(l.go_file);
      for (auto& args : l.rank_args) args.insert(args.end(), {"--join-after-file", l.go_file});
    }
    if (added && added->node.id == n.id) {
      l.publish_from = added->topology;
      l.publish_to = topo_path;
      l.adopted_audit = (dir / "audit" / (n.parent + ".jsonl")).string();
    }
    supervisor.start(std::move(l));
  };
  for (const NodeSpec& n : topo.nodes()) {
    if (g_demo_stop.load()) break;
    launch(n, topo_path);
  }
  if (added && !g_demo_stop.load()) launch(added->node, added->topology);
  const bool all_ok = supervisor.run(g_demo_stop);
  // No node is left to stop: a signal from here on ends the demo at once.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  if (!all_ok) return 1;
  if (g_demo_stop.load()) {
    std::cerr << "fedwan demo: stopped by signal; every node was stopped (logs in " << dir.string()
              << ")\n";
    return 0;
  }
  const double fed_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  nlohmann::json report;
  {
    std::ifstream f(root_report);
    if (!f) throw Error("demo: the root wrote no report at " + root_report);
    report = nlohmann::json::parse(f);
  }
  std::optional<double> baseline;
  if (!a.no_baseline && a.workload.trainer == "fashion-cnn") {
    const uint64_t steps = a.rounds * a.inner_steps * static_cast<uint64_t>(a.sites);
    std::cout << "baseline: central training on the pooled data, " << steps << " steps of "
              << a.workload.batch_size << " samples" << std::endl;
    baseline = train_baseline(a.workload, steps);
    std::printf("baseline accuracy %.4f\n", *baseline);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  report["baseline_accuracy"] = baseline ? nlohmann::json(*baseline) : nlohmann::json(nullptr);
  supervisor.account();
  report["restarts"] = restarts_json(supervisor.restarts());
  // The topology as it ended (a version may have added a site).
  report["costs"] = demo_costs(dir, Topology::load(topo_path), a.insecure_plaintext);
  for (const Restart& r : supervisor.restarts()) {
    std::cout << "restart: " << r.node << " died (" << r.cause << ") "
              << (r.died_in_round ? "in round " + std::to_string(*r.died_in_round + 1)
                                  : std::string("before its first update"))
              << " at " << std::fixed << std::setprecision(1) << r.at_s << " s; "
              << (r.resumed_round
                      ? "resumed at round " + std::to_string(*r.resumed_round + 1) +
                            (r.died_in_round ? ", " +
                                                   std::to_string(*r.died_in_round -
                                                                  std::min(*r.died_in_round,
                                                                           *r.resumed_round)) +
                                                   " round(s) to redo"
                                             : std::string())
                      : std::string("rejoined"))
              << std::defaultfloat << std::endl;
  }
  report["wall_seconds"] = wall;
  report["federation_seconds"] = fed_seconds;
  report["configuration"] = {
      {"max_restarts", a.max_restarts},
      {"chaos", a.chaos.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.chaos)},
      {"sites", a.sites},
      {"regions", a.regions},
      {"rounds", a.rounds},
      {"inner_steps", a.inner_steps},
      {"overlap_steps", a.overlap_steps},
      {"streams", a.streams},
      {"codec", a.codec},
      {"outer_optimizer", a.outer},
      {"chunk_bytes", a.chunk_bytes},
      {"trainer", a.workload.trainer},
      {"seed", a.workload.seed},
      {"alpha", a.workload.alpha},
      {"batch_size", a.workload.batch_size},
      {"inner_optimizer", a.workload.inner_optimizer},
      {"lr", a.workload.lr},
      {"device", place.cuda() ? "cuda" : "cpu"},
      {"topology_digest", topo.digest_hex()},
      {"security", a.insecure_plaintext ? std::string("plaintext") : "mtls/" + a.cipher},
      {"audit_dir", (dir / "audit").string()}};
  const double ratio =
      report["fp32_bytes_total"].get<double>() > 0
          ? report["wan_bytes_total"].get<double>() / report["fp32_bytes_total"].get<double>()
          : 0.0;
  std::printf("federation: final accuracy %s, WAN %.2f MB (%.3f of fp32), %.1f s; total %.1f s\n",
              report.contains("final_accuracy")
                  ? std::to_string(report["final_accuracy"].get<double>()).c_str()
                  : "n/a",
              report["wan_bytes_total"].get<double>() / 1e6, ratio, fed_seconds, wall);
  if (!a.report.empty()) {
    std::ofstream(a.report) << report.dump(2) << "\n";
    std::cout << "report written to " << a.report << std::endl;
  }
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app, DemoArgs& a, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "demo", "launch a whole federation on loopback (one process per node) and compare it "
              "with central training");
  cmd->add_option("--sites", a.sites, "number of sites")
      ->check(number_in(1, 256))
      ->capture_default_str();
  cmd->add_option("--regions", a.regions, "number of region aggregators (0: sites under root)")
      ->check(number_in(0, 256))
      ->capture_default_str();
  cmd->add_option("--rounds", a.rounds, "outer rounds")
      ->check(number_in(1, 1e6))
      ->capture_default_str();
  cmd->add_option("--inner-steps,-H", a.inner_steps, "local steps per round")
      ->check(number_in(1, 1e9))
      ->capture_default_str();
  cmd->add_option("--overlap-steps", a.overlap_steps,
                  "overlapped rounds: sites train on while their update goes up and merge the "
                  "next anchor this many steps later (1..inner steps); 0: blocking rounds")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
  cmd->add_option("--streams", a.streams,
                  "TCP connections per tree link, frames striped across them (1..16)")
      ->check(number_in(1, 16))
      ->capture_default_str();
  cmd->add_option("--max-restarts", a.max_restarts,
                  "times a node that dies is started again (from its checkpoint) before the "
                  "demo gives up")
      ->check(number_in(0, 100))
      ->capture_default_str();
  cmd->add_option("--chaos", a.chaos,
                  "NODE@ROUND: that site or region is killed (SIGKILL) in that round, to watch "
                  "it restart and recover, e.g. site-0@3");
  cmd->add_option("--late", a.late,
                  "SITE@ROUND: that site is not there at the start (late_join) and is started "
                  "in that round; it counts from the next round boundary, e.g. site-3@5");
  cmd->add_option("--leave", a.leave,
                  "SITE@ROUND: that site leaves the federation gracefully as that round begins "
                  "(no round waits for it), e.g. site-1@8");
  cmd->add_option("--add-site", a.add_site,
                  "ROUND: in that round the operator adds one more site with a new topology "
                  "version signed by the admin (`fedwan topology sign`); the aggregators adopt "
                  "it and the new site counts from the next round boundary, e.g. 5");
  cmd->add_flag("--metrics", a.metrics,
                "every node serves Prometheus metrics and its status over HTTP on a free "
                "127.0.0.1 port (in the topology; `fedwan status --topology DIR/topology.yaml`)");
  cmd->add_option("--metrics-linger", a.metrics_linger_s,
                  "with --metrics: nodes keep serving their metrics this many seconds after they "
                  "finished (for a scraper's last look)")
      ->check(number_in(0, 3600, /*integer=*/false))
      ->capture_default_str();
  cmd->add_option("--codec", a.codec, "delta codec: fp32, fp16, bf16, int8")->capture_default_str();
  cmd->add_option("--outer", a.outer, "outer optimizer: fedavg, diloco, fedadam")
      ->capture_default_str();
  cmd->add_option("--chunk-bytes", a.chunk_bytes, "fp32 bytes per chunk, a multiple of 4")
      ->check(number_in(4096, 4 << 20))
      ->capture_default_str();
  cmd->add_option("--ranks-per-site", a.ranks_per_site,
                  "processes per site (ranks averaging their gradients every step, over NCCL "
                  "on GPUs or Gloo on the CPU; each trains on its slice of every minibatch)")
      ->check(number_in(1, 64))
      ->capture_default_str();
  cmd->add_option("--device", a.device,
                  "where the sites train: cuda (rank r of a site on GPU r % GPUs), cpu, or auto "
                  "(cuda when this build, the machine and LibTorch have CUDA and there is a GPU "
                  "per rank of a site; else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("--no-baseline", a.no_baseline, "skip the central-training baseline");
  cmd->add_option("--report", a.report, "write the JSON report here");
  cmd->add_option("--dir", a.work_dir,
                  "working directory (default: a new temporary one); a federation CA an earlier "
                  "run left there is reused, never replaced without --force");
  cmd->add_flag("--force", a.force,
                "replace the federation CA and bundles in --dir/pki with new ones");
  cmd->add_option("--base-port", a.base_port,
                  "first loopback port; the nodes take the ports after it (default: free ports)")
      ->check(number_in(1, 65000));
  cmd->add_flag("--insecure-plaintext", a.insecure_plaintext,
                "run the demo's links without TLS or encryption (default: a fresh federation "
                "CA is provisioned and every link is mutual TLS)");
  cmd->add_option("--cipher", a.cipher, "frame cipher: aes-256-gcm, chacha20-poly1305")
      ->capture_default_str();
  add_workload_flags(*cmd, a.workload);
  cmd->callback([&a, exit_code] { *exit_code = run_demo(a); });
}

}  // namespace fedwan::cli

// `fedwan demo`: a whole federation on loopback, one OS process per node
// (the same `fedwan aggregator` / `fedwan site` commands a deployment runs),
// then the same model trained centrally on the pooled data for the same
// number of samples, and a JSON report comparing the two.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/utils.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/demo_flags.hpp"
#include "cli/demo_launch.hpp"
#include "cli/demo_plan.hpp"
#include "cli/demo_report.hpp"
#include "cli/demo_supervisor.hpp"
#include "cli/placement.hpp"
#include "cli/workload.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "fedwan/topology.hpp"
#include "topology/privacy_settings.hpp"
#include "workload/fashion_mnist.hpp"
#include "workload/fashion_model.hpp"

namespace fedwan::cli {

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

// The flags that can be refused before anything is launched or written.
// Returns where the sites' ranks will train (each resolves the same on this
// machine); --device cuda without what it needs fails here.
Placement check_demo_args(const DemoArgs& a) {
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
  return a.workload.trainer == "fashion-cnn" ? place_rank(a.device, 0, a.ranks_per_site)
                                             : Placement{};
}

// --dir, created if need be, or a fresh temporary directory.
fs::path demo_dir(const DemoArgs& a) {
  fs::path dir = a.work_dir;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "fedwan-demo-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw Error("demo: cannot create a temporary directory");
    dir = tmpl;
  } else {
    fs::create_directories(dir);
  }
  return dir;
}

void print_demo_banner(const DemoArgs& a, const Placement& place, const fs::path& dir) {
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
  // A synthetic run's aggregators run without LibTorch when they can; the
  // memory report would otherwise count LibTorch's libraries as theirs.
  if (a.workload.trainer == "synthetic" && torch_free_aggregator().empty()) {
    std::cout << "fedwan demo: no fedwan-aggregator beside this program: the aggregators run "
                 "as `fedwan aggregator`, LibTorch loaded (about 150 MiB more resident each); "
                 "build the fedwan_aggregator_cli target for their own memory"
              << std::endl;
  }
}

// Starts every node (the added site last, on its own topology version) and
// supervises them until all finished, one failed past its restarts (false),
// or a signal stopped them (g_demo_stop).
bool run_nodes(const DemoArgs& a, const DemoPlan& plan, DemoSupervisor& supervisor) {
  install_demo_signal_handlers();
  for (const NodeSpec& n : plan.topology.nodes()) {
    if (g_demo_stop.load()) break;
    supervisor.start(demo_node_launch(a, plan, n, plan.topology_file));
  }
  if (plan.added && !g_demo_stop.load()) {
    supervisor.start(demo_node_launch(a, plan, plan.added->node, plan.added->topology));
  }
  const bool all_ok = supervisor.run(g_demo_stop);
  // No node is left to stop: a signal from here on ends the demo at once.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  return all_ok;
}

// The root's report, completed with the baseline, the restarts, the costs
// and the configuration; printed in short and written to --report.
// The privacy the run spent (the root's report has the epsilon), in the
// demo's report and on its last line.
void add_privacy(nlohmann::json& report, const Topology& topo) {
  const FederationSpec& fed = topo.federation();
  if (fed.privacy.mode == "off") return;
  report["privacy"] = {{"mode", fed.privacy.mode},
                       {"clip", fed.privacy.clip},
                       {"delta", fed.privacy.delta},
                       {"noise_multiplier", topology::privacy_noise_multiplier(fed)},
                       {"rounds", topo.rounds_to_run()},
                       {"epsilon", report.value("privacy_epsilon", 0.0)}};
}

void print_privacy(const nlohmann::json& report) {
  if (!report.contains("privacy")) return;
  const nlohmann::json& p = report["privacy"];
  std::printf("privacy: %s, epsilon %.4g at delta %.3g over %llu rounds (noise multiplier %.4g, "
              "clip %.4g)\n",
              p["mode"].get<std::string>().c_str(), p["epsilon"].get<double>(),
              p["delta"].get<double>(),
              static_cast<unsigned long long>(p["rounds"].get<uint64_t>()),
              p["noise_multiplier"].get<double>(), p["clip"].get<double>());
}

void report_demo(const DemoArgs& a, const DemoPlan& plan, const Placement& place,
                 DemoSupervisor& supervisor, Clock::time_point t0) {
  const double fed_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  nlohmann::json report;
  {
    std::ifstream f(plan.root_report);
    if (!f) throw Error("demo: the root wrote no report at " + plan.root_report);
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
  report["costs"] = demo_costs(plan.dir, Topology::load(plan.topology_file), a.insecure_plaintext);
  print_restarts(supervisor.restarts());
  report["memory"] = memory_json(supervisor.peak_rss_kib(), supervisor.peak_anon_kib(),
                                 plan.topology, model_parameters(a.workload));
  report["cpu"] =
      cpu_json(supervisor.cpu_seconds(), plan.dir / "reports", supervisor.minor_faults());
  report["wall_seconds"] = wall;
  report["federation_seconds"] = fed_seconds;
  report["configuration"] = demo_configuration(a, plan.topology, place.cuda(), plan.dir);
  add_privacy(report, plan.topology);
  print_federation_summary(report, fed_seconds, wall);
  print_memory(report["memory"]);
  print_cpu(report["cpu"], report["fp32_bytes_total"].get<double>());
  print_privacy(report);
  if (!a.report.empty()) {
    std::ofstream(a.report) << report.dump(2) << "\n";
    std::cout << "report written to " << a.report << std::endl;
  }
}

// A finished demo in a temporary directory of its own drops its checkpoint
// files (the model several times over: gigabytes at 100M parameters, which
// runs one after another would pile up); the topology, credentials, logs,
// audit logs, cost records and reports stay for reading. Under --dir
// everything stays, and the last line says how much of it is checkpoints.
void drop_checkpoints(const DemoArgs& a, const DemoPlan& plan) {
  std::error_code ec;
  uint64_t bytes = 0;
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(plan.dir / "checkpoints", ec);
       !ec && it != fs::end(it); it.increment(ec)) {
    if (it->path().extension() == ".fwck" && it->is_regular_file(ec)) {
      bytes += it->file_size(ec);
      files.push_back(it->path());
    }
  }
  if (!a.work_dir.empty()) {
    if (bytes > 0) {
      std::printf("fedwan demo: the nodes' checkpoint files (%.1f MB) stay in %s; remove them "
                  "when done\n",
                  static_cast<double>(bytes) / 1e6, (plan.dir / "checkpoints").string().c_str());
    }
    return;
  }
  for (const fs::path& f : files) fs::remove(f, ec);
  if (bytes > 0) {
    std::printf("fedwan demo: removed the nodes' checkpoint files (%.1f MB); logs, audit logs "
                "and cost records stay in %s\n",
                static_cast<double>(bytes) / 1e6, plan.dir.string().c_str());
  }
}

int run_demo(const DemoArgs& a) {
  torch::set_num_threads(1);
  const Placement place = check_demo_args(a);
  const auto t0 = Clock::now();
  const DemoPlan plan = plan_demo(a, demo_dir(a));
  if (a.ranks_per_site > 1 && a.workload.trainer != "fashion-cnn") {
    throw ConfigError("--ranks-per-site > 1 needs --trainer fashion-cnn");
  }
  print_demo_banner(a, place, plan.dir);
  // Without a checkpoint a restarted node would begin again from nothing.
  DemoSupervisor supervisor(self_exe(), a.no_checkpoints ? 0 : a.max_restarts);
  if (!run_nodes(a, plan, supervisor)) return 1;
  if (g_demo_stop.load()) {
    std::cerr << "fedwan demo: stopped by signal; every node was stopped (logs in "
              << plan.dir.string() << ")\n";
    return 0;
  }
  report_demo(a, plan, place, supervisor, t0);
  drop_checkpoints(a, plan);
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app, DemoArgs& a, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "demo", "launch a whole federation on loopback (one process per node) and compare it "
              "with central training");
  add_demo_flags(*cmd, a);
  cmd->callback([&a, exit_code] { *exit_code = run_demo(a); });
}

}  // namespace fedwan::cli

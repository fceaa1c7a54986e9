// `fedwan site`: a site of a real deployment, or one rank of a multi-rank
// site (the synthetic trainer, or Fashion-MNIST's CNN on its data shard).
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include <torch/utils.h>
#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "cli/node_common.hpp"
#include "cli/placement.hpp"
#include "cli/site_report.hpp"
#include "cli/synthetic_rounds.hpp"
#include "cli/validators.hpp"
#include "cli/workload.hpp"
#include "common/log_level.hpp"
#include "fedwan/data_parallel.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site.hpp"
#include "workload/fashion_mnist.hpp"
#include "workload/fashion_model.hpp"
#include "workload/partition.hpp"

namespace fedwan::cli {
namespace {

using Clock = SiteReport::Clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Position of `node` among the topology's sites (its data shard).
size_t site_ordinal(const Topology& topo, const std::string& node) {
  size_t k = 0;
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) continue;
    if (n.id == node) return k;
    ++k;
  }
  throw ConfigError("node '" + node + "' is not a site of the topology");
}

SiteOptions site_options(const NodeArgs& a) {
  if (a.step_time_ms > 0 && a.workload.trainer != "synthetic") {
    throw ConfigError("--step-time-ms stands in for a training step with --trainer synthetic; "
                      "--trainer " +
                      a.workload.trainer + " times its own steps (drop --step-time-ms)");
  }
  if (a.ranks > 1 && (a.rank < 0 || a.rank >= a.ranks || a.rendezvous.empty())) {
    throw ConfigError("--ranks " + std::to_string(a.ranks) + " needs --rank in 0.." +
                      std::to_string(a.ranks - 1) + " and --rendezvous DIR");
  }
  if (a.ranks > 1 && a.workload.trainer == "synthetic") {
    throw ConfigError("--ranks > 1 trains fashion-cnn (the synthetic trainer has no gradients)");
  }
  SiteOptions o;
  o.topology = Topology::load(a.topology);
  keep_freed_memory_for_reuse(o.topology.federation().chunk_bytes);
  o.node_id = a.node;
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.join_timeout_s * 1000));
  o.security = security_options(a.security);
  o.checkpoint_dir = a.checkpoint_dir;
  o.checkpoint_budget = a.checkpoint_budget;
  o.page_out_from_bytes =
      a.page_out_from_mib < 0 ? SIZE_MAX : static_cast<size_t>(a.page_out_from_mib) << 20;
  o.costs_path = costs_path(a);
  o.metrics_bind = a.rank == 0 ? a.metrics : std::string();
  o.metrics_token_file = a.metrics_token_file;
  o.devices = static_cast<uint32_t>(a.ranks);
  return o;
}

int run_synthetic_site(const NodeArgs& a, SiteOptions o) {
  if (a.device == "cuda") {
    throw ConfigError("--device cuda trains fashion-cnn; the synthetic trainer runs on the CPU");
  }
  std::vector<float> params = initial_model(a.workload);
  const bool checkpointed = !o.checkpoint_dir.empty();
  SyntheticTraining training;
  training.params = &params;
  training.site_index = o.topology.node(a.node).index;
  training.seed = a.workload.seed;
  training.step_time_ms = a.step_time_ms;
  training.stop_requested = [] { return terminate_requested(); };
  bool left = false;
  training.leave_at_round = a.leave_at_round;
  training.left = &left;
  // Before the site first asks its parent (for its replica).
  if (!wait_for_go(a)) return 0;
  SiteCore site(std::move(o), params.data(), params.size());
  SiteCoreRegistration registered(&site);
  SiteReport report(a.report, a.node, a.step_time_ms);
  bool completed = false;
  try {
    const Clock::time_point join_started = Clock::now();
    const SyncResult joined = site.join();
    report.joined(join_started);
    completed = run_synthetic_rounds(site, joined, training, report);
  } catch (const StoppedError&) {
    // Stopped inside join() or a sync: checkpoint() below keeps the
    // round boundary's checkpoint when a sync was cut short.
  }
  if (!completed) {
    site.checkpoint();
    report.write(/*stopped=*/true);
    return stopped_by_signal(a.node, site.round(), checkpointed);
  }
  if (left) {
    report.write(/*stopped=*/false);
    log_always("info", "fedwan: site '" + a.node + "' left the federation at round " +
                           std::to_string(site.round()));
    linger_for_metrics(a);
    return 0;
  }
  if (!a.out.empty()) write_model(a.out, params.data(), params.size());
  report.write(/*stopped=*/false);
  linger_for_metrics(a);
  print_alarms("site '" + a.node + "'", site.alarms());
  return 0;
}

// This site's Fashion-MNIST samples, on the rank's device.
struct Shard {
  torch::Tensor images, labels;
  size_t ordinal = 0;  // the site's position among the topology's sites
};

Shard load_shard(const NodeArgs& a, const Topology& topo, const Placement& place) {
  const WorkloadSettings& w = a.workload;
  size_t num_sites = 0;
  for (const NodeSpec& n : topo.nodes()) num_sites += n.role == Role::kSite;
  Shard s;
  s.ordinal = site_ordinal(topo, a.node);
  // Keep only this site's samples (the full set is freed on return): the
  // shuffle permutes positions, so the minibatches are the same.
  const workload::FashionMnistData train =
      workload::load_fashion_mnist(workload::FashionMnistSet::kTrain, w.data_dir);
  const auto shards = workload::dirichlet_partition(
      train.label_bytes, workload::kFashionMnistClasses, num_sites, w.alpha, w.seed);
  const torch::Tensor rows = torch::tensor(
      std::vector<int64_t>(shards[s.ordinal].begin(), shards[s.ordinal].end()), torch::kInt64);
  s.images = train.images.index_select(0, rows).to(place.device());
  s.labels = train.labels.index_select(0, rows).to(place.device());
  return s;
}

// A multi-rank site: every rank holds the model, trains on its slice of
// each minibatch and averages the gradients with the others.
std::unique_ptr<SiteComm> rank_comm(const NodeArgs& a, const Placement& place) {
  if (a.ranks <= 1) return nullptr;
  SiteCommOptions c;
  c.rank = a.rank;
  c.size = a.ranks;
  c.rendezvous_dir = a.rendezvous;
  if (!a.rank_address.empty()) c.hostname = a.rank_address;
  c.name = a.node;
  c.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.join_timeout_s * 1000));
  return make_rank_comm(c, place);
}

// Trains until the federation is done (nullopt), or the site left or was
// stopped by a signal (the process's exit code).
std::optional<int> train_rounds(const NodeArgs& a, Site& site, workload::FashionCnn& model,
                                torch::optim::Optimizer& opt, workload::Trainer& trainer,
                                const std::function<void()>& average, SiteReport& report,
                                bool checkpointed) {
  try {
    const Clock::time_point join_started = Clock::now();
    site.join();
    report.joined(join_started);
    while (!site.finished()) {
      if (a.leave_at_round && site.round() >= *a.leave_at_round) {
        site.leave();
        report.write(/*stopped=*/false);
        log_always("info", "fedwan: site '" + a.node + "' rank " + std::to_string(a.rank) +
                               " left the federation at round " + std::to_string(site.round()));
        linger_for_metrics(a);
        return 0;
      }
      const Clock::time_point step_started = Clock::now();
      trainer.step(model, opt, average, a.rank, a.ranks);
      const uint64_t round = site.round();
      const Clock::time_point sync_started = Clock::now();
      const std::optional<SyncResult> synced = site.step();
      if (synced && !synced->resynced) {
        report.trained(std::chrono::duration<double>(sync_started - step_started).count());
        report.synced(round, sync_started, *synced);
      } else {
        report.trained(seconds_since(step_started));
      }
      if (terminate_requested()) {
        site.checkpoint();
        report.write(/*stopped=*/true);
        return stopped_by_signal(a.node, site.round(), checkpointed && site.leader());
      }
    }
  } catch (const std::exception&) {
    // The leader was stopped inside join() or sync() (StoppedError), or,
    // on another rank, the leader's process ended under the same signal
    // and the site's collective failed.
    if (!terminate_requested()) throw;
    site.checkpoint();
    report.write(/*stopped=*/true);
    return stopped_by_signal(a.node, site.round(), checkpointed && site.leader());
  }
  return std::nullopt;
}

int run_fashion_site(const NodeArgs& a, SiteOptions o) {
  // Before the data is loaded: a rank that cannot have the device it was
  // told to use fails at once.
  const Placement place = place_rank(a.device, a.rank, a.ranks);
  Shard shard = load_shard(a, o.topology, place);
  std::vector<int64_t> indices(static_cast<size_t>(shard.images.size(0)));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i);
  // Drawn on the CPU (the same bits on every node), then moved; the
  // optimizer is built over the moved parameters.
  workload::FashionCnn model = workload::make_fashion_cnn(a.workload.seed);
  model->to(place.device());
  std::unique_ptr<torch::optim::Optimizer> opt = make_inner_optimizer(*model, a.workload);
  std::unique_ptr<SiteComm> comm = rank_comm(a, place);
  log_always("info", "fedwan: site '" + a.node + "' rank " + std::to_string(a.rank) + " of " +
                         std::to_string(a.ranks) + " trains on " + place.describe() +
                         (comm ? std::string(" (site communicator: ") + comm->engine() + ")"
                               : std::string()));
  const bool checkpointed = !o.checkpoint_dir.empty();
  // Before the site first asks its parent (for its replica).
  if (!wait_for_go(a)) return 0;
  Site site(std::move(o), *model, opt.get(), comm.get());
  SiteCoreRegistration registered(site.leader() ? &site.core() : nullptr);
  std::unique_ptr<DataParallel> dp;
  if (comm) {
    dp = std::make_unique<DataParallel>(*model, *comm);
    dp->broadcast_parameters();
  }
  workload::Trainer trainer(shard.images, shard.labels, std::move(indices), a.workload.batch_size,
                            a.workload.seed * 1000 + shard.ordinal);
  const std::function<void()> average = [&] {
    if (dp) dp->synchronize();
  };
  SiteReport report(site.leader() ? a.report : std::string(), a.node, a.step_time_ms);
  if (auto ended = train_rounds(a, site, model, *opt, trainer, average, report, checkpointed)) {
    return *ended;
  }
  if (!a.out.empty() && site.leader()) {
    const torch::Tensor model_on_host = site.parameters().flat().to(torch::kCPU);
    write_model(a.out, model_on_host.data_ptr<float>(), site.parameters().numel());
  }
  if (site.leader()) print_alarms("site '" + a.node + "'", site.core().alarms());
  report.write(/*stopped=*/false);
  linger_for_metrics(a);
  return 0;
}

int run_site(const NodeArgs& a) {
  set_log_node(a.node);
  torch::set_num_threads(1);
  SiteOptions o = site_options(a);
  install_signal_handlers();
  if (a.workload.trainer == "synthetic") return run_synthetic_site(a, std::move(o));
  return run_fashion_site(a, std::move(o));
}

}  // namespace

void add_site_command(CLI::App& app, NodeArgs& args, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("site", "run a site, or one rank of a multi-rank site");
  add_node_flags(*cmd, args);
  cmd->add_option("--ranks", args.ranks,
                  "ranks in the site (processes, gradients averaged every step: over NCCL on "
                  "GPUs, Gloo on the CPU); rank 0 talks to the federation")
      ->check(number_in(1, 1024))
      ->capture_default_str();
  cmd->add_option("--rank", args.rank, "this process's rank in the site, 0 .. ranks-1")
      ->check(number_in(0, 1023))
      ->capture_default_str();
  cmd->add_option("--rendezvous", args.rendezvous,
                  "with --ranks > 1: a fresh directory every rank of the site can reach");
  cmd->add_option("--rank-address", args.rank_address,
                  "with --ranks > 1: the address this rank listens on for the site's other ranks "
                  "(ranks on several machines: this machine's address on their network, with "
                  "--rendezvous on a shared file system); default 127.0.0.1");
  cmd->add_option("--device", args.device,
                  "where this rank trains: cuda (GPU rank % GPUs; model and batches on it, NCCL "
                  "between the ranks), cpu, or auto (cuda when this build, the machine and "
                  "LibTorch have CUDA and there is a GPU per rank; else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--report", args.report,
                  "write a JSON report here at the end (also when stopped by a signal): per "
                  "round the training and sync wall time and bytes sent and received, the "
                  "totals and the utilisation (training time / wall time since joining); with "
                  "--trainer synthetic also the training's CPU time (train_cpu_s)");
  cmd->add_option("--join-after-file", args.join_after_file,
                  "load the data, then wait until this file exists before contacting the "
                  "federation (a launcher's go signal, e.g. for a late_join site)");
  cmd->add_option("--leave-at-round", args.leave_at_round,
                  "leave the federation gracefully when this round begins (the parent stops "
                  "waiting for the site at once and counts it out of the quorum); rounds count "
                  "from 0, so 0 leaves right after joining, before training; unset: never");
  cmd->add_option("--step-time-ms", args.step_time_ms,
                  "with --trainer synthetic: each inner step takes this many milliseconds of "
                  "wall time without using the CPU (a GPU's step on a machine without one); "
                  "the model moves one synthetic step per round. 0: off")
      ->check(number_in(0, 600000, /*integer=*/false))
      ->capture_default_str();
  cmd->add_option("--checkpoint-budget", args.checkpoint_budget,
                  "the share of the site's time whole checkpoints may take: over 64 MiB, one "
                  "is written once the time since the last is its cost over this, and the "
                  "replica image at the round boundaries between; 1: every boundary")
      ->check(number_in(1e-6, 1, /*integer=*/false))
      ->capture_default_str();
  cmd->add_option("--page-out-from-mib", args.page_out_from_mib,
                  "for a model of at least this many MiB (fp32), keep the anchor (one fp32 "
                  "copy beside the parameters) in a file the kernel pages in and out and the "
                  "update's frames on disk (in --checkpoint-dir, else the temporary "
                  "directory), not in the site's memory; 0: always; -1: never")
      ->check(number_in(-1, 1 << 30))
      ->capture_default_str();
  cmd->callback([&args, exit_code] { *exit_code = run_site(args); });
}

}  // namespace fedwan::cli

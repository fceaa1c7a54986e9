// `fedwan aggregator` and `fedwan site`: one node of a real deployment.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include <torch/utils.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/placement.hpp"
#include "cli/site_report.hpp"
#include "cli/synthetic_rounds.hpp"
#include "cli/validators.hpp"
#include "common/atomic_file.hpp"
#include "common/log_level.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/data_parallel.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site.hpp"
#include "fedwan/synthetic.hpp"
#include "workload/fashion_mnist.hpp"
#include "workload/fashion_model.hpp"
#include "workload/partition.hpp"

namespace fedwan::cli {

using workload::FashionMnistData;
using workload::FashionMnistSet;
using workload::load_fashion_mnist;
using workload::FashionCnn;
using workload::make_fashion_cnn;
using workload::Trainer;
using workload::Evaluation;
using workload::evaluate;
namespace {

// SIGTERM/SIGINT: an aggregator stops at once (its last round boundary is
// checkpointed); a site finishes its current step or sync, checkpoints and
// exits. Both exit 0. Only lock-free atomics are touched in the handler.
std::atomic<bool> g_terminate{false};
std::atomic<Aggregator*> g_aggregator{nullptr};
// A site blocked in join() or sync() (its parent gone, say) would otherwise
// notice the signal only at its round timeout.
std::atomic<SiteCore*> g_site_core{nullptr};
static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<SiteCore*>::is_always_lock_free);

// A site in the middle of a sync may finish its round for this long (its
// local work is then checkpointed); joining, or a parent that does not
// answer, ends it sooner.
constexpr std::chrono::milliseconds kSyncGrace{5000};

extern "C" void on_terminate_signal(int) {
  g_terminate.store(true);
  if (Aggregator* a = g_aggregator.load()) a->stop();
  if (SiteCore* c = g_site_core.load()) c->stop(kSyncGrace);
}

// Clears g_site_core when the site goes out of scope.
struct SiteCoreRegistration {
  explicit SiteCoreRegistration(SiteCore* c) {
    g_site_core.store(c);
    // A signal that came before the site existed still stops it.
    if (c != nullptr && g_terminate.load()) c->stop(kSyncGrace);
  }
  ~SiteCoreRegistration() { g_site_core.store(nullptr); }
  SiteCoreRegistration(const SiteCoreRegistration&) = delete;
  SiteCoreRegistration& operator=(const SiteCoreRegistration&) = delete;
};

int stopped_by_signal(const std::string& node, uint64_t round, bool checkpointed) {
  log_always("warning", "fedwan: site '" + node + "' stopped by signal at round " +
                            std::to_string(round) +
                            (checkpointed ? "; it resumes from its last checkpoint" : ""));
  return 0;
}

using Clock = SiteReport::Clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_terminate_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void add_node_flags(CLI::App& cmd, NodeArgs& a) {
  cmd.add_option("--topology", a.topology, "topology YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd.add_option("--node", a.node, "this node's id in the topology")->required();
  cmd.add_option("--out", a.out, "write the final model here (raw little-endian fp32)");
  cmd.add_option("--join-timeout", a.join_timeout_s, "seconds to wait for the tree to form")
      ->check(number_in(0.1, 7 * 86400, /*integer=*/false))
      ->capture_default_str();
  cmd.add_option("--costs", a.costs,
                 "append this node's per-round cost records (JSON lines; `fedwan costs` bills "
                 "them) here; default <checkpoint-dir>/costs.jsonl, none without either");
  cmd.add_option("--metrics", a.metrics,
                 "serve Prometheus metrics (/metrics) and the JSON status (/status) over HTTP "
                 "at host:port (port 0: any free one); default the topology's `metrics` of "
                 "this node, none without it");
  cmd.add_option("--metrics-token-file", a.metrics_token_file,
                 "require `Authorization: Bearer <token>` on the metrics endpoint, the token "
                 "read from this file (owner-only, e.g. mode 0400; at least 16 characters)")
      ->check(CLI::ExistingFile);
  cmd.add_option("--metrics-linger", a.metrics_linger_s,
                 "after the node finished, keep serving its metrics this many seconds (so a "
                 "scraper gets the final values)")
      ->check(number_in(0, 3600, /*integer=*/false))
      ->capture_default_str();
  cmd.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "write a checkpoint here at every round boundary; resume from it on restart");
  add_security_flags(cmd, a.security);
  add_workload_flags(cmd, a.workload);
}

// A finished node keeps its metrics endpoint up for --metrics-linger (a
// signal cuts it short).
void linger_for_metrics(const NodeArgs& a) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(a.metrics_linger_s * 1000));
  while (std::chrono::steady_clock::now() < until && !g_terminate.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// --join-after-file: waits for the launcher's go. False when a signal
// ended the wait (the site never joined: it exits like a stopped one).
bool wait_for_go(const NodeArgs& a) {
  if (a.join_after_file.empty()) return true;
  std::error_code ec;
  while (!std::filesystem::exists(a.join_after_file, ec) && !g_terminate.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!g_terminate.load()) return true;
  log_always("warning", "fedwan: site '" + a.node + "' stopped by signal before it joined");
  return false;
}

// --costs, else <checkpoint-dir>/costs.jsonl, else none.
std::string costs_path(const NodeArgs& a) {
  if (!a.costs.empty() || a.checkpoint_dir.empty()) return a.costs;
  return (std::filesystem::path(a.checkpoint_dir) / "costs.jsonl").string();
}

SecurityOptions security_options(const SecurityArgs& s) {
  SecurityOptions o;
  o.credentials_dir = s.credentials;
  o.insecure_plaintext = s.insecure_plaintext;
  o.cipher = s.cipher;
  o.audit_log = s.audit_log;
  return o;
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= 10'000'000) {
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  }
  return buf;
}

// What the node rode out that an operator must act on (docs/operations.md).
void print_alarms(const std::string& who, const std::vector<std::string>& alarms) {
  for (const std::string& a : alarms) log_always("error", "fedwan: " + who + " alarm: " + a);
}

// A standby that stood by to the end and never took over: no model, no report.
bool stood_by_only(const AggregatorSummary& s) { return s.global_model.empty(); }

int run_aggregator(const NodeArgs& a) {
  set_log_node(a.node);
  torch::set_num_threads(1);
  AggregatorOptions o;
  o.topology = Topology::load(a.topology);
  o.topology_file = a.topology;
  o.node_id = a.node;
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.join_timeout_s * 1000));
  o.security = security_options(a.security);
  o.checkpoint_dir = a.checkpoint_dir;
  o.costs_path = costs_path(a);
  o.metrics_bind = a.metrics;
  o.metrics_token_file = a.metrics_token_file;
  o.record_updates_dir = a.record_updates;
  o.standby = a.standby;
  const NodeSpec& self = o.topology.node(a.node);
  const bool root = self.role == Role::kRoot;
  const uint64_t rounds = o.topology.federation().rounds;

  // Root: evaluation of the global model every round (fashion-cnn).
  std::optional<FashionMnistData> test;
  FashionCnn model{nullptr};
  std::optional<FlatParameters> flat;
  std::map<uint64_t, Evaluation> evals;
  nlohmann::json rounds_json = nlohmann::json::array();
  if (!a.initial_model.empty() && a.eval) {
    throw ConfigError("--eval evaluates the fashion-cnn model; a model from --initial-model "
                      "is evaluated by its own code (the root's --out file is the final model)");
  }
  // A region given the same starting model as the root joins without being
  // sent it in full (a different one is harmless: it is sent).
  o.initial_model =
      a.initial_model.empty() ? initial_model(a.workload) : read_model(a.initial_model);
  if (root) {
    if (a.eval && a.workload.trainer == "fashion-cnn") {
      test = load_fashion_mnist(FashionMnistSet::kTest, a.workload.data_dir);
      model = make_fashion_cnn(a.workload.seed);
      flat.emplace(*model);
      o.on_model = [&](uint64_t round, const std::vector<float>& global) {
        std::memcpy(flat->data(), global.data(), global.size() * sizeof(float));
        evals[round] = evaluate(model, test->images, test->labels);
      };
    }
    o.on_round = [&](const RoundReport& r) {
      nlohmann::json row = {{"round", r.round},           {"wan_bytes", r.wan_bytes},
                            {"fp32_bytes", r.fp32_bytes}, {"seconds", r.seconds},
                            {"frames", r.frames},         {"weight", r.weight}};
      char line[256];
      auto it = evals.find(r.round);
      if (it != evals.end()) {
        row["accuracy"] = it->second.accuracy;
        row["loss"] = it->second.loss;
        std::snprintf(line, sizeof line,
                      "round %3llu/%llu  accuracy %.4f  loss %.4f  wan %s (fp32 %s)  %.2f s",
                      static_cast<unsigned long long>(r.round + 1),
                      static_cast<unsigned long long>(rounds), it->second.accuracy, it->second.loss,
                      human_bytes(r.wan_bytes).c_str(), human_bytes(r.fp32_bytes).c_str(),
                      r.seconds);
      } else {
        std::snprintf(line, sizeof line, "round %3llu/%llu  wan %s (fp32 %s)  %.2f s",
                      static_cast<unsigned long long>(r.round + 1),
                      static_cast<unsigned long long>(rounds), human_bytes(r.wan_bytes).c_str(),
                      human_bytes(r.fp32_bytes).c_str(), r.seconds);
      }
      std::cout << line << std::endl;
      rounds_json.push_back(row);
    };
  }
  Aggregator agg(std::move(o));
  install_signal_handlers();
  g_aggregator.store(&agg);
  if (g_terminate.load()) agg.stop();  // a signal that came while it was built
  AggregatorSummary s;
  try {
    s = agg.run();
  } catch (const Error&) {
    g_aggregator.store(nullptr);
    if (!g_terminate.load()) throw;
    log_always("warning",
               "fedwan: aggregator '" + a.node + "' stopped by signal" +
                   (a.checkpoint_dir.empty() ? "" : "; it resumes from its last checkpoint"));
    return 0;
  }
  g_aggregator.store(nullptr);
  print_alarms("aggregator '" + a.node + "'", s.alarms);
  if (root && stood_by_only(s)) {
    std::cout << "standby '" << a.node << "': the root finished the federation without it\n";
    return 0;
  }
  if (root && !a.out.empty()) write_model(a.out, s.global_model.data(), s.global_model.size());
  if (root && !a.report.empty()) {
    // In round order: a round whose report waited (a region that died took
    // its telemetry with it) comes after later ones.
    std::stable_sort(rounds_json.begin(), rounds_json.end(),
                     [](const nlohmann::json& x, const nlohmann::json& y) {
                       return x["round"].get<uint64_t>() < y["round"].get<uint64_t>();
                     });
    nlohmann::json j = {{"rounds", rounds_json},
                        {"wan_bytes_total", s.wan_bytes_total},
                        {"fp32_bytes_total", s.fp32_bytes_total},
                        {"rejected_frames", s.rejected_frames},
                        {"security", s.security_mode},
                        {"handshake_ms", s.handshake_ms},
                        {"alarms", s.alarms}};
    if (!rounds_json.empty() && rounds_json.back().contains("accuracy")) {
      j["final_accuracy"] = rounds_json.back()["accuracy"];
      j["final_loss"] = rounds_json.back()["loss"];
    }
    write_file_atomic(a.report, j.dump(2) + "\n", 0600);  // a node's record: its own only
  }
  linger_for_metrics(a);
  return 0;
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

int run_site(const NodeArgs& a) {
  set_log_node(a.node);
  torch::set_num_threads(1);
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
  o.node_id = a.node;
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.join_timeout_s * 1000));
  o.security = security_options(a.security);
  o.checkpoint_dir = a.checkpoint_dir;
  o.costs_path = costs_path(a);
  o.metrics_bind = a.rank == 0 ? a.metrics : std::string();
  o.metrics_token_file = a.metrics_token_file;
  o.devices = static_cast<uint32_t>(a.ranks);
  install_signal_handlers();
  const WorkloadSettings& w = a.workload;

  if (w.trainer == "synthetic") {
    if (a.device == "cuda") {
      throw ConfigError("--device cuda trains fashion-cnn; the synthetic trainer runs on the CPU");
    }
    std::vector<float> params = initial_model(w);
    const bool checkpointed = !o.checkpoint_dir.empty();
    SyntheticTraining training;
    training.params = &params;
    training.site_index = o.topology.node(a.node).index;
    training.seed = w.seed;
    training.step_time_ms = a.step_time_ms;
    training.stop_requested = [] { return g_terminate.load(); };
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

  // Before the data is loaded: a rank that cannot have the device it was
  // told to use fails at once.
  const Placement place = place_rank(a.device, a.rank, a.ranks);
  size_t num_sites = 0;
  for (const NodeSpec& n : o.topology.nodes()) num_sites += n.role == Role::kSite;
  const size_t ordinal = site_ordinal(o.topology, a.node);
  // Keep only this site's samples (the full set is freed at the end of the
  // block): the shuffle permutes positions, so the minibatches are the same.
  torch::Tensor images, labels;
  {
    const FashionMnistData train = load_fashion_mnist(FashionMnistSet::kTrain, w.data_dir);
    const auto shards = workload::dirichlet_partition(
        train.label_bytes, workload::kFashionMnistClasses, num_sites, w.alpha, w.seed);
    const torch::Tensor rows = torch::tensor(
        std::vector<int64_t>(shards[ordinal].begin(), shards[ordinal].end()), torch::kInt64);
    images = train.images.index_select(0, rows).to(place.device());
    labels = train.labels.index_select(0, rows).to(place.device());
  }
  std::vector<int64_t> indices(static_cast<size_t>(images.size(0)));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i);
  // Drawn on the CPU (the same bits on every node), then moved; the
  // optimizer is built over the moved parameters.
  FashionCnn model = make_fashion_cnn(w.seed);
  model->to(place.device());
  std::unique_ptr<torch::optim::Optimizer> opt = make_inner_optimizer(*model, w);
  // A multi-rank site: every rank holds the model, trains on its slice of
  // each minibatch and averages the gradients with the others.
  std::unique_ptr<SiteComm> comm;
  std::unique_ptr<DataParallel> dp;
  if (a.ranks > 1) {
    SiteCommOptions c;
    c.rank = a.rank;
    c.size = a.ranks;
    c.rendezvous_dir = a.rendezvous;
    if (!a.rank_address.empty()) c.hostname = a.rank_address;
    c.name = a.node;
    c.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.join_timeout_s * 1000));
    comm = make_rank_comm(c, place);
  }
  log_always("info", "fedwan: site '" + a.node + "' rank " + std::to_string(a.rank) + " of " +
                         std::to_string(a.ranks) + " trains on " + place.describe() +
                         (comm ? std::string(" (site communicator: ") + comm->engine() + ")"
                               : std::string()));
  const bool checkpointed = !o.checkpoint_dir.empty();
  // Before the site first asks its parent (for its replica).
  if (!wait_for_go(a)) return 0;
  Site site(std::move(o), *model, opt.get(), comm.get());
  SiteCoreRegistration registered(site.leader() ? &site.core() : nullptr);
  if (comm) {
    dp = std::make_unique<DataParallel>(*model, *comm);
    dp->broadcast_parameters();
  }
  Trainer trainer(images, labels, std::move(indices), w.batch_size, w.seed * 1000 + ordinal);
  const std::function<void()> average = [&] {
    if (dp) dp->synchronize();
  };
  SiteReport report(site.leader() ? a.report : std::string(), a.node, a.step_time_ms);
  try {
    const Clock::time_point join_started = Clock::now();
    site.join();
    report.joined(join_started);
    while (!site.finished()) {
      if (a.leave_at_round > 0 && site.round() >= a.leave_at_round) {
        site.leave();
        report.write(/*stopped=*/false);
        log_always("info", "fedwan: site '" + a.node + "' rank " + std::to_string(a.rank) +
                               " left the federation at round " + std::to_string(site.round()));
        linger_for_metrics(a);
        return 0;
      }
      const Clock::time_point step_started = Clock::now();
      trainer.step(model, *opt, average, a.rank, a.ranks);
      const uint64_t round = site.round();
      const Clock::time_point sync_started = Clock::now();
      const std::optional<SyncResult> synced = site.step();
      if (synced && !synced->resynced) {
        report.trained(std::chrono::duration<double>(sync_started - step_started).count());
        report.synced(round, sync_started, *synced);
      } else {
        report.trained(seconds_since(step_started));
      }
      if (g_terminate.load()) {
        site.checkpoint();
        report.write(/*stopped=*/true);
        return stopped_by_signal(a.node, site.round(), checkpointed && site.leader());
      }
    }
  } catch (const std::exception&) {
    // The leader was stopped inside join() or sync() (StoppedError), or,
    // on another rank, the leader's process ended under the same signal
    // and the site's collective failed.
    if (!g_terminate.load()) throw;
    site.checkpoint();
    report.write(/*stopped=*/true);
    return stopped_by_signal(a.node, site.round(), checkpointed && site.leader());
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

}  // namespace

void add_security_flags(CLI::App& cmd, SecurityArgs& s) {
  cmd.add_option("--credentials", s.credentials,
                 "this node's credentials bundle (DIR/<node-id> from `fedwan certs init`)")
      ->envname("FEDWAN_CREDENTIALS");
  cmd.add_flag("--insecure-plaintext", s.insecure_plaintext,
               "run links WITHOUT authentication or encryption (loopback experiments only; "
               "secure nodes refuse this node)");
  cmd.add_option("--cipher", s.cipher,
                 "frame cipher on the link to the parent: aes-256-gcm, "
                 "chacha20-poly1305")
      ->capture_default_str();
  cmd.add_option("--audit-log", s.audit_log, "append the hash-chained audit log to this file");
}

// 0600: a model trained on a site's data is as private as its checkpoints.
void write_model(const std::string& path, const float* data, size_t n) {
  write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(data), n * sizeof(float)),
                    0600);
}

std::vector<float> read_model(const std::string& path) {
  constexpr size_t kMaxModelValues = size_t{1} << 30;
  ReadFileOptions options;
  options.what = "model file";
  options.max_bytes = kMaxModelValues * sizeof(float);
  options.too_large_hint = "fedwan federates models of up to 2^30 parameters";
  const std::string bytes = read_file(path, options);
  if (bytes.empty() || bytes.size() % sizeof(float) != 0) {
    throw ConfigError("model file " + path + " holds " + std::to_string(bytes.size()) +
                      " bytes; a model is raw little-endian fp32 values (4 bytes each, at "
                      "least one), as `--out` writes it");
  }
  std::vector<float> model(bytes.size() / sizeof(float));
  std::memcpy(model.data(), bytes.data(), bytes.size());
  for (size_t i = 0; i < model.size(); ++i) {
    if (!std::isfinite(model[i])) {
      throw ConfigError("model file " + path + ": value " + std::to_string(i) +
                        " is not finite; a federation cannot start from it");
    }
  }
  return model;
}

void add_aggregator_command(CLI::App& app, NodeArgs& args, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("aggregator", "run a root or region aggregator");
  add_node_flags(*cmd, args);
  cmd->add_flag("--eval", args.eval, "root: evaluate the global model on the test set each round");
  cmd->add_option("--report", args.report, "root: write a JSON report of the rounds here");
  cmd->add_option("--initial-model", args.initial_model,
                  "root: start from this model (raw little-endian fp32, e.g. a Python "
                  "model's flattened parameters) instead of the --trainer's; region: the "
                  "same file spares the WAN sending it the model when it joins");
  cmd->add_option("--record-updates", args.record_updates,
                  "keep every update payload received here, named by its SHA-256 as the audit "
                  "log records it (audit replay)");
  cmd->add_flag("--standby", args.standby,
                "root: run as its standby (topology standby_endpoint, the root's credentials, "
                "--checkpoint-dir): keep the root's checkpoints, take over when it dies");
  cmd->callback([&args, exit_code] { *exit_code = run_aggregator(args); });
}

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
                  "totals and the utilisation (training time / wall time since joining)");
  cmd->add_option("--join-after-file", args.join_after_file,
                  "load the data, then wait until this file exists before contacting the "
                  "federation (a launcher's go signal, e.g. for a late_join site)");
  cmd->add_option("--leave-at-round", args.leave_at_round,
                  "leave the federation gracefully when this round begins (the parent stops "
                  "waiting for the site at once and counts it out of the quorum); 0: never")
      ->capture_default_str();
  cmd->add_option("--step-time-ms", args.step_time_ms,
                  "with --trainer synthetic: each inner step takes this many milliseconds of "
                  "wall time without using the CPU (a GPU's step on a machine without one); "
                  "the model moves one synthetic step per round. 0: off")
      ->check(number_in(0, 600000, /*integer=*/false))
      ->capture_default_str();
  cmd->callback([&args, exit_code] { *exit_code = run_site(args); });
}

}  // namespace fedwan::cli

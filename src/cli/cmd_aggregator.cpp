// `fedwan aggregator` and `fedwan-aggregator`: a root or region aggregator
// of a real deployment (the root also evaluates the global model and writes
// the rounds' report). Free of LibTorch: what needs it comes in
// AggregatorTorch (cli/commands.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/node_common.hpp"
#include "common/atomic_file.hpp"
#include "common/log_level.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "fedwan/synthetic.hpp"

namespace fedwan::cli {
namespace {

AggregatorOptions aggregator_options(const NodeArgs& a, const AggregatorTorch& torch) {
  AggregatorOptions o;
  o.topology = Topology::load(a.topology);
  keep_freed_memory_for_reuse(o.topology.federation().chunk_bytes);
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
  o.pace_uploads = !a.no_pace;
  o.replica_max_bytes = a.replica_max_mib << 20;
  if (!a.initial_model.empty() && a.eval) {
    throw ConfigError("--eval evaluates the fashion-cnn model; a model from --initial-model "
                      "is evaluated by its own code (the root's --out file is the final model)");
  }
  // A region given the same starting model as the root joins without being
  // sent it in full (a different one is harmless: it is sent).
  if (!a.initial_model.empty()) {
    o.initial_model = read_model(a.initial_model);
  } else if (torch.initial_model) {
    o.initial_model = torch.initial_model(a.workload);
  } else if (a.workload.trainer == "synthetic") {
    o.initial_model = synthetic::initial_model(a.workload.synthetic_size, a.workload.seed);
  } else {
    throw ConfigError("this program has no LibTorch to build the " + a.workload.trainer +
                      " model: give --initial-model (the model's raw fp32), or run `fedwan "
                      "aggregator`");
  }
  return o;
}

// The root's record of the rounds: the global model evaluated every round
// (--eval, fashion-cnn), a line per round on stdout, and the JSON report.
class RootRecord {
 public:
  RootRecord(const NodeArgs& a, uint64_t rounds, const AggregatorTorch& torch) : rounds_(rounds) {
    if (a.eval && a.workload.trainer == "fashion-cnn") {
      if (!torch.evaluator) {
        throw ConfigError("--eval evaluates the fashion-cnn model with LibTorch, which this "
                          "program has not: run `fedwan aggregator`");
      }
      evaluate_ = torch.evaluator(a.workload);
    }
  }

  void attach(AggregatorOptions& o) {
    if (evaluate_) {
      o.on_model = [this](uint64_t round, const std::vector<float>& global) {
        evals_[round] = evaluate_(global);
      };
    }
    o.on_round = [this](const RoundReport& r) { on_round(r); };
  }

  void write_report(const std::string& path, const AggregatorSummary& s) {
    // In round order: a round whose report waited (a region that died took
    // its telemetry with it) comes after later ones.
    std::stable_sort(rows_.begin(), rows_.end(),
                     [](const nlohmann::json& x, const nlohmann::json& y) {
                       return x["round"].get<uint64_t>() < y["round"].get<uint64_t>();
                     });
    nlohmann::json j = {{"rounds", rows_},
                        {"wan_bytes_total", s.wan_bytes_total},
                        {"fp32_bytes_total", s.fp32_bytes_total},
                        {"rejected_frames", s.rejected_frames},
                        {"chunks_parked", s.chunks_parked},
                        {"parked_bytes", s.parked_bytes},
                        {"security", s.security_mode},
                        {"handshake_ms", s.handshake_ms},
                        {"alarms", s.alarms}};
    if (s.privacy_epsilon > 0) {
      j["privacy_epsilon"] = s.privacy_epsilon;
      j["privacy_clipped"] = s.privacy_clipped;
    }
    if (!rows_.empty() && rows_.back().contains("accuracy")) {
      j["final_accuracy"] = rows_.back()["accuracy"];
      j["final_loss"] = rows_.back()["loss"];
    }
    write_file_atomic(path, j.dump(2) + "\n", 0600);  // a node's record: its own only
  }

 private:
  void on_round(const RoundReport& r) {
    nlohmann::json row = {{"round", r.round},           {"wan_bytes", r.wan_bytes},
                          {"fp32_bytes", r.fp32_bytes}, {"seconds", r.seconds},
                          {"frames", r.frames},         {"weight", r.weight}};
    if (!r.replica_bytes.empty()) row["replica_bytes"] = r.replica_bytes;
    char line[256];
    const auto round = static_cast<unsigned long long>(r.round + 1);
    const auto rounds = static_cast<unsigned long long>(rounds_);
    auto it = evals_.find(r.round);
    if (it != evals_.end()) {
      row["accuracy"] = it->second.first;
      row["loss"] = it->second.second;
      std::snprintf(line, sizeof line,
                    "round %3llu/%llu  accuracy %.4f  loss %.4f  wan %s (fp32 %s)  %.2f s", round,
                    rounds, it->second.first, it->second.second, human_bytes(r.wan_bytes).c_str(),
                    human_bytes(r.fp32_bytes).c_str(), r.seconds);
    } else {
      std::snprintf(line, sizeof line, "round %3llu/%llu  wan %s (fp32 %s)  %.2f s", round, rounds,
                    human_bytes(r.wan_bytes).c_str(), human_bytes(r.fp32_bytes).c_str(), r.seconds);
    }
    std::cout << line << std::endl;
    rows_.push_back(row);
  }

  uint64_t rounds_;
  AggregatorTorch::Evaluate evaluate_;
  std::map<uint64_t, std::pair<double, double>> evals_;  // accuracy, loss
  nlohmann::json rows_ = nlohmann::json::array();
};

// A standby that stood by to the end and never took over: no model, no report.
bool stood_by_only(const AggregatorSummary& s) { return s.global_model.empty(); }

int run_aggregator(const NodeArgs& a, const AggregatorTorch& torch) {
  set_log_node(a.node);
  if (torch.single_thread) torch.single_thread();
  AggregatorOptions o = aggregator_options(a, torch);
  const bool root = o.topology.node(a.node).role == Role::kRoot;
  std::optional<RootRecord> record;
  if (root) {
    record.emplace(a, o.topology.rounds_to_run(), torch);
    record->attach(o);
  }
  Aggregator agg(std::move(o));
  install_signal_handlers();
  AggregatorSummary s;
  {
    AggregatorRegistration registered(agg);
    try {
      s = agg.run();
    } catch (const Error&) {
      if (!terminate_requested()) throw;
      log_always("warning",
                 "fedwan: aggregator '" + a.node + "' stopped by signal" +
                     (a.checkpoint_dir.empty() ? "" : "; it resumes from its last checkpoint"));
      return 0;
    }
  }
  print_alarms("aggregator '" + a.node + "'", s.alarms);
  if (root && stood_by_only(s)) {
    std::cout << "standby '" << a.node << "': the root finished the federation without it\n";
    return 0;
  }
  if (root && !a.out.empty()) write_model(a.out, s.global_model.data(), s.global_model.size());
  if (root && !a.report.empty()) record->write_report(a.report, s);
  linger_for_metrics(a);
  return 0;
}

}  // namespace

void add_aggregator_command(CLI::App& app, NodeArgs& args, int* exit_code,
                            const AggregatorTorch& torch) {
  configure_aggregator(*app.add_subcommand("aggregator", "run a root or region aggregator"), args,
                       exit_code, torch);
}

void configure_aggregator(CLI::App& app, NodeArgs& args, int* exit_code,
                          const AggregatorTorch& torch) {
  CLI::App* cmd = &app;
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
  cmd->add_flag("--no-pace", args.no_pace,
                "do not pace the sites' uploads (each sends as fast as its link takes it; "
                "chunks that run ahead wait on disk for their last copies)");
  cmd->add_option("--replica-max-mib", args.replica_max_mib,
                  "the largest checkpoint replica a child may send here, in MiB; a larger one "
                  "is refused before it is written (default 0: 16 fp32 models plus 64 MiB)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  cmd->callback([&args, exit_code, torch] { *exit_code = run_aggregator(args, torch); });
}

}  // namespace fedwan::cli

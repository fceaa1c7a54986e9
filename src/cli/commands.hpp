// The subcommands of the `fedwan` tool. Each registers its flags on a CLI11
// subcommand and returns the process exit code when run.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/workload_settings.hpp"
#include "fedwan/topology.hpp"

namespace CLI {
class App;
}

namespace fedwan::cli {

// How a node protects its links (see fedwan/security.hpp).
struct SecurityArgs {
  std::string credentials;  // this node's bundle directory
  bool insecure_plaintext = false;
  std::string cipher = "aes-256-gcm";
  std::string audit_log;
};
void add_security_flags(CLI::App& cmd, SecurityArgs& s);
// --ca and --crl (existing files) on a command that checks signatures
// against the federation CA; the help says what each does there.
void add_ca_flags(CLI::App& cmd, std::string& ca, std::string& crl, const std::string& ca_help,
                  const std::string& crl_help);
// SecurityOptions from the flags.

struct NodeArgs {
  std::string topology;
  std::string node;
  std::string report;         // JSON report path (root: rounds; site: its timings and traffic)
  std::string out;            // write the final model (raw little-endian fp32) here
  std::string initial_model;  // root: start from this raw little-endian fp32 model
  bool eval = false;          // root: evaluate the global model every round
  double join_timeout_s = 300;
  std::string checkpoint_dir;      // local checkpoints; resumed from when present
  std::string costs;               // per-round cost records; default <checkpoint_dir>/costs.jsonl
  std::string metrics;             // host:port of the metrics endpoint; default the topology's
  std::string metrics_token_file;  // the bearer token the metrics endpoint requires
  double metrics_linger_s = 0;     // keep serving metrics this long after the node finished
  std::string record_updates;      // aggregators: keep received update payloads here
  bool standby = false;            // root: run as its standby
  bool no_pace = false;            // aggregator: do not pace the sites' uploads
  uint64_t replica_max_mib = 0;    // aggregator: largest child replica kept; 0: 16 models + 64
  int rank = 0;                    // sites: this process's rank in the site
  int ranks = 1;                   // sites: ranks in the site
  std::string rendezvous;          // sites with ranks > 1: where the ranks meet
  std::string rank_address;        // sites with ranks > 1: this rank's address for the others
  std::string device = "auto";     // sites: auto | cpu | cuda (see cli/placement.hpp)
  // Sites, synthetic trainer: wall-clock milliseconds each inner step takes
  // (a GPU's step stood in for by a sleep); 0: as fast as the CPU goes.
  double step_time_ms = 0;
  double checkpoint_budget = 0.05;  // site: SiteOptions::checkpoint_budget
  // Site: SiteOptions::page_out_from_bytes, in MiB; negative: never.
  int64_t page_out_from_mib = 1024;
  // Sites: leave the federation gracefully once this round (counted from 0)
  // begins; unset: never. 0: right after joining, before training at all.
  std::optional<uint64_t> leave_at_round;
  // Sites: wait until this file exists before joining (a launcher's go).
  std::string join_after_file;
  SecurityArgs security;
  WorkloadSettings workload;
};

// What the aggregator command uses LibTorch for where the program has it:
// the fashion-cnn trainer's initial model, and the root's --eval. The
// torch-free fedwan-aggregator (aggregator_main.cpp) has neither: it runs
// from --initial-model or the synthetic trainer, and says so otherwise.
struct AggregatorTorch {
  // The --trainer's initial model (any trainer).
  std::function<std::vector<float>(const WorkloadSettings&)> initial_model;
  // For --eval: a function from the global model to its test accuracy and
  // loss (fashion-cnn), or none.
  using Evaluate = std::function<std::pair<double, double>(const std::vector<float>&)>;
  std::function<Evaluate(const WorkloadSettings&)> evaluator;
  std::function<void()> single_thread;  // LibTorch's own threads: one
};
AggregatorTorch aggregator_torch();  // the fedwan tool's (cmd_aggregator_torch.cpp)

// `fedwan aggregator`, or (configure_aggregator) the same flags and run on
// a program's own command line (fedwan-aggregator).
void add_aggregator_command(CLI::App& app, NodeArgs& args, int* exit_code,
                            const AggregatorTorch& torch);
void configure_aggregator(CLI::App& cmd, NodeArgs& args, int* exit_code,
                          const AggregatorTorch& torch);
void add_site_command(CLI::App& app, NodeArgs& args, int* exit_code);

struct DemoArgs {
  int sites = 4;
  int regions = 2;
  // Defaults chosen so the default demo reaches >= 0.85 test accuracy within
  // 0.02 of the central baseline in a few CPU minutes (see docs/operations.md).
  uint64_t rounds = 30;
  uint64_t inner_steps = 25;
  uint64_t overlap_steps = 0;  // tau; 0: blocking rounds
  // TCP connections per tree link: kStreamsAuto (as many as pay), or 1..16.
  uint64_t streams = kStreamsAuto;
  int max_restarts = 3;   // per node, like torchrun --max-restarts
  std::string chaos;      // NODE@ROUND: that node is killed in that round
  std::string late;       // SITE@ROUND: that site (late_join) is started in that round
  std::string leave;      // SITE@ROUND: that site leaves gracefully as that round begins
  uint64_t add_site = 0;  // > 0: a new site is added by topology version 2 in that round
  bool metrics = false;   // every node serves metrics on a free 127.0.0.1 port
  double metrics_linger_s = 0;
  std::string codec = "fp16";
  std::string outer = "diloco";
  std::string aggregation;         // --aggregation KEY=VALUE,... (cli/demo_flags.hpp)
  std::string root_aggregation;    // the root's own, over --aggregation
  std::string region_aggregation;  // every region's own, over --aggregation
  std::string privacy;             // --privacy KEY=VALUE,... (cli/demo_flags.hpp)
  uint64_t chunk_bytes = 1 << 20;
  bool no_baseline = false;
  bool no_checkpoints = false;  // nodes keep no checkpoints (nor replicas); no restarts
  bool no_audit_log = false;    // nodes keep no audit log
  bool no_pace = false;         // aggregators do not pace their sites (aggregator --no-pace)
  std::string report;
  std::string work_dir;             // default: a fresh temporary directory
  bool force = false;               // replace a federation CA already in work_dir/pki
  int base_port = 0;                // 0: pick free ports
  bool insecure_plaintext = false;  // default: provision credentials, encrypt every link
  std::string cipher = "aes-256-gcm";
  int ranks_per_site = 1;       // processes per site, gradients averaged every step
  std::string device = "auto";  // the sites' ranks: auto | cpu | cuda
  // NODE=PATH: that node runs PATH (same arguments) instead of this binary.
  std::vector<std::string> node_binaries;
  WorkloadSettings workload;
};

void add_demo_command(CLI::App& app, DemoArgs& args, int* exit_code);

// `fedwan certs ...`: provision, rotate and revoke a federation's identities.
void add_certs_command(CLI::App& app, int* exit_code);
// `fedwan audit verify FILE`: check an audit log's hash chain.
void add_audit_command(CLI::App& app, int* exit_code);
// `fedwan checkpoint digest FILE...` (cmd_checkpoint.cpp).
void add_checkpoint_command(CLI::App& app, int* exit_code);
// `fedwan costs RECORDS...`: bill each node from its per-round cost records.
void add_costs_command(CLI::App& app, int* exit_code);
// `fedwan status --topology T`: the live tree, from the nodes' metrics addresses.
void add_status_command(CLI::App& app, int* exit_code);
// `fedwan topology sign|verify`: topology versions (cmd_topology.cpp).
void add_topology_command(CLI::App& app, int* exit_code);
// `fedwan bench ARGS...`: runs the WAN benchmark harness (docs/benchmarks.md).
void add_bench_command(CLI::App& app, int* exit_code);

// Writes a flat fp32 model to `path` (raw little-endian floats).
void write_model(const std::string& path, const float* data, size_t n);
// A model as write_model wrote it (raw little-endian fp32): ConfigError for
// a file that is missing, empty, not a whole number of floats, or over
// 2^30 values.
std::vector<float> read_model(const std::string& path);

// The whole tool: parses argv, runs the subcommand, returns the exit code
// (2 for a configuration error, 1 for any other error).
int run(int argc, char** argv);

}  // namespace fedwan::cli
